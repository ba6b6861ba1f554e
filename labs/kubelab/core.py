"""How each core process is started: etcd, kube-apiserver, kube-controller-manager and kwok.

Flags (each checked by hand against these versions first): loopback only, free ports, client-cert
auth with RBAC, etcd without fsync (test data), the controller-manager with only the controllers the
tests need, kwok managing the Nodes labelled ``type=kwok`` with the stage files from its own module
(the standalone binary has no built-in stages).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from pathlib import Path

from kubelab.config import KWOK_NODE_LABEL
from kubelab.pki import KeyPair

# disruption: PodDisruptionBudgets get a status, so evictions are judged (429 under a full budget);
# the rest: namespace deletion, garbage collection, default ServiceAccounts and their tokens.
CONTROLLERS = (
    "disruption-controller",
    "garbage-collector-controller",
    "namespace-controller",
    "serviceaccount-controller",
    "serviceaccount-token-controller",
)
KWOK_STAGES = (
    "node/fast/node-initialize.yaml",
    "node/heartbeat/node-heartbeat.yaml",
    "pod/fast/pod-ready.yaml",
    "pod/fast/pod-delete.yaml",
)
SERVICE_CIDR = "10.96.0.0/24"
# the apiserver gives the `kubernetes` Service the first address of the range (in-cluster clients use it)
KUBERNETES_SERVICE_IP = str(ipaddress.ip_network(SERVICE_CIDR)[1])


@dataclass(frozen=True)
class CorePaths:
    """The files the core processes share (all inside the lab directory)."""

    lab_dir: Path
    ca: Path
    serving: KeyPair
    service_account: KeyPair
    kubeconfig: Path

    @property
    def etcd_data(self) -> Path:
        return self.lab_dir / "etcd"


def etcd_argv(binary: Path, paths: CorePaths, client_port: int, peer_port: int) -> list[str]:
    client = f"http://127.0.0.1:{client_port}"
    return [
        str(binary),
        "--name=kubelab",
        f"--data-dir={paths.etcd_data}",
        f"--listen-client-urls={client}",
        f"--advertise-client-urls={client}",
        f"--listen-peer-urls=http://127.0.0.1:{peer_port}",
        f"--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}",
        f"--initial-cluster=kubelab=http://127.0.0.1:{peer_port}",
        "--unsafe-no-fsync",  # test data: durability across power loss is not worth the disk waits
        "--log-level=warn",
    ]


def apiserver_argv(binary: Path, paths: CorePaths, etcd_port: int, port: int) -> list[str]:
    return [
        str(binary),
        f"--etcd-servers=http://127.0.0.1:{etcd_port}",
        "--bind-address=127.0.0.1",
        "--advertise-address=127.0.0.1",
        f"--secure-port={port}",
        f"--tls-cert-file={paths.serving.cert}",
        f"--tls-private-key-file={paths.serving.key}",
        f"--client-ca-file={paths.ca}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        # as kubeadm's control plane: the Node authorizer and bootstrap tokens let real nodes join with
        # `kubeadm join` (flavour "nodes"); without nodes or tokens they change nothing
        "--authorization-mode=Node,RBAC",
        "--enable-bootstrap-token-auth",
        f"--service-account-issuer=https://127.0.0.1:{port}/",
        f"--service-account-key-file={paths.service_account.cert}",
        f"--service-account-signing-key-file={paths.service_account.key}",
        # kwok Pods need no token; without the plugin a Pod can be created before its namespace's
        # default ServiceAccount exists
        "--disable-admission-plugins=ServiceAccount",
        "--allow-privileged=true",
        "--profiling=false",
    ]


def controller_manager_argv(binary: Path, paths: CorePaths) -> list[str]:
    return [
        str(binary),
        f"--kubeconfig={paths.kubeconfig}",
        "--leader-elect=false",
        "--secure-port=0",
        f"--controllers={','.join(CONTROLLERS)}",
        f"--service-account-private-key-file={paths.service_account.key}",
        f"--root-ca-file={paths.ca}",
        "--concurrent-gc-syncs=5",
    ]


def kwok_argv(binary: Path, paths: CorePaths, stages_dir: Path, port: int) -> list[str]:
    stage_args = [arg for stage in KWOK_STAGES for arg in ("-c", str(stages_dir / stage))]
    return [
        str(binary),
        f"--kubeconfig={paths.kubeconfig}",
        f"--manage-nodes-with-label-selector={KWOK_NODE_LABEL}",
        f"--server-address=127.0.0.1:{port}",
        *stage_args,
    ]


def kubeconfig_text(server: str, ca: Path, admin: KeyPair) -> str:
    """An admin kubeconfig (client cert in ``system:masters``) with absolute file paths."""
    return f"""apiVersion: v1
kind: Config
clusters:
- name: kubelab
  cluster:
    server: {server}
    certificate-authority: {ca}
users:
- name: admin
  user:
    client-certificate: {admin.cert}
    client-key: {admin.key}
contexts:
- name: kubelab
  context:
    cluster: kubelab
    user: admin
current-context: kubelab
"""
