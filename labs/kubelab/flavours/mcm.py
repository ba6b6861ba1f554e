"""The ``mcm`` flavour: machine-controller-manager v0.62.1 and our static-hosts machine controller.

What runs (all real MCM code, built from ``labs/kubelab/go/mcm``):

- MCM's CRDs from the pinned module zip (``kubernetes/crds/``), established before any controller
  starts (both processes give up after ~10 s when a CRD is missing);
- ``machine-controller-manager`` (MachineDeployment/MachineSet controllers, in-place orchestration);
- ``static-hosts-machine-controller``: MCM's machine-controller library (drain, in-place states,
  health, timeouts) with our driver, which backs each Machine by one host of a list and creates a
  Node named like the Machine, labelled ``type=kwok`` so kwok keeps it Ready.

Both watch the namespace :data:`NAMESPACE` of the lab cluster, which is control and target cluster at
once. A controller is ready when its ``/healthz`` answers and its log says its informers synced
("Starting machine-controller-manager"). The host list is a JSON file in the lab directory;
:func:`set_hosts` replaces it (e.g. with hostlab hosts, each optionally with the providerID of an
instance its machine stands for) and restarts the machine controller.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
from hostlab.errors import LabError

from kubelab import build, manifests, objects
from kubelab.config import KWOK_NODE_LABEL

if TYPE_CHECKING:
    from kubelab.lab import Lab

name = "mcm"
binaries = ("machine-controller-manager", "static-hosts-machine-controller")

NAMESPACE = "machines"
MCM_MODULE = "github.com/gardener/machine-controller-manager"
CONTROLLER = "machine-controller-manager"
MACHINE_CONTROLLER = "static-hosts-machine-controller"
STARTED_LINE = "Starting machine-controller-manager"  # logged (V1) once the informers synced
# Until a test names real hosts: documentation addresses (TEST-NET-2), nothing listens there.
DEFAULT_HOSTS = tuple((f"static-{i}", f"198.51.100.{i}") for i in range(1, 11))

# Flags as first run by hand against MCM v0.62.1.
# --v=4: MachineDeployment sync errors are only logged at level 4.
CONTROLLER_FLAGS = ("--safety-up=2", "--safety-down=1", "--machine-safety-overshooting-period=1m", "--v=4")
MACHINE_CONTROLLER_FLAGS = (
    "--machine-creation-timeout=5m",
    "--machine-health-timeout=10m",
    "--machine-drain-timeout=3m",
    "--machine-inplace-update-timeout=10m",
    "--v=4",
)


def crd_files(lab: Lab) -> list[Path]:
    root = build.module_source(lab.cfg, "mcm", MCM_MODULE)
    files = sorted((root / "kubernetes" / "crds").glob("*.yaml"))
    if not files:
        raise LabError(f"kubelab mcm: no CRDs under {root}/kubernetes/crds")
    return files


def hosts_file(lab: Lab) -> Path:
    return lab.dir / "static-hosts.json"


def write_hosts(
    lab: Lab, hosts: Iterable[tuple[str, str]], provider_ids: Mapping[str, str] | None = None
) -> Path:
    """``provider_ids``: host name -> the providerID its Node and Machine get (the driver's own
    ``static:///<host>`` for a host not named)."""
    key, value = KWOK_NODE_LABEL.split("=", 1)
    ids = provider_ids or {}
    entries = [
        {"name": host, "address": address} | ({"providerID": ids[host]} if host in ids else {})
        for host, address in hosts
    ]
    config = {"hosts": entries, "nodeLabels": {key: value}}
    path = hosts_file(lab)
    path.write_text(json.dumps(config, indent=2) + "\n")
    return path


def _common_flags(lab: Lab, port: int) -> list[str]:
    return [
        f"--control-kubeconfig={lab.kubeconfig}",
        f"--target-kubeconfig={lab.kubeconfig}",
        f"--namespace={NAMESPACE}",
        "--leader-elect=false",
        "--address=127.0.0.1",
        f"--port={port}",  # the machine controller's default 10259 is kube-scheduler's
    ]


def _log_size(lab: Lab, component: str) -> int:
    log = lab.dir / f"{component}.log"
    return log.stat().st_size if log.exists() else 0


def _ready(lab: Lab, component: str, port: int, log_offset: int) -> bool:
    """The log (appended to across restarts: read from ``log_offset``) says it started, /healthz is OK."""
    try:
        with (lab.dir / f"{component}.log").open("rb") as log:
            log.seek(log_offset)
            if STARTED_LINE.encode() not in log.read():
                return False
        return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5).status_code == 200
    except (OSError, httpx.HTTPError):
        return False


def _start(lab: Lab, component: str, extra: Iterable[str]) -> None:
    port = lab.free_port()
    offset = _log_size(lab, component)
    argv = [str(lab.binary(component)), *_common_flags(lab, port), *extra]
    lab.start_component(component, argv, ready=lambda: _ready(lab, component, port, offset))


def start(lab: Lab) -> None:
    manifests.install_crds(lab, crd_files(lab))
    objects.ensure_namespace(lab, NAMESPACE)
    if not hosts_file(lab).exists():
        write_hosts(lab, DEFAULT_HOSTS)
    _start(lab, CONTROLLER, CONTROLLER_FLAGS)
    start_machine_controller(lab)


def stop(lab: Lab) -> None:
    """Stop both controllers (by PID, the machine controller first); the CRDs and objects stay."""
    lab.stop_component(MACHINE_CONTROLLER)
    lab.stop_component(CONTROLLER)


def start_machine_controller(lab: Lab) -> None:
    _start(lab, MACHINE_CONTROLLER, [f"--static-hosts-config={hosts_file(lab)}", *MACHINE_CONTROLLER_FLAGS])


def set_hosts(lab: Lab, hosts: Mapping[str, str], provider_ids: Mapping[str, str] | None = None) -> None:
    """Back Machines by these hosts (name -> IP address) from now on: rewrite the list, restart the
    machine controller (a fresh port; Machines already backed keep their Nodes and hosts).
    ``provider_ids`` as for :func:`write_hosts`."""
    write_hosts(lab, hosts.items(), provider_ids)
    lab.stop_component(MACHINE_CONTROLLER)
    start_machine_controller(lab)
