"""The ``capi`` flavour: the real Cluster API controllers (core, KubeadmControlPlane, kubeadm bootstrap,
CAPD with its in-memory backend) as local processes on the lab's apiserver.

``start`` does what CAPI's kustomize overlays and cert-manager do in a real install: every controller gets
a webhook port, a health port and a serving certificate from the lab CA; its CRDs (contract labels,
conversion webhook at its own port) and its two webhook configurations (renamed, ``url`` +
``caBundle``) are installed from the pinned module (:mod:`kubelab.flavours.capi_webhooks`); then the
controllers start in dependency order and each one's ``/readyz`` (its webhook server is serving) must
answer before the next starts. Logs: ``<lab>/<controller>.log``. ``down`` stops them (reverse start
order, by PID) with the rest of the lab; their CRDs and objects go with the lab's etcd.

The CAPI version is one setting, :data:`kubelab.build.CAPI_VERSION` (with the wrapper module's
``go.mod``): the CRDs and webhooks are read from whatever version the module pins.

Ports: every port comes from :meth:`Lab.free_port`, which never hands out CAPD's own ports (19000
and 20000-30000, where its in-memory backend serves the fake workload clusters' API servers).
"""

from __future__ import annotations

import json
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from hostlab.errors import LabError
from hostlab.proc import wait_until

from kubelab import build, manifests, state
from kubelab.flavours.capi_webhooks import prepared_crds, prepared_webhook_configurations

if TYPE_CHECKING:
    from kubelab.lab import Lab

name = "capi"

# How often every controller re-reads every object it watches, regardless of events. Upstream's 10 min
# default is for production; the lab's rollout tests rely on events and requeues, not on resyncs,
# so this only bounds how long a missed event can stall a test.
SYNC_PERIOD = "1m"
# CAPD's in-memory backend binds 0.0.0.0:19000 (a debug listener) and one port from 20000 up per cluster,
# fixed in v1.14.2 (main.go passes no port options to NewWorkloadClustersMux): one CAPD per machine.
# A second lab's capi flavour waits for the first lab's CAPD to go, up to this long.
CAPD_DEBUG_PORT = 19000
CAPD_WAIT = 1800.0


@dataclass(frozen=True)
class Controller:
    """One CAPI controller: its binary (a :data:`kubelab.build.BINARIES` name, also the component name),
    the Go module and ``config/`` directory its CRDs and webhooks come from, and what it needs set."""

    name: str
    module: str
    config_dir: str
    feature_gates: str = ""
    env: dict[str, str] = field(default_factory=dict)


# Start order: core first (it owns the contract and the conversion of Cluster/Machine types the others
# read), then the providers.
CONTROLLERS: tuple[Controller, ...] = (
    Controller("capi-core", "sigs.k8s.io/cluster-api", "core/config", "RuntimeSDK=true,InPlaceUpdates=true"),
    Controller("capi-kcp", "sigs.k8s.io/cluster-api", "controlplane/kubeadm/config", "InPlaceUpdates=true"),
    Controller("capi-cabpk", "sigs.k8s.io/cluster-api", "bootstrap/kubeadm/config"),
    # POD_IP: the address CAPD's in-memory backend serves the fake workload API servers on
    Controller(
        "capd", "sigs.k8s.io/cluster-api/test", "infrastructure/docker/config", env={"POD_IP": "127.0.0.1"}
    ),
)
binaries = tuple(c.name for c in CONTROLLERS)


def config_dir(lab: Lab, controller: Controller, sources: dict[str, Path] | None = None) -> Path:
    """The controller's ``config/`` directory in the module cache, as the wrapper module pins it."""
    cache = {} if sources is None else sources
    if controller.module not in cache:
        cache[controller.module] = build.module_source(lab.cfg, "capi", controller.module)
    return cache[controller.module] / controller.config_dir


def webhook_port(lab: Lab, controller: str) -> int:
    return lab.state().ports[f"{controller}-webhook"]


def argv(lab: Lab, controller: Controller, webhook: int, health: int) -> list[str]:
    cert = lab.pki.issue_server(f"{controller.name}-webhook")
    args = [
        str(lab.binary(controller.name)),
        f"--kubeconfig={lab.kubeconfig}",
        "--leader-elect=false",
        f"--webhook-port={webhook}",
        f"--webhook-cert-dir={cert.cert.parent}",
        f"--webhook-cert-name={cert.cert.name}",
        f"--webhook-key-name={cert.key.name}",
        f"--health-addr=127.0.0.1:{health}",
        "--diagnostics-address=0",  # no metrics/pprof endpoint: nothing in the lab reads it
        f"--sync-period={SYNC_PERIOD}",
    ]
    if controller.feature_gates:
        args.append(f"--feature-gates={controller.feature_gates}")
    return args


def _write(directory: Path, file_name: str, doc: object) -> Path:
    path = directory / file_name
    path.write_text(json.dumps(doc))
    return path


def start(lab: Lab) -> None:
    """Install CAPI's CRDs and webhook configurations, start the four controllers, wait for each."""
    ca_pem = lab.ca.read_bytes()
    work = lab.dir / "capi"
    work.mkdir(parents=True, exist_ok=True)
    current = lab.state()
    for controller in CONTROLLERS:
        for kind in ("webhook", "health"):
            current.ports.setdefault(f"{controller.name}-{kind}", lab.free_port())
    state.save(lab.dir, current)
    crd_files: list[Path] = []
    webhook_docs = []
    sources: dict[str, Path] = {}
    for controller in CONTROLLERS:
        directory = config_dir(lab, controller, sources)
        port = current.ports[f"{controller.name}-webhook"]
        for crd in prepared_crds(directory, port, ca_pem):
            crd_files.append(_write(work, f"crd-{crd['metadata']['name']}.json", crd))
        webhook_docs += prepared_webhook_configurations(directory, controller.name, port, ca_pem)
    # every CRD as prepared here, over any plain copy a test installed before (a re-apply of ours only)
    manifests.install_crds(lab, crd_files)
    webhooks = _write(
        work, "webhook-configurations.json", {"apiVersion": "v1", "kind": "List", "items": webhook_docs}
    )
    lab.kubectl("apply", "--server-side", "--field-manager=kubelab", "-f", str(webhooks))
    for controller in CONTROLLERS:
        if controller.name == "capd" and not _capd_ports_free():
            print(
                f"kubelab {lab.name}: waiting for port {CAPD_DEBUG_PORT} (another lab's CAPD) ...", flush=True
            )
            if not wait_until(_capd_ports_free, CAPD_WAIT, 1.0):
                raise LabError(
                    f"kubelab: port {CAPD_DEBUG_PORT} stayed in use for {CAPD_WAIT:g}s: CAPD's in-memory "
                    "backend runs once per machine (`kubelab status --all` shows which lab has one)"
                )
        health = current.ports[f"{controller.name}-health"]
        lab.start_component(
            controller.name,
            argv(lab, controller, current.ports[f"{controller.name}-webhook"], health),
            env=controller.env,
            ready=f"http://127.0.0.1:{health}/readyz",
        )


def _capd_ports_free() -> bool:
    """Whether CAPD's fixed debug port can be bound (as Go binds it: SO_REUSEADDR, all addresses)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("0.0.0.0", CAPD_DEBUG_PORT))  # noqa: S104 (the address CAPD itself binds)
        except OSError:
            return False
    return True
