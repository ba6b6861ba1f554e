"""A real workload cluster made by the real CAPI v1.14.2 controllers on the lab's real nodes (issue #27
item 3): core, KubeadmControlPlane and CABPK on the shared CAPI lab, the lab's infrastructure provider
(:mod:`kubelab.labprovider`, the stand-in for a bare-metal provider) over a pool of three node-lab nodes
(systemd, containerd, the real kubelet).

The test writes only what a user writes (:mod:`capi_lab.workload`): a Cluster on a LabCluster, a
KubeadmControlPlane of one at v1.36.1 and a MachineDeployment of two workers at v1.35.4. CABPK renders
the bootstrap data, the provider carries it out on a pool node (``kubeadm init`` with the real static Pods,
``kubeadm join``), CAPI's Machine controller finds each Node by its providerID through the kubeconfig
Secret KCP writes. Nothing is patched by hand on any Node or Machine. The pool's preparation (images in
containerd, kubelet and kubeadm staged per version) stands for a bare-metal machine image.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from hostlab.lab import Lab as HostLab
from hostlab.proc import wait_until
from hostlab.pytest_plugin import nodes_lab
from kubelab import build, objects
from kubelab.flavours import capi_objects as co
from kubelab.lab import Lab as KubeLab
from labprovider.pool import LabMachines, provider_running
from nodes.images import CONTROL_PLANE_REPOSITORY
from nodes.kubeadm_cluster import AdminApi, built

from .conftest import unique_namespace
from .workload import cluster_objects, kubeconfig, node_binaries, prepare_pool, workload_api

pytestmark = [pytest.mark.lab, pytest.mark.kube, pytest.mark.capi]

CLUSTER = "wl"
CONTROL_PLANE_VERSION = build.NODE_VERSIONS[0]  # v1.36.1
WORKER_VERSION = build.MINOR_UPGRADE_VERSION  # v1.35.4
WORKERS = 2
VERSIONS = (WORKER_VERSION, *build.NODE_VERSIONS)  # staged on every pool node
# kubeadm init (static Pods on busy cores), CAPI's controllers noticing, two joins: measured 63-65 s at load
# averages of 12-22 on the 2 shared cores; the deadline leaves room for a far busier machine
BUILD_DEADLINE = 1500.0
DELETE_DEADLINE = 600.0
KCP = "kubeadmcontrolplane.controlplane.cluster.x-k8s.io"


@dataclass(frozen=True)
class Workload:
    kube: KubeLab
    namespace: str
    pool: Pool
    machines: LabMachines
    api: AdminApi
    took: float  # seconds from the objects' apply to every Machine Running and Node Ready


def _machines(kube: KubeLab, namespace: str) -> list[dict[str, Any]]:
    return co.machines(kube, namespace)


def _nodes(api: AdminApi) -> dict[str, dict[str, Any]]:
    try:
        return {n["metadata"]["name"]: n for n in api.get("/api/v1/nodes")["items"]}
    except (OSError, ValueError):
        return {}


def _node_ready(node: dict[str, Any]) -> bool:
    conditions = node.get("status", {}).get("conditions", [])
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _all_ready(api: AdminApi) -> bool:
    nodes = _nodes(api)
    return len(nodes) == 1 + WORKERS and all(_node_ready(n) for n in nodes.values())


def _progress(kube: KubeLab, namespace: str) -> str:
    """What CAPI and the provider say, for a failure's message."""
    lines = [
        f"Machine {m['metadata']['name']}: {m.get('status', {}).get('phase')} {co.conditions_text([m])[:600]}"
        for m in _machines(kube, namespace)
    ]
    lines.append(f"KCP: {json.dumps(_kcp(kube, namespace).get('status', {}))[:1500]}")
    for lm in LabMachines(kube, namespace).all():
        ready = objects.condition(lm, "Ready") or {}
        lines.append(f"LabMachine {lm['metadata']['name']}: {ready.get('reason')}: {ready.get('message')}")
    return "\n".join(lines)


def _kcp(kube: KubeLab, namespace: str) -> dict[str, Any]:
    return objects.get(kube, KCP, f"{CLUSTER}-cp", namespace) or {}


def _built(kube: KubeLab, namespace: str) -> bool:
    """Every Machine Running (its Node found) and KCP Available (its control plane's Pods healthy)."""
    found = _machines(kube, namespace)
    if not (len(found) == 1 + WORKERS and all(co.running(m) for m in found)):
        return False
    return co.condition_status(_kcp(kube, namespace), "Available") == "True"


@dataclass(frozen=True)
class Pool:
    lab: HostLab
    took: float  # seconds to start the nodes and prepare them (images imported, binaries staged)


@pytest.fixture(scope="module")
def pool() -> Iterator[Pool]:
    binaries = built(node_binaries(VERSIONS))
    started = time.monotonic()
    with nodes_lab("wlpool", count=1 + WORKERS) as lab:
        prepare_pool(lab, binaries, VERSIONS)
        yield Pool(lab, time.monotonic() - started)


@pytest.fixture(scope="module")
def workload(kubelab_capi: KubeLab, pool: Pool) -> Iterator[Workload]:
    kube, namespace = kubelab_capi, unique_namespace("workload")
    endpoint = pool.lab.hosts()[0]
    with provider_running(kube, pool.lab, namespace) as machines:
        started = time.monotonic()
        objects.apply(
            kube,
            *cluster_objects(CLUSTER, namespace, endpoint, CONTROL_PLANE_VERSION, WORKERS, WORKER_VERSION),
        )
        try:
            if not wait_until(lambda: _built(kube, namespace), BUILD_DEADLINE, 2.0):
                pytest.fail(
                    f"the workload cluster not built within {BUILD_DEADLINE:g}s:\n"
                    + _progress(kube, namespace),
                    pytrace=False,
                )
            text = kubeconfig(kube, CLUSTER, namespace)
            assert text is not None, f"no Secret {CLUSTER}-kubeconfig"
            with workload_api(text) as api:
                ready = wait_until(lambda: _all_ready(api), BUILD_DEADLINE, 2.0)
                assert ready, f"workload Nodes not Ready: {_nodes(api)}"
                yield Workload(kube, namespace, pool, machines, api, time.monotonic() - started)
        finally:
            _delete(kube, namespace)


def _delete(kube: KubeLab, namespace: str) -> None:
    """The Cluster deleted as a user deletes it: CAPI deletes the Machines, the provider resets the nodes."""
    kube.kubectl("delete", "cluster.cluster.x-k8s.io", CLUSTER, "-n", namespace, "--wait=false", check=False)
    wait_until(lambda: not _machines(kube, namespace), DELETE_DEADLINE, 2.0)


def test_capi_builds_a_workload_cluster_on_real_nodes(
    workload: Workload, capsys: pytest.CaptureFixture[str]
) -> None:
    kube, namespace, api = workload.kube, workload.namespace, workload.api
    with capsys.disabled():
        print(
            f"\npool of {1 + WORKERS} nodes prepared in {workload.pool.took:.0f}s; workload cluster built "
            f"by CAPI on them in {workload.took:.0f}s"
        )
    machines = {m["metadata"]["name"]: m for m in _machines(kube, namespace)}
    labels = {name: m["metadata"].get("labels", {}) for name, m in machines.items()}
    control_plane = [m for name, m in machines.items() if co.CONTROL_PLANE_LABEL in labels[name]]
    workers = [m for name, m in machines.items() if labels[name].get(co.DEPLOYMENT_LABEL)]
    assert len(control_plane) == 1 and len(workers) == WORKERS, sorted(machines)

    nodes = _nodes(api)
    endpoint = workload.pool.lab.hosts()[0]
    # each Machine's Node found by CAPI through the workload API: its providerID, the kubelet's version
    expected = [(control_plane[0], CONTROL_PLANE_VERSION), *((w, WORKER_VERSION) for w in workers)]
    for machine, version in expected:
        node_name = machine["status"]["nodeRef"]["name"]
        node = nodes[node_name]
        assert node["spec"]["providerID"] == machine["spec"]["providerID"] == f"lab://{node_name}"
        assert node["status"]["nodeInfo"]["kubeletVersion"] == version, node_name
        assert _node_ready(node)
    # the control plane is on the endpoint's node (the LabCluster's controlPlaneEndpoint)
    assert control_plane[0]["status"]["nodeRef"]["name"] == endpoint.name
    assert api.server == f"https://{endpoint.address}:6443"

    # the static Pods kubeadm init made, from the images imported into containerd (lab.local)
    pods = api.get(f"/api/v1/namespaces/kube-system/pods?fieldSelector=spec.nodeName%3D{endpoint.name}")
    images = {
        p["metadata"]["name"].removesuffix(f"-{endpoint.name}"): p["spec"]["containers"][0]["image"]
        for p in pods["items"]
        if p.get("status", {}).get("phase") == "Running"
    }
    assert images == {
        "etcd": f"{CONTROL_PLANE_REPOSITORY}/etcd:{build.ETCD_VERSION}",
        **{c: f"{CONTROL_PLANE_REPOSITORY}/{c}:{CONTROL_PLANE_VERSION}" for c in build.CONTROL_PLANE},
    }
    assert api.get("/version")["gitVersion"] == CONTROL_PLANE_VERSION

    # KCP read the workload cluster (etcd through the API, the static Pods) and says it is available
    status = _kcp(kube, namespace)["status"]
    assert status["initialization"]["controlPlaneInitialized"] is True
    assert (status.get("readyReplicas"), status.get("availableReplicas")) == (1, 1), json.dumps(status)[:2000]
    for kind in ("EtcdClusterHealthy", "ControlPlaneComponentsHealthy"):
        assert co.condition_status(_kcp(kube, namespace), kind) == "True", kind
    # nothing but CAPI's controllers wrote the Machines: no field manager of the test (kubelab/kubectl)
    for machine in machines.values():
        managers = {f["manager"] for f in machine["metadata"].get("managedFields", [])}
        assert managers.isdisjoint({"kubelab", "kubectl", "kubectl-patch", "kubectl-edit"}), managers
