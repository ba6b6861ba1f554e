"""The ``nodes`` flavour: what a control plane needs so that real nodes join it with ``kubeadm join``.

kubeadm's own join path, against a control plane kubeadm did not make (kubelab's): the apiserver
already authorizes with ``Node,RBAC`` and accepts bootstrap tokens (:mod:`kubelab.core`); this flavour
adds

- a second kube-controller-manager with the controllers of TLS bootstrap and tokens
  (``csrsigning`` with the lab CA as the cluster signer, ``csrapproving``, ``csrcleaner``,
  ``bootstrapsigner`` which signs ``cluster-info`` for each token, ``tokencleaner``) and those that Pods
  and Jobs on real nodes need: ``job-controller``, ``ttl-after-finished-controller``
  (``ttlSecondsAfterFinished``), ``root-ca-certificate-publisher-controller`` (the ``kube-root-ca.crt``
  ConfigMap in every namespace, which a Pod's service-account token volume mounts);
- kube-scheduler, so that a Pod or a Job's Pods need no ``nodeName``: they are placed as in any
  cluster (the lab's apiserver may hold kwok Nodes too: a Pod meant for a real node selects one, e.g.
  with ``nodeSelector`` ``kubernetes.io/hostname``);
- ``cluster-info`` in ``kube-public`` naming the apiserver as nodes reach it
  (``https://kubelab-apiserver:PORT``, see :data:`kubelab.config.APISERVER_NAME`);
- kubeadm's ConfigMaps and RBAC, made by the real kubeadm on the machine with the admin kubeconfig:
  ``kubeadm init phase upload-config kubeadm``, ``upload-config kubelet`` and ``bootstrap-token``
  (one bootstrap token, kept in the lab directory: :func:`token`).

The KubeletConfiguration every node gets (``kubelet-config`` ConfigMap, rewritten into the node by
``kubeadm join`` and by ``kubeadm upgrade node``) suits a node booted by systemd-nspawn on a cgroup v1
machine: ``failCgroupV1: false``, the ``cgroupfs`` driver, and no QoS or allocatable cgroups (the
container sees the v1 controllers read-only). The ClusterConfiguration says the nodes' first version
(:data:`kubelab.build.NODE_VERSIONS`).
"""

from __future__ import annotations

import base64
import json
import secrets
import string
import subprocess
from typing import TYPE_CHECKING

from hostlab.errors import LabError
from hostlab.proc import wait_until

from kubelab import build, core, reads
from kubelab.config import APISERVER_NAME

if TYPE_CHECKING:
    from kubelab.lab import Lab

name = "nodes"
# kubeadm runs here too (the upload phases), at the nodes' first version
binaries = (*build.NODE_BINARIES, "kube-scheduler")

COMPONENT = "kube-controller-manager-nodes"
SCHEDULER = "kube-scheduler"
CONTROLLERS = (
    *("csrsigning", "csrapproving", "csrcleaner", "bootstrapsigner", "tokencleaner"),
    *("job-controller", "ttl-after-finished-controller", "root-ca-certificate-publisher-controller"),
)
START_VERSION = build.NODE_VERSIONS[0]
KUBELET_CONFIGURATION = {
    "apiVersion": "kubelet.config.k8s.io/v1beta1",
    "kind": "KubeletConfiguration",
    "failCgroupV1": False,
    "cgroupDriver": "cgroupfs",
    "cgroupsPerQOS": False,
    "enforceNodeAllocatable": ["none"],  # kubeadm drops an empty list, and the kubelet's default needs QoS
}
CONTAINERD_SOCKET = "unix:///var/run/containerd/containerd.sock"
KUBEADM_TIMEOUT = 120.0


def token(lab: Lab) -> str:
    """The lab's bootstrap token (``[a-z0-9]{6}.[a-z0-9]{16}``), made once per lab."""
    path = lab.dir / "bootstrap-token"
    if not path.is_file():
        alphabet = string.ascii_lowercase + string.digits
        token_id, secret = ("".join(secrets.choice(alphabet) for _ in range(n)) for n in (6, 16))
        path.write_text(f"{token_id}.{secret}\n")
        path.chmod(0o600)
    return path.read_text().strip()


def endpoint(lab: Lab) -> str:
    """``host:port`` of the apiserver as the nodes name it (their /etc/hosts maps the name)."""
    return f"{APISERVER_NAME}:{lab.state().ports['apiserver']}"


def _machine_address() -> str:
    """A non-loopback address of this machine: kubeadm refuses a loopback advertiseAddress (nothing is
    sent to it: the phases run here only upload configuration)."""
    argv = ["ip", "-j", "-4", "addr", "show", "scope", "global"]
    out = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=30).stdout
    for link in json.loads(out or "[]"):
        for info in link.get("addr_info", []):
            return str(info["local"])
    raise LabError("kubelab nodes: this machine has no global IPv4 address for kubeadm's advertiseAddress")


def kubeadm_config(lab: Lab) -> str:
    """InitConfiguration (the token), ClusterConfiguration, KubeletConfiguration, as kubeadm reads them."""
    port = lab.state().ports["apiserver"]
    init = {
        "apiVersion": "kubeadm.k8s.io/v1beta4",
        "kind": "InitConfiguration",
        "bootstrapTokens": [
            {
                "token": token(lab),
                "ttl": "24h0m0s",
                "usages": ["signing", "authentication"],
                "groups": ["system:bootstrappers:kubeadm:default-node-token"],
            }
        ],
        "localAPIEndpoint": {"advertiseAddress": _machine_address(), "bindPort": port},
        "nodeRegistration": {"name": "kubelab-control-plane", "criSocket": CONTAINERD_SOCKET},
    }
    cluster = {
        "apiVersion": "kubeadm.k8s.io/v1beta4",
        "kind": "ClusterConfiguration",
        "kubernetesVersion": START_VERSION,
        "controlPlaneEndpoint": endpoint(lab),
        "networking": {"serviceSubnet": core.SERVICE_CIDR},
    }
    return "\n---\n".join(json.dumps(doc) for doc in (init, cluster, KUBELET_CONFIGURATION)) + "\n"


def _cluster_info(lab: Lab) -> str:
    """kube-public/cluster-info as kubeadm makes it, but naming the apiserver as the nodes reach it."""
    kubeconfig = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "",
                "cluster": {
                    "server": f"https://{endpoint(lab)}",
                    "certificate-authority-data": base64.b64encode(lab.ca.read_bytes()).decode(),
                },
            }
        ],
        "contexts": [],
        "users": [],
    }
    config_map = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "cluster-info", "namespace": "kube-public"},
        "data": {"kubeconfig": json.dumps(kubeconfig)},
    }
    return json.dumps(config_map)


def _kubeadm(lab: Lab, *args: str) -> None:
    argv = [str(lab.binary(f"kubeadm-{START_VERSION}")), *args]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=KUBEADM_TIMEOUT, check=False)
    except subprocess.TimeoutExpired as exc:
        raise LabError(f"kubelab nodes: kubeadm {' '.join(args)} timed out") from exc
    if proc.returncode != 0:
        raise LabError(f"kubelab nodes: kubeadm {' '.join(args)} failed: {proc.stderr.strip()[-2000:]}")


def _signature(lab: Lab) -> str | None:
    """bootstrapsigner's signature of cluster-info for the lab's token (what ``kubeadm join`` checks)."""
    token_id = token(lab).split(".")[0]
    try:
        info = reads.get(lab, "configmap", "cluster-info", "kube-public")
    except LabError:
        return None
    if info is None:
        return None
    signature = info.get("data", {}).get(f"jws-kubeconfig-{token_id}")
    return signature if isinstance(signature, str) else None


def start(lab: Lab) -> None:
    ca_key = lab.pki_dir / "ca.key"
    kcm = [
        str(lab.binary("kube-controller-manager")),
        f"--kubeconfig={lab.kubeconfig}",
        "--leader-elect=false",
        "--secure-port=0",
        f"--controllers={','.join(CONTROLLERS)}",
        f"--cluster-signing-cert-file={lab.ca}",
        f"--cluster-signing-key-file={ca_key}",
        f"--root-ca-file={lab.ca}",  # what root-ca-certificate-publisher publishes as kube-root-ca.crt
    ]
    lab.start_component(COMPONENT, kcm)
    scheduler = [
        str(lab.binary("kube-scheduler")),
        f"--kubeconfig={lab.kubeconfig}",
        f"--authentication-kubeconfig={lab.kubeconfig}",
        f"--authorization-kubeconfig={lab.kubeconfig}",
        "--leader-elect=false",
        "--secure-port=0",
    ]
    lab.start_component(SCHEDULER, scheduler)
    config = lab.dir / "kubeadm-config.yaml"
    config.write_text(kubeadm_config(lab))
    for phase in (("upload-config", "kubeadm"), ("upload-config", "kubelet"), ("bootstrap-token",)):
        _kubeadm(lab, "init", "phase", *phase, f"--config={config}", f"--kubeconfig={lab.kubeconfig}")
    # kubeadm wrote cluster-info with the admin kubeconfig's loopback server: name the apiserver as the
    # nodes reach it; bootstrapsigner signs the new content again (a new signature)
    before = _signature(lab)
    lab.kubectl("apply", "-f", "-", input=_cluster_info(lab))
    if not wait_until(lambda: _signature(lab) not in (None, before), 60, 0.5):
        raise LabError(
            f"kubelab nodes: cluster-info not signed for the token within 60s (log {COMPONENT}.log)"
        )
