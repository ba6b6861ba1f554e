"""A real kubeadm control plane on the lab's nodes, upgraded in place: ``kubeadm init`` at the first node
version on node A (kube-apiserver, kube-controller-manager, kube-scheduler and etcd as static Pods run by
the real kubelet, containerd and runc), node B joined with ``kubeadm join``, then ``kubeadm upgrade
apply`` to the last node version on A and ``kubeadm upgrade node`` on B, each kubelet swapped and
restarted after, as the Kubernetes upgrade guide says. The API is read throughout and its longest gap
measured (one apiserver: its static Pod's restart is a gap).

The nodes are a small node lab of the module's own, not joined to kubelab. The control-plane images are
built from kubelab's pinned Go modules and imported into each node's containerd (no registry:
tests/nodes/images.py). Stand-ins, named: the Pod sandbox's pause image (busybox, tests/nodes/images.py);
no kube-proxy and no CoreDNS run (kubeadm's addon phases skipped: the lab builds no images of them).
"""

from __future__ import annotations

import os
import secrets
import string
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from deploy.image import missing_tools
from hostlab import prereqs
from hostlab.config import Config
from hostlab.errors import LabError
from hostlab.lab import Host
from hostlab.lab import Lab as HostLab
from hostlab.proc import wait_until
from hostlab.pytest_plugin import unavailable
from hostlab.state import NODE
from kubelab import build, node_join

from .images import CONTROL_PLANE_REPOSITORY, control_plane_images, import_control_plane, import_pause
from .kubeadm_cluster import (
    API_PORT,
    AdminApi,
    ApiProbe,
    built,
    ca_cert_hash,
    init_config,
    join_config,
    kubeadm,
    upgrade_config,
)

pytestmark = [pytest.mark.lab, pytest.mark.kube]

START, TARGET = build.NODE_VERSIONS[0], build.NODE_VERSIONS[-1]
STATIC_PODS = ("etcd", *build.CONTROL_PLANE)
READY_TIMEOUT = 300.0  # static Pods Running and Ready, Nodes Ready, on busy cores
# seconds without an answer: kube-apiserver's static Pod restarting (measured 44 s and 80 s on 2 cores at
# load averages of 13-16 and 16-18)
API_GAP_LIMIT = 180.0


@dataclass(frozen=True)
class KubeadmCluster:
    lab: HostLab
    first: Host  # kubeadm init, the control plane
    worker: Host  # kubeadm join
    api: AdminApi
    binaries: dict[str, Path]


def _token() -> str:
    alphabet = string.ascii_lowercase + string.digits
    return ".".join("".join(secrets.choice(alphabet) for _ in range(n)) for n in (6, 16))


def _replace_binary(host: Host, name: str, binary: Path) -> None:
    """``/usr/bin/<name>`` in the node replaced by ``binary`` (renamed over it: a running kubelet's file
    cannot be written)."""
    target = host.root() / "usr/bin" / name
    partial = target.with_name(f".{name}.new")
    partial.write_bytes(binary.read_bytes())
    partial.chmod(0o755)
    partial.rename(target)


@pytest.fixture(scope="module")
def kubeadm_cluster() -> Iterator[KubeadmCluster]:
    why = prereqs.missing(Config.from_env(), NODE) or missing_tools()
    if why:
        unavailable(why)
    binaries = built(build.CONTROL_PLANE_BINARIES)
    lab = HostLab(f"pytest-{os.getpid()}-kubeadm")
    api: AdminApi | None = None
    try:
        first, worker = lab.up(2, owner_pid=os.getpid(), kind=NODE)
        import_pause(lab, [first, worker])
        import_control_plane(lab, [first, worker], control_plane_images(binaries))
        for host in (first, worker):
            node_join.install_kubelet_kubeadm(
                lab, host, binaries[f"kubelet-{START}"], binaries[f"kubeadm-{START}"]
            )
        token = _token()
        kubeadm(lab, first, "init", config=init_config(first, START, token))
        api = AdminApi.from_admin_conf((first.root() / "etc/kubernetes/admin.conf").read_text())
        ca = (first.root() / "etc/kubernetes/pki/ca.crt").read_bytes()
        endpoint = f"{first.address}:{API_PORT}"
        kubeadm(lab, worker, "join", config=join_config(worker, endpoint, token, ca_cert_hash(ca)))
        yield KubeadmCluster(lab, first, worker, api, binaries)
    except LabError as exc:
        pytest.fail(f"the kubeadm cluster did not start: {exc}", pytrace=False)
    finally:
        if api is not None:
            api.close()
        lab.down()


def _static_pods(api: AdminApi, node: str) -> dict[str, dict[str, Any]]:
    pods = api.get(f"/api/v1/namespaces/kube-system/pods?fieldSelector=spec.nodeName%3D{node}")["items"]
    return {pod["metadata"]["name"].removesuffix(f"-{node}"): pod for pod in pods}


def _running_at(pod: dict[str, Any], image: str) -> bool:
    statuses = pod.get("status", {}).get("containerStatuses", [])
    return (
        pod.get("status", {}).get("phase") == "Running"
        and pod["spec"]["containers"][0]["image"] == image
        and bool(statuses)
        and all(s.get("ready") and "running" in s.get("state", {}) for s in statuses)
    )


def _expected_images(version: str) -> dict[str, str]:
    images = {c: f"{CONTROL_PLANE_REPOSITORY}/{c}:{version}" for c in build.CONTROL_PLANE}
    return {"etcd": f"{CONTROL_PLANE_REPOSITORY}/etcd:{build.ETCD_VERSION}", **images}


def _wait_control_plane_at(cluster: KubeadmCluster, version: str) -> None:
    """The four static Pods on the first node Running and Ready at ``version``'s images, the apiserver
    saying ``version``; fails with what it saw."""
    expected = _expected_images(version)
    seen: dict[str, str] = {}

    def at_version() -> bool:
        try:
            pods = _static_pods(cluster.api, cluster.first.name)
            served = cluster.api.get("/version")["gitVersion"]
        except (OSError, ValueError):
            return False
        seen.clear()
        seen.update(
            {
                name: f"{pod['spec']['containers'][0]['image']} {pod['status'].get('phase')}"
                for name, pod in pods.items()
            }
        )
        seen["apiserver /version"] = served
        return served == version and all(
            name in pods and _running_at(pods[name], image) for name, image in expected.items()
        )

    assert wait_until(at_version, READY_TIMEOUT, 1.0), f"control plane not at {version}: {seen}"


def _nodes(api: AdminApi) -> dict[str, dict[str, Any]]:
    return {node["metadata"]["name"]: node for node in api.get("/api/v1/nodes")["items"]}


def _ready_at(node: dict[str, Any], version: str) -> bool:
    conditions = node.get("status", {}).get("conditions", [])
    ready = any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)
    return ready and node["status"]["nodeInfo"]["kubeletVersion"] == version


def _wait_nodes_at(cluster: KubeadmCluster, version: str) -> dict[str, str]:
    """Both Nodes Ready with kubelets at ``version``; returns name -> UID."""
    names = (cluster.first.name, cluster.worker.name)
    nodes: dict[str, dict[str, Any]] = {}

    def ready() -> bool:
        try:
            nodes.update(_nodes(cluster.api))
        except (OSError, ValueError):
            return False
        return all(name in nodes and _ready_at(nodes[name], version) for name in names)

    assert wait_until(ready, READY_TIMEOUT, 1.0), f"Nodes not Ready at {version}: " + str(
        {n: nodes.get(n, {}).get("status", {}).get("nodeInfo", {}).get("kubeletVersion") for n in names}
    )
    return {name: nodes[name]["metadata"]["uid"] for name in names}


def _upgrade_kubelet(cluster: KubeadmCluster, host: Host, version: str) -> None:
    _replace_binary(host, "kubelet", cluster.binaries[f"kubelet-{version}"])
    result = cluster.lab.exec_in(host, ["systemctl", "restart", "kubelet"])
    assert result.returncode == 0, f"{host.name}: restarting the kubelet: {result.stderr}"


def test_kubeadm_control_plane_upgraded_in_place(
    kubeadm_cluster: KubeadmCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster = kubeadm_cluster
    _wait_control_plane_at(cluster, START)
    uids = _wait_nodes_at(cluster, START)
    assert set(_static_pods(cluster.api, cluster.worker.name)) == set(), "a worker runs no static Pod"

    started = time.monotonic()
    with ApiProbe(cluster.api) as probe:
        for host in (cluster.first, cluster.worker):
            _replace_binary(host, "kubeadm", cluster.binaries[f"kubeadm-{TARGET}"])
        out = kubeadm(cluster.lab, cluster.first, "upgrade", "apply", "--yes", config=upgrade_config(TARGET))
        assert f'upgraded to "{TARGET}"' in out, out[-2000:]
        _wait_control_plane_at(cluster, TARGET)
        _upgrade_kubelet(cluster, cluster.first, TARGET)
        kubeadm(cluster.lab, cluster.worker, "upgrade", "node", config=upgrade_config(TARGET))
        _upgrade_kubelet(cluster, cluster.worker, TARGET)
        after = _wait_nodes_at(cluster, TARGET)
        _wait_control_plane_at(cluster, TARGET)
    took = time.monotonic() - started
    with capsys.disabled():  # the measured gap in every run's output, passed or not
        print(
            f"\nin place {START} -> {TARGET}: {took:.0f}s; the API's longest gap {probe.longest_gap:.1f}s "
            f"({probe.unanswered} of {probe.answered + probe.unanswered} reads unanswered)"
        )
    assert after == uids, "the same Nodes (names and UIDs) after the upgrade"
    assert probe.answered > 0 and probe.longest_gap < API_GAP_LIMIT, (
        f"the API did not answer for {probe.longest_gap:.1f}s"
    )
