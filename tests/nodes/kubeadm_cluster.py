"""A cluster that kubeadm makes on the node lab's nodes, as a user makes one: ``kubeadm init`` on the first
node, ``kubeadm join`` on the others, ``kubeadm upgrade apply`` / ``upgrade node`` to go in place to a new
version, each from a config file a user would write (:func:`init_config`, :func:`join_config`,
:func:`upgrade_config`), and the cluster's API read with the admin credentials kubeadm wrote
(:class:`AdminApi`), watched for its gaps while it restarts (:class:`ApiProbe`).

The nodes are the lab's own (systemd booted by systemd-nspawn on a cgroup v1 machine, containerd, runc);
what such a node asks of kubeadm is said in the config files and nowhere else: the KubeletConfiguration
of the lab's nodes (:data:`kubelab.flavours.nodes.KUBELET_CONFIGURATION`: ``failCgroupV1: false``, the
cgroupfs driver, no QoS cgroups) and the preflight checks a container cannot pass
(:data:`IGNORED_PREFLIGHT`, each with why). The control-plane images come from no registry: they are
imported into each node (:func:`images.import_control_plane`) under ``imageRepository``
:data:`images.CONTROL_PLANE_REPOSITORY`, and kubeadm's addons that need images the lab does not build
(CoreDNS, kube-proxy) are skipped with ``skipPhases``.
"""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
import ssl
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from hostlab.errors import LabError
from hostlab.lab import Host
from hostlab.lab import Lab as HostLab
from kubelab import build
from kubelab.config import Config as KubeConfig
from kubelab.flavours.nodes import CONTAINERD_SOCKET, KUBELET_CONFIGURATION
from kubelab.pytest_plugin import unavailable as kube_unavailable

from .images import CONTROL_PLANE_REPOSITORY

KUBEADM_API = "kubeadm.k8s.io/v1beta4"
API_PORT = 6443
# Preflight checks a node of this lab cannot pass, and why (kubeadm's names for them)
IGNORED_PREFLIGHT = (
    "SystemVerification",  # cgroup v1: kubeadm >= v1.35 refuses it unless told (failCgroupV1: false)
)
# and at `upgrade apply`: kubeadm v1.36 runs its CoreDNS checks even when the addon is disabled (init's
# skipPhases set dns.disabled), and without a CoreDNS ConfigMap they fail: "start version '' not supported"
IGNORED_UPGRADE_APPLY_PREFLIGHT = (*IGNORED_PREFLIGHT, "CoreDNSUnsupportedPlugins", "CoreDNSMigration")
KUBEADM_TIMEOUT = 600.0  # init or upgrade apply: images are local, the static Pods start on busy cores
PROBE_INTERVAL = 0.2  # seconds between the API probe's reads
PROBE_TIMEOUT = 2.0  # one read of the probe: longer counts as no answer


def built(names: Sequence[str]) -> dict[str, Path]:
    """The kubelab binaries ``names`` (:data:`kubelab.build.BINARIES`), built from the pinned Go modules
    where missing (kubelab build); without a Go toolchain the test is unavailable, a failed build fails."""
    cfg = KubeConfig.from_env()
    try:
        return build.ensure_built(names, cfg)
    except LabError as exc:
        if shutil.which(cfg.go) is None:
            kube_unavailable(f"no Go toolchain ({cfg.go}) to build {', '.join(names)}: {exc}")
        pytest.fail(f"kubelab build of {', '.join(names)} failed: {exc}", pytrace=False)


def _yaml_docs(*docs: dict[str, Any]) -> str:
    return "---\n".join(yaml.safe_dump(doc, sort_keys=False) for doc in docs)


def cluster_configuration(version: str) -> dict[str, Any]:
    """The ClusterConfiguration: the version, the lab's imageRepository, kubelab's etcd by its tag."""
    return {
        "apiVersion": KUBEADM_API,
        "kind": "ClusterConfiguration",
        "kubernetesVersion": version,
        "imageRepository": CONTROL_PLANE_REPOSITORY,
        "etcd": {"local": {"imageTag": build.ETCD_VERSION}},
    }


def init_config(host: Host, version: str, token: str) -> str:
    """``kubeadm init --config`` for ``host``: its name and address, the bootstrap token the others join
    with, CoreDNS and kube-proxy skipped, and the lab's KubeletConfiguration."""
    init = {
        "apiVersion": KUBEADM_API,
        "kind": "InitConfiguration",
        "bootstrapTokens": [{"token": token, "ttl": "2h0m0s"}],
        "localAPIEndpoint": {"advertiseAddress": host.address, "bindPort": API_PORT},
        "nodeRegistration": {
            "name": host.name,
            "criSocket": CONTAINERD_SOCKET,
            "ignorePreflightErrors": list(IGNORED_PREFLIGHT),
        },
        "skipPhases": ["addon/coredns", "addon/kube-proxy"],
    }
    return _yaml_docs(init, cluster_configuration(version), KUBELET_CONFIGURATION)


def join_config(host: Host, endpoint: str, token: str, ca_hash: str) -> str:
    """``kubeadm join --config`` for ``host`` as a worker: the token, the CA pinned by its hash."""
    join = {
        "apiVersion": KUBEADM_API,
        "kind": "JoinConfiguration",
        "discovery": {
            "bootstrapToken": {"apiServerEndpoint": endpoint, "token": token, "caCertHashes": [ca_hash]}
        },
        "nodeRegistration": {
            "name": host.name,
            "criSocket": CONTAINERD_SOCKET,
            "ignorePreflightErrors": list(IGNORED_PREFLIGHT),
        },
    }
    return _yaml_docs(join)


def upgrade_config(version: str) -> str:
    """``kubeadm upgrade apply|node --config``: the target version and the preflight checks to skip."""
    upgrade = {
        "apiVersion": KUBEADM_API,
        "kind": "UpgradeConfiguration",
        "apply": {
            "kubernetesVersion": version,
            "ignorePreflightErrors": list(IGNORED_UPGRADE_APPLY_PREFLIGHT),
        },
        "node": {"ignorePreflightErrors": list(IGNORED_PREFLIGHT)},
    }
    return _yaml_docs(upgrade)


def ca_cert_hash(ca_pem: bytes) -> str:
    """``sha256:<hex>`` of the CA's public key (SubjectPublicKeyInfo), as ``caCertHashes`` pins it."""
    spki = (
        x509.load_pem_x509_certificate(ca_pem)
        .public_key()
        .public_bytes(Encoding.DER, PublicFormat.SubjectPublicKeyInfo)
    )
    return f"sha256:{hashlib.sha256(spki).hexdigest()}"


def kubeadm(lab: HostLab, host: Host, *args: str, config: str) -> str:
    """``kubeadm <args> --config <file>`` inside ``host`` (the file written into its root first);
    returns its output, raises with the end of it if kubeadm fails."""
    path = "/etc/kubernetes/lab-kubeadm.yaml"
    target = host.root() / path.lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(config)
    argv = ["kubeadm", *args, f"--config={path}"]
    result = lab.exec_in(host, argv, timeout=KUBEADM_TIMEOUT)
    if result.returncode != 0:
        detail = (result.stdout + result.stderr).strip()[-4000:]
        raise LabError(f"{host.name}: {' '.join(argv)} failed (exit {result.returncode}):\n{detail}")
    return result.stdout


@dataclass
class AdminApi:
    """The cluster's API as ``/etc/kubernetes/admin.conf`` of the first node says (server, CA, client
    certificate), for the test's reads; the key material in a private temporary directory."""

    server: str
    context: ssl.SSLContext
    _dir: tempfile.TemporaryDirectory[str] = field(repr=False)

    @classmethod
    def from_admin_conf(cls, text: str) -> AdminApi:
        config = yaml.safe_load(text)
        cluster = config["clusters"][0]["cluster"]
        if not str(cluster["server"]).startswith("https://"):
            raise LabError(f"admin.conf names a server that is not https://: {cluster['server']}")
        user = config["users"][0]["user"]
        tmp = tempfile.TemporaryDirectory(prefix="kubeadm-admin-")
        cert, key = Path(tmp.name) / "client.crt", Path(tmp.name) / "client.key"
        cert.write_bytes(base64.b64decode(user["client-certificate-data"]))
        key.touch(mode=0o600)
        key.write_bytes(base64.b64decode(user["client-key-data"]))
        ca = base64.b64decode(cluster["certificate-authority-data"]).decode()
        context = ssl.create_default_context(cadata=ca)
        context.load_cert_chain(cert, key)
        return cls(str(cluster["server"]), context, tmp)

    def get(self, path: str, timeout: float = 10.0) -> Any:
        """GET ``path`` as JSON; raises ``OSError`` (``URLError``/``HTTPError``) when it gets no answer."""
        url = self.server + path  # https:// only (from_admin_conf)
        with urllib.request.urlopen(url, timeout=timeout, context=self.context) as resp:  # noqa: S310
            return json.load(resp)

    def post(self, path: str, body: dict[str, Any], timeout: float = 10.0) -> Any:
        """POST ``body`` as JSON to ``path``; the created object, or ``HTTPError`` with the API's refusal."""
        request = urllib.request.Request(  # noqa: S310 (https:// only, from_admin_conf)
            self.server + path, json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=timeout, context=self.context) as resp:  # noqa: S310
            return json.load(resp)

    def answers(self, path: str = "/version") -> bool:
        try:
            self.get(path, timeout=PROBE_TIMEOUT)
        except (OSError, ValueError):
            return False
        return True

    def close(self) -> None:
        self._dir.cleanup()


class ApiProbe:
    """Reads the API every :data:`PROBE_INTERVAL` seconds in a thread while a block runs (a context
    manager) and keeps the longest time between two answered reads (``longest_gap``) and how many reads
    were not answered. A read is a list of the Nodes: it goes through the apiserver to etcd. Given
    several ``apis`` (each apiserver of a control plane), a read is answered when any of them answers,
    tried in order: what a client behind a load balancer that skips a dead apiserver would see."""

    def __init__(self, *apis: AdminApi) -> None:
        self.apis = apis
        self.longest_gap = 0.0
        self.unanswered = 0
        self.answered = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="api-probe", daemon=True)

    def _run(self) -> None:
        last = time.monotonic()
        while not self._stop.is_set():
            if any(api.answers("/api/v1/nodes?limit=1") for api in self.apis):
                now = time.monotonic()
                self.longest_gap = max(self.longest_gap, now - last)
                self.answered += 1
                last = now
            else:
                self.unanswered += 1
            self._stop.wait(PROBE_INTERVAL)
        # a gap still open when the block ends counts too
        self.longest_gap = max(self.longest_gap, time.monotonic() - last)

    def __enter__(self) -> ApiProbe:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=PROBE_TIMEOUT + 5)
