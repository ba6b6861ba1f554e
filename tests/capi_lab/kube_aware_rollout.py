"""A Kubernetes-aware rollout of 3 under the real CAPI controllers, with a real MachineHealthCheck.

One in-memory cluster per test (its own namespace, labelled for the module's ExtensionConfig): a control
plane Machine and a MachineDeployment of 3 (maxSurge 0, maxUnavailable 1) whose Machines are mapped to
3 lab hosts by name through the service's inventory, and a MachineHealthCheck on the deployment.

Each Machine's Node exists twice, and the tests say which one they change:

- in the **kubelab's API server** (the service runs with ``--workload-kubeconfig management``): a plain
  Node (no kubelet, not even kwok) whose ``Ready`` condition only the test sets. The service drains it,
  writes ``DisruptiveInPlaceUpdate`` on it and its health gate reads it;
- in **CAPD's in-memory workload API server** (the ``<cluster>-kubeconfig`` Secret): the Node CAPD
  created when it "provisioned" the DevMachine, Ready once and never written again by CAPD. It is
  what CAPI's MachineHealthCheck controller reads. That fake API server serves GET/LIST/WATCH and
  PATCH of whole objects (no status subresource, no eviction, no JSON patch; a strategic merge patch
  is applied as a JSON merge patch), so a test makes a Node NotReady there with a merge patch that
  replaces its ``status.conditions`` by CAPD's four (``Ready`` as wanted, the pressure conditions
  False: CAPI's Machine controller calls a Node without them not healthy, and the Machine unavailable).
"""

from __future__ import annotations

import base64
import json
import threading
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import yaml
from e2e.conftest import START_VERSION
from hostlab.inventory import service_inventory
from hostlab.lab import Host
from kubelab import objects, reads
from kubelab.flavours import capi_objects as co
from kubelab.lab import Lab

from .kube_aware import MACHINES, SKIP_REMEDIATION, KubeExtension, TemplateChanges, create_md_cluster
from .rollout import wait

MHC = "machinehealthchecks.cluster.x-k8s.io"
MHC_TIMEOUT = 5  # seconds a Node may be NotReady before the MachineHealthCheck calls its Machine unhealthy


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def ready_condition(ready: bool) -> dict[str, str]:
    reason = "KubeletReady" if ready else "KubeletNotReady"
    status = "True" if ready else "False"
    return {"type": "Ready", "status": status, "reason": reason, "lastTransitionTime": now()}


@dataclass
class Rollout(TemplateChanges):
    ext: KubeExtension
    namespace: str
    cluster: str
    hosts: dict[str, Host]  # Machine name -> lab host
    nodes: dict[str, str]  # Machine name -> Node name (both API servers)
    workload_kubeconfig: Path
    generation: int = 1
    uids: dict[str, str] = field(default_factory=dict)

    def machines(self) -> dict[str, dict[str, Any]]:
        return {m["metadata"]["name"]: m for m in co.machines(self.kube, self.namespace, deployment=self.md)}

    def machine(self, name: str) -> dict[str, Any]:
        found = objects.get(self.kube, MACHINES, name, self.namespace)
        assert found is not None, name
        return found

    def up_to_date(self, name: str) -> bool:
        machine = self.machines().get(name)
        return (
            machine is not None
            and machine["metadata"]["uid"] == self.uids[name]
            and co.condition_status(machine, "UpToDate") == "True"
            and co.condition_status(machine, "Updating") != "True"
        )

    def rolled_out(self) -> bool:
        status = objects.get(self.kube, "machinedeployments.cluster.x-k8s.io", self.md, self.namespace) or {}
        return (
            co.owned_by_template(self.kube, self.namespace, self.md, self.template)
            and all(self.up_to_date(name) for name in self.uids)
            and status.get("status", {}).get("upToDateReplicas") == 3
        )

    def set_ready(self, machine: str, ready: bool) -> None:
        """The kubelab Node's Ready condition (what the service's drain and health gate read)."""
        patch = {"status": {"conditions": [ready_condition(ready)]}}
        self.kube.kubectl(
            "patch",
            "node",
            self.nodes[machine],
            "--subresource=status",
            "--type=strategic",
            "-p",
            json.dumps(patch),
        )

    def set_mhc_ready(self, machine: str, ready: bool) -> None:
        """The in-memory workload Node's Ready condition (what the MachineHealthCheck reads)."""
        pressures = [
            {"type": kind, "status": "False", "reason": f"KubeletHasNo{kind}", "lastTransitionTime": now()}
            for kind in ("MemoryPressure", "DiskPressure", "PIDPressure")
        ]
        patch = {"status": {"conditions": [ready_condition(ready), *pressures]}}
        self.kube.kubectl(
            f"--kubeconfig={self.workload_kubeconfig}",
            "patch",
            "node",
            self.nodes[machine],
            "--type=merge",
            "-p",
            json.dumps(patch),
        )

    def node_condition(self, machine: str, kind: str) -> dict[str, Any] | None:
        node = objects.get(self.kube, "node", self.nodes[machine])
        found = objects.condition(node, kind)
        return dict(found) if found is not None else None

    def mhc(self) -> dict[str, Any]:
        found = objects.get(self.kube, MHC, self.md, self.namespace)
        assert found is not None
        return found

    def events(self, machine: str) -> dict[str, list[str]]:
        found: dict[str, list[str]] = {}
        for event in reads.list_objects(self.kube, "events", self.namespace):
            if event["involvedObject"].get("uid") == self.uids[machine]:
                found.setdefault(event["reason"], []).append(event["message"])
        return found

    def explain(self) -> str:
        machines = list(self.machines().values())
        return co.conditions_text(machines) + f"\nMHC {self.mhc().get('status')}"


def create_rollout(ext: KubeExtension, hosts: list[Host], prefix: str, work: Path) -> Rollout:
    """The cluster, its MachineHealthCheck, the Machines mapped to ``hosts`` and their kubelab Nodes
    Ready; returns once the MachineHealthCheck counts all 3 Machines healthy."""
    namespace, machines = create_md_cluster(ext, prefix, 3)
    kube, cluster, md = ext.kube, prefix, f"{prefix}-md-0"
    names = [m["metadata"]["name"] for m in machines]
    ext.inventory.write_text(yaml.safe_dump(service_inventory(ext.hosts, names), sort_keys=False))
    nodes = {m["metadata"]["name"]: m["status"]["nodeRef"]["name"] for m in machines}
    for node in nodes.values():
        objects.apply(kube, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}})
        status = {
            "status": {"nodeInfo": {"kubeletVersion": START_VERSION}, "conditions": [ready_condition(True)]}
        }
        kube.kubectl("patch", "node", node, "--subresource=status", "--type=merge", "-p", json.dumps(status))
    secret = objects.get(kube, "secret", f"{cluster}-kubeconfig", namespace)
    assert secret is not None, "CAPI wrote no workload kubeconfig Secret"
    workload_kubeconfig = work / f"{namespace}.kubeconfig"
    workload_kubeconfig.write_bytes(base64.b64decode(secret["data"]["value"]))
    objects.apply(
        kube,
        {
            "apiVersion": "cluster.x-k8s.io/v1beta2",
            "kind": "MachineHealthCheck",
            "metadata": {"name": md, "namespace": namespace},
            "spec": {
                "clusterName": cluster,
                "selector": {"matchLabels": {"cluster.x-k8s.io/deployment-name": md}},
                "checks": {
                    "unhealthyNodeConditions": [
                        {"type": "Ready", "status": "False", "timeoutSeconds": MHC_TIMEOUT},
                        {"type": "Ready", "status": "Unknown", "timeoutSeconds": MHC_TIMEOUT},
                    ]
                },
            },
        },
    )
    rollout = Rollout(
        ext,
        namespace,
        cluster,
        dict(zip(names, hosts, strict=False)),
        nodes,
        workload_kubeconfig,
        uids={m["metadata"]["name"]: m["metadata"]["uid"] for m in machines},
    )

    def counted() -> bool:
        status = (objects.get(kube, MHC, md, namespace) or {}).get("status", {})
        return bool(status.get("expectedMachines") == 3 and status.get("currentHealthy") == 3)

    wait(counted, 60, "the MachineHealthCheck counts 3 healthy Machines", rollout.explain)
    return rollout


class MarkCounter:
    """Counts, per Machine of a namespace, each time ``skip-remediation`` appears and disappears: a watch
    delivers every change of the objects, so a removal that was undone a moment later is still counted."""

    def __init__(self, kube: Lab, namespace: str) -> None:
        self.added: Counter[str] = Counter()
        self.removed: Counter[str] = Counter()
        self._present: dict[str, bool] = {}
        self._client = kube.http()
        self._client.timeout = httpx.Timeout(30, read=None)
        self._path = f"/apis/cluster.x-k8s.io/v1beta2/namespaces/{namespace}/machines"
        self._opened = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> MarkCounter:
        self._thread.start()
        assert self._opened.wait(30), "the watch of the Machines did not open"
        return self

    def __exit__(self, *exc: object) -> None:
        self._client.close()  # ends the stream
        self._thread.join(10)

    def _seen(self, obj: dict[str, Any]) -> None:
        name = obj.get("metadata", {}).get("name", "")
        present = SKIP_REMEDIATION in (obj.get("metadata", {}).get("annotations") or {})
        before = self._present.get(name, False)
        if present and not before:
            self.added[name] += 1
        if before and not present:
            self.removed[name] += 1
        self._present[name] = present

    def _watch(self) -> None:
        params = {"watch": "true", "timeoutSeconds": "900"}
        try:
            with self._client.stream("GET", self._path, params=params) as response:
                response.raise_for_status()
                self._opened.set()
                for line in response.iter_lines():
                    if line:
                        self._seen(json.loads(line).get("object", {}))
        except (httpx.HTTPError, RuntimeError):
            return  # closed by __exit__ (or the API went away: the asserts will say)
