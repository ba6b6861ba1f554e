"""The Kubernetes-aware mode on a real node: the service (``serve --kubeconfig``, the management cluster
also the workload cluster) against the node lab's kube-apiserver, whose Node is the one the node's real
kubelet registered with ``kubeadm join`` and keeps reporting on.

The Machine: no CAPI controller runs in this lab (the CAPI lab, with CAPI's controllers, has no real
nodes; running both would double the heaviest group of the suite). The apiserver holds CAPI's own CRDs
and the test writes the Machine as CAPI's Machine controller leaves it for a provisioned node:
``status.addresses`` with the node's address and ``status.nodeRef`` naming its Node; the test then plays
the Machine controller's UpdateMachine calls (tests/e2e/capi.py). Everything the service does from there
(read the Machine, cordon, drain through the Eviction API, uncordon, wait on the Node) is against the real
apiserver and the real kubelet.

The Pod to evict runs the nodes' stand-in pause image (busybox sleeping, tests/nodes/images.py) on the
host network: the real kubelet starts it and, on eviction, stops it and removes the Pod from the
apiserver, which is what the drain waits for. Host network, because the test holds the node's network
plugin configuration back during the update (below), and a Pod on the Pod network could not be torn
down without it.

To show that the health gate waits for the real kubelet, the test holds the node's network plugin
configuration back during the update: the kubelet reports its Node NotReady ("container runtime network
not ready"), also after the update restarted it, until the test gives the configuration back (and
restarts containerd, see the test).
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from e2e.capi import NodeSpec, poll_update_machine
from hostlab.lab import Host
from hostlab.node_base import PAUSE_IMAGE
from hostlab.proc import wait_until
from kubelab import objects
from kubelab.lab import Lab as KubeLab

from .conftest import START, Cluster, StartService, kube_aware_args, provisioned_machine
from .test_node_capabilities import kubelet_args, kubelet_pid, node, on_node, ready

pytestmark = [pytest.mark.lab, pytest.mark.kube]

CNI_CONFIG = "/etc/cni/net.d/10-hostlab.conflist"  # the node's only network (hostlab.node_base)
HELD_CNI_CONFIG = "/etc/cni/10-hostlab.conflist.held"
CORDONED_BY = "inplace-extension.io/cordoned-by"
UPDATING = "DisruptiveInPlaceUpdate"  # the Node condition the service sets while a disruptive step runs


@dataclass(frozen=True)
class Seen:
    """One version of the Node, as the watch delivered it (``at``: time.monotonic() on arrival)."""

    at: float
    unschedulable: bool
    ready: str  # the status of the kubelet's Ready condition
    updating: str  # the status of our DisruptiveInPlaceUpdate condition ("" while there is none)


class NodeWatch:
    """Every version of one Node while an update runs: a watch, not a poll (a cordon can be short)."""

    def __init__(self, kube: KubeLab, name: str) -> None:
        self.name = name
        self.seen: list[Seen] = []
        self._client = kube.http()
        self._client.timeout = httpx.Timeout(30, read=None)
        self._open = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> NodeWatch:
        self._thread.start()
        assert self._open.wait(30), "the Node watch did not open"
        return self

    def __exit__(self, *exc: object) -> None:
        self._client.close()  # ends the stream
        self._thread.join(10)

    def _watch(self) -> None:
        params = {"watch": "true", "fieldSelector": f"metadata.name={self.name}", "timeoutSeconds": "900"}
        try:
            with self._client.stream("GET", "/api/v1/nodes", params=params) as response:
                response.raise_for_status()
                self._open.set()
                for line in response.iter_lines():
                    if line:
                        self._record(json.loads(line).get("object", {}))
        except (httpx.HTTPError, RuntimeError):
            return  # closed by __exit__ (or the API went away: the asserts say what is missing)

    def _record(self, obj: dict[str, Any]) -> None:
        conditions: list[dict[str, Any]] = obj["status"].get("conditions", [])
        status = {c["type"]: c["status"] for c in conditions}
        unschedulable = bool(obj["spec"].get("unschedulable"))
        self.seen.append(
            Seen(time.monotonic(), unschedulable, status.get("Ready", ""), status.get(UPDATING, ""))
        )


@pytest.fixture
def machine(node_cluster: Cluster) -> Iterator[tuple[Host, str]]:
    """hosts[1] as a provisioned CAPI Machine (see the module docstring)."""
    host = node_cluster.hosts[1]
    with provisioned_machine(node_cluster, host) as name:
        yield host, name


def kubelet_started(cluster: Cluster, host: Host) -> float:
    """When systemd last started the kubelet, on this machine's monotonic clock (the node shares the
    kernel's: systemd-nspawn gives it no time namespace)."""
    usec = on_node(
        cluster, host, "systemctl", "show", "-p", "ExecMainStartTimestampMonotonic", "--value", "kubelet"
    )
    return int(usec) / 1e6


def test_kube_aware_kubelet_args_cordons_drains_and_gates_on_the_real_node(
    node_cluster: Cluster, node_service: StartService, machine: tuple[Host, str]
) -> None:
    host, name = machine
    kube = node_cluster.kube
    # the workload (module docstring): bound to the node, run by its real kubelet
    pods = f"ka-{uuid.uuid4().hex[:6]}"
    objects.ensure_namespace(kube, pods)
    container = {"name": "app", "image": PAUSE_IMAGE, "imagePullPolicy": "Never"}
    pod_spec = {"nodeName": host.name, "hostNetwork": True, "terminationGracePeriodSeconds": 1}
    workload = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "workload", "namespace": pods}}
    objects.apply(kube, {**workload, "spec": {**pod_spec, "containers": [container]}})
    running = lambda p: p.get("status", {}).get("phase") == "Running"  # noqa: E731
    objects.wait_for(kube, "pod", "workload", pods, running, "Running")
    service = node_service(
        extra_args=[*kube_aware_args(node_cluster), "--health-gate-timeout-seconds", "120"]
    )
    spec = NodeSpec(START, kubelet_args(("max-pods", "77")))
    before = kubelet_pid(node_cluster, host)
    gate = f"health gate: waiting for Node {host.name} to be Ready"

    with NodeWatch(kube, host.name) as watch:
        # the node's network plugin configuration is held back, so the real kubelet reports the Node
        # NotReady ("container runtime network not ready"), also after the update restarted it
        on_node(node_cluster, host, "mv", CNI_CONFIG, HELD_CNI_CONFIG)
        try:
            assert wait_until(lambda: not ready(node_cluster, host), 60, 0.5)
            gated = poll_update_machine(service.client, name, spec, within=300, until=lambda m: m == gate)
            assert (gated.status, gated.message) == ("Success", gate), gated.messages
            # the disruptive step is over: the kubelet was restarted and the Node uncordoned, but the
            # answer stays "in progress" while the Node is not Ready
            assert kubelet_pid(node_cluster, host) != before
            assert not node(node_cluster, host)["spec"].get("unschedulable")
        finally:
            on_node(node_cluster, host, "mv", HELD_CNI_CONFIG, CNI_CONFIG)
            # containerd watches the directory with inotify, which misses the file coming back on the
            # node's overlay root filesystem: its restart reads the configuration again
            on_node(node_cluster, host, "systemctl", "restart", "containerd")
        done = poll_update_machine(service.client, name, spec, within=120)
        answered = time.monotonic()
    assert (done.status, done.message) == ("Success", "update applied"), done.messages

    # cordoned before the kubelet restart, uncordoned after it, and left as found
    restarted = kubelet_started(node_cluster, host)
    cordon = next(s.at for s in watch.seen if s.unschedulable)
    uncordon = next(s.at for s in watch.seen if s.at > cordon and not s.unschedulable)
    assert cordon < restarted < uncordon, (cordon, restarted, uncordon, watch.seen)
    after = node(node_cluster, host)
    assert CORDONED_BY not in after["metadata"].get("annotations", {})
    # our DisruptiveInPlaceUpdate condition was True during the disruptive step and is False after it, kept
    # beside the conditions the real kubelet posts (its restart and status updates leave it alone)
    assert any(s.updating == "True" for s in watch.seen if cordon <= s.at <= uncordon), watch.seen
    assert {c["type"]: c["status"] for c in after["status"]["conditions"]}[UPDATING] == "False"
    assert after["status"]["capacity"]["pods"] == "77"
    # drained through the Eviction API: the real kubelet stopped the Pod and removed it
    assert objects.get(kube, "pod", "workload", pods) is None
    # Success came only after the real kubelet reported the Node Ready again
    back = next(s.at for s in watch.seen if s.at > restarted and s.ready == "True")
    assert back < answered, watch.seen
    assert ready(node_cluster, host)
