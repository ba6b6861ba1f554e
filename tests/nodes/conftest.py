"""Real Kubernetes nodes for the host-side capabilities: hostlab nodes (systemd booted by systemd-nspawn,
containerd, runc and the CNI plugins from Debian packages) joined to the session's kubelab with
``kubeadm join`` (flavour ``nodes``), kubelet and kubeadm built from the pinned Go modules.

Nothing here is a stand-in but the os_update command (tests/playbooks/shipped.py: it only stages a
version; the reboot after it is the node's real one), the nodes' pause image (tests/nodes/images.py),
the kube-proxy DNAT rule for the ``kubernetes`` Service and the not-ready taint removed at join
(kubelab.node_join). The service is the real ``inplace-extension serve`` with the project's playbooks;
the Kubernetes binaries come from a release server on the node lab's gateway that serves the lab's own
builds in dl.k8s.io's layout (the capabilities file's ``role_settings`` point the kubernetes_version
role at it and pass kubeadm the flag a cgroup v1 machine needs).

One node lab per session (four nodes: three joined at the first node version, one a minor version
behind), shared by the tests: each test uses the node it names, and leaves it Ready.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from deploy.image import missing_tools
from e2e.service import Service, serve_argv
from hostlab import prereqs
from hostlab.config import Config
from hostlab.errors import LabError
from hostlab.inventory import render
from hostlab.lab import Host
from hostlab.lab import Lab as HostLab
from hostlab.pytest_plugin import unavailable
from hostlab.state import NODE
from kubelab import build, manifests, node_join
from kubelab.flavours import capi_objects as co
from kubelab.lab import Lab as KubeLab
from playbooks.shipped import CAPABILITIES_FILE
from playbooks.support import ReleaseServer

from inplace_extension.plays.ssh import close_control_masters

from .images import import_pause

REPO = Path(__file__).resolve().parents[2]
START, TARGET = build.NODE_VERSIONS[0], build.NODE_VERSIONS[-1]
MINOR = build.MINOR_UPGRADE_VERSION  # one minor version behind TARGET: kubeadm's minor upgrade
# the version each node joins at: the last node one minor version behind, for the minor upgrade
JOIN_VERSIONS = (START, START, START, MINOR)
NODES = len(JOIN_VERSIONS)
# kubeadm >= v1.35 stops "upgrade node" at preflight on cgroup v1 (this machine) unless told to skip it
KUBEADM_UPGRADE_ARGS = ["--ignore-preflight-errors=SystemVerification"]


@dataclass(frozen=True)
class Cluster:
    kube: KubeLab
    lab: HostLab
    hosts: list[Host]
    release_url: str  # the lab's builds in dl.k8s.io's layout, on the node lab's gateway


def release_binary(kube: KubeLab) -> Callable[[str, str], bytes | None]:
    """The lab's builds as release binaries: kubelet/kubeadm at the node versions, kubectl at its own."""

    def serve(name: str, version: str) -> bytes | None:
        if name in ("kubelet", "kubeadm") and version in build.NODE_VERSIONS:
            return kube.binary(f"{name}-{version}").read_bytes()
        if name == "kubectl" and version == build.KUBERNETES_VERSION:
            return kube.binary("kubectl").read_bytes()
        return None

    return serve


@pytest.fixture(scope="session")
def node_cluster(kubelab_nodes: KubeLab) -> Iterator[Cluster]:
    why = prereqs.missing(Config.from_env(), NODE) or missing_tools()  # podman builds the nodes' images
    if why:
        unavailable(why)
    lab = HostLab(f"pytest-{os.getpid()}-k8s")
    try:
        hosts = lab.up(NODES, owner_pid=os.getpid(), kind=NODE)
        for host, version in zip(hosts, JOIN_VERSIONS, strict=True):
            node_join.join(kubelab_nodes, lab, host, version)
        import_pause(lab, hosts)  # before any Pod is bound to a node
        with ReleaseServer(lab.gateway, release_binary(kubelab_nodes)) as server:
            yield Cluster(kubelab_nodes, lab, hosts, server.base_url)
    except LabError as exc:
        pytest.fail(f"real nodes did not start: {exc}", pytrace=False)
    finally:
        for host in lab.hosts() if lab.exists() else []:
            kubelab_nodes.kubectl("delete", "node", host.name, "--ignore-not-found", check=False)
        lab.down()


def capabilities(cluster: Cluster) -> str:
    """The capabilities file of the node lab's service and agent: the shipped one of the lab tests
    (os_update, kubelet_credentials), the kubernetes_version role pointed at the lab's release server."""
    return (
        CAPABILITIES_FILE % {"retries": 1} + "role_settings:\n"
        "  kubernetes_version:\n"
        "    package_source: binary\n"
        f"    binary_base_url: {cluster.release_url}\n"
        f"    kubeadm_upgrade_args: {json.dumps(KUBEADM_UPGRADE_ARGS)}\n"
        "    health_delay_seconds: 1\n"
    )


MACHINES_NAMESPACE = "e2e"  # the namespace of tests/e2e/capi.py's UpdateMachine requests


@contextmanager
def provisioned_machine(cluster: Cluster, host: Host) -> Iterator[str]:
    """``host`` as a provisioned CAPI Machine named like it, for the Kubernetes-aware mode: no CAPI
    controller runs in the node lab, so the Machine is written as CAPI's Machine controller leaves one
    (CAPI's own CRDs, ``status.addresses`` with the node's address, ``status.nodeRef`` naming its Node);
    removed afterwards."""
    kube = cluster.kube
    names = ("machines", "machinedeployments", "clusters")
    crds = [manifests.capi_crd(kube, f"cluster.x-k8s.io_{name}.yaml") for name in names]
    manifests.install_crds(kube, crds, only_missing=True)
    addresses = [{"type": "Hostname", "address": host.name}, {"type": "InternalIP", "address": host.address}]
    co.machine_with_status(kube, MACHINES_NAMESPACE, host.name, addresses, host.name)
    try:
        yield host.name
    finally:
        kube.kubectl("delete", "machine.cluster.x-k8s.io", host.name, "-n", MACHINES_NAMESPACE)


def kube_aware_args(cluster: Cluster) -> list[str]:
    """``serve`` flags of the Kubernetes-aware mode on the node lab (its apiserver is also the workload
    cluster: the Nodes are there)."""
    return ["--kubeconfig", str(cluster.kube.kubeconfig), "--workload-kubeconfig", "management"]


def serve_service(cluster: Cluster, home: Path, extra_caps: str, extra_args: Sequence[str]) -> Service:
    """The real ``serve`` for the node lab, started: its inventory (every node), capabilities file (the
    lab tests' shipped one plus ``extra_caps``), runs dir and log in ``home``; ``extra_args`` for
    ``serve``."""
    inventory = home / "inventory.yaml"
    inventory.write_text(render(cluster.lab, "service", [h.name for h in cluster.hosts]))
    caps = home / "capabilities.yaml"
    caps.write_text(capabilities(cluster) + extra_caps)
    runs = home / "runs"
    argv = serve_argv(inventory, str(cluster.lab.network), runs, "--playbooks-dir", str(REPO / "playbooks"))
    argv += ["--capabilities-file", str(caps), *extra_args]
    return Service(argv, home / "service.log", runs)


StartService = Callable[..., Service]


@pytest.fixture
def node_service(node_cluster: Cluster, tmp_path: Path) -> Iterator[StartService]:
    """``node_service(extra_caps="", extra_args=())`` starts the real service for the node lab (Machines
    named like the nodes), with the shipped capabilities' file of the lab tests (os_update,
    kubelet_credentials) plus ``extra_caps`` (YAML text), and ``extra_args`` for ``serve``."""
    started: list[Service] = []

    def start(extra_caps: str = "", extra_args: Sequence[str] = ()) -> Service:
        service = serve_service(node_cluster, tmp_path, extra_caps, extra_args)
        started.append(service)
        return service

    yield start
    for service in started:
        service.stop()
        close_control_masters(service.runs_dir)
