"""Fixtures for the real-CAPI tests: our service registered with the real CAPI through an ExtensionConfig.

``capi_extension`` (session, one per xdist worker): ``inplace-extension serve`` over TLS with a serving
certificate from the kubelab's PKI (SAN 127.0.0.1, the host in ``clientConfig.url``), on a port outside
CAPD's ranges, with an inventory file, the hostlab network as ``--allowed-cidrs`` and the e2e playbooks
(Kubernetes binaries from the lab release server); an ExtensionConfig with that ``url``, the lab CA as
``caBundle`` and a ``namespaceSelector``, so only namespaces made by :meth:`Extension.namespace` use it.
The fixture returns once CAPI's Discovery call succeeded and ``status.handlers`` lists our three
handlers, and fails with CAPI's own ``Discovered`` condition message otherwise.

The CAPI lab is shared by the workers of a parallel run (``kubelab_capi``), so everything cluster-wide
that a worker makes carries the worker's id: the ExtensionConfig's name, its namespace label (each
worker's CAPI calls only its own service) and the serving certificate's file name in the lab's PKI.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from ipaddress import IPv4Network
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml
from e2e import conftest as e2e_fixtures
from e2e.conftest import START_VERSION
from e2e.service import SERVE_COMMAND, Service
from hostlab.inventory import service_inventory
from hostlab.lab import Host
from hostlab.lab import Lab as HostLab
from kubelab import objects
from kubelab.flavours import capi_objects as co
from kubelab.lab import Lab
from playbooks.standins import install_standins, lab_run_on_host

if TYPE_CHECKING:
    from .rollout import Cluster

# not the name deploy/ uses: tests/kubelab/test_deploy.py dry-runs that ExtensionConfig in the same lab;
# the worker's id follows (capi-lab-extension-gw0), so the workers sharing the CAPI lab never collide
EXTENSION = "capi-lab-extension"
SELECTOR_KEY = "inplace-extension.io/capi-lab"


def handlers_of(name: str) -> set[str]:
    """The handler names CAPI gives our three hooks under the ExtensionConfig ``name``."""
    return {f"{h}.{name}" for h in ("can-update-machine", "can-update-machineset", "update-machine")}


def serve_argv(
    kube: Lab, name: str, inventory: Path, network: IPv4Network, runs_dir: Path, capabilities: Path
) -> list[str]:
    """``inplace-extension serve`` over TLS for CAPI to call: a serving certificate ``name`` from the lab's
    PKI (SAN 127.0.0.1), a free port outside CAPD's 19000 and 20000-30000, the hostlab ``network`` as
    ``--allowed-cidrs`` and ``--retry-after-seconds 1`` (the lab's CAPI asks again at once)."""
    cert = kube.pki.issue_server(name)
    return [
        *SERVE_COMMAND,
        "--listen",
        f"127.0.0.1:{kube.free_port()}",
        "--tls-cert",
        str(cert.cert),
        "--tls-key",
        str(cert.key),
        "--inventory",
        str(inventory),
        "--allowed-cidrs",
        str(network),
        "--runs-dir",
        str(runs_dir),
        "--capabilities-file",
        str(capabilities),
        "--retry-after-seconds",
        "1",
    ]


def worker_id(config: pytest.Config) -> str:
    """This xdist worker's id (``gw0``, ...); ``main`` in a serial run."""
    return str(getattr(config, "workerinput", {}).get("workerid", "main"))


def unique_namespace(prefix: str) -> str:
    """A namespace name no other test or worker uses (kept short: it is part of run and socket paths)."""
    return f"{prefix}-{secrets.token_hex(4)}"


DISCOVERY_TIMEOUT = 60.0
# the e2e fixtures this directory shares: the lab release server and the playbooks that download from it
release_server = e2e_fixtures.release_server
e2e_capabilities = e2e_fixtures.e2e_capabilities


@dataclass
class Extension:
    """The running service and its ExtensionConfig; what the rollout tests drive and inspect."""

    kube: Lab
    hosts: HostLab
    argv: list[str]
    ca: Path
    inventory: Path
    runs_dir: Path
    log_dir: Path
    service: Service
    name: str  # of the ExtensionConfig
    selector: dict[str, str]  # the label of the namespaces it serves
    starts: int = 1
    namespaces: list[str] = field(default_factory=list)

    def namespace(self, prefix: str) -> str:
        """A fresh namespace whose clusters call our extension (it carries the ExtensionConfig's label)."""
        name = unique_namespace(prefix)
        objects.apply(
            self.kube,
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": self.selector}},
        )
        self.namespaces.append(name)
        return name

    def map_machines(self, names: Sequence[str]) -> None:
        """Machine name -> lab host, in order, through the inventory (the service re-reads it on change)."""
        self.inventory.write_text(yaml.safe_dump(service_inventory(self.hosts, list(names)), sort_keys=False))

    def log(self) -> str:
        return "".join(p.read_text(errors="replace") for p in sorted(self.log_dir.glob("service-*.log")))

    def kill(self) -> None:
        self.service.kill()

    def restart(self) -> None:
        """Start the service again with the same flags (same port, runs dir and inventory)."""
        self.starts += 1
        self.service = Service(self.argv, self.log_dir / f"service-{self.starts}.log", self.runs_dir, self.ca)

    def metrics(self) -> str:
        return self.service.client.get("/metrics").text


def extension_config(lab: Lab, name: str) -> dict[str, Any] | None:
    return objects.get(lab, "extensionconfigs.runtime.cluster.x-k8s.io", name)


@contextmanager
def registered(lab: Lab, url: str, name: str, selector: dict[str, str]) -> Iterator[dict[str, Any]]:
    """Our ExtensionConfig pointing CAPI at ``url`` (TLS, the lab CA) until the block ends: waits until
    CAPI discovered the handlers; deleted afterwards, so the next fixture can register its own service."""
    try:
        objects.apply(lab, co.extension_config(name, url, lab.ca.read_bytes(), selector))
        yield wait_discovered(lab, name)
    finally:
        lab.kubectl(
            "delete",
            "extensionconfigs.runtime.cluster.x-k8s.io",
            name,
            "--ignore-not-found",
            check=False,
        )


def wait_discovered(lab: Lab, name: str, timeout: float = DISCOVERY_TIMEOUT) -> dict[str, Any]:
    """Until CAPI discovered our handlers; else fail with the ExtensionConfig's Discovered condition."""
    deadline = time.monotonic() + timeout
    while True:
        config = extension_config(lab, name) or {}
        handlers = {h["name"] for h in config.get("status", {}).get("handlers", [])}
        discovered = objects.condition(config, "Discovered") or {}
        if discovered.get("status") == "True" and handlers >= handlers_of(name):
            return config
        if time.monotonic() > deadline:
            pytest.fail(
                f"CAPI did not discover the extension within {timeout:g}s: Discovered="
                f"{discovered.get('status')} {discovered.get('reason')}: {discovered.get('message')}; "
                f"handlers {sorted(handlers)}",
                pytrace=False,
            )
        time.sleep(0.5)


@pytest.fixture(scope="session")
def capi_extension(
    kubelab_capi: Lab,
    lab: HostLab,
    e2e_capabilities: Path,
    tmp_path_factory: pytest.TempPathFactory,
    request: pytest.FixtureRequest,
) -> Iterator[Extension]:
    worker = worker_id(request.config)
    name, selector = f"{EXTENSION}-{worker}", {SELECTOR_KEY: worker}
    work = tmp_path_factory.mktemp("capi-extension")
    inventory = work / "inventory.yaml"
    inventory.write_text("hosts: []\n")
    runs_dir = work / "runs"
    argv = serve_argv(kubelab_capi, name, inventory, lab.network, runs_dir, e2e_capabilities)
    service = Service(argv, work / "service-1.log", runs_dir, kubelab_capi.ca)
    ext = Extension(
        kubelab_capi, lab, argv, kubelab_capi.ca, inventory, runs_dir, work, service, name, selector
    )
    try:
        with registered(kubelab_capi, service.url, name, selector):
            yield ext
    finally:
        ext.service.stop()


@pytest.fixture
def hosts(lab: HostLab, lab_hosts: list[Host]) -> list[Host]:
    """Fresh lab hosts with the Kubernetes stand-ins at the clusters' starting version."""
    for host in lab_hosts:
        install_standins(lab_run_on_host(lab, host), version=START_VERSION)
    return lab_hosts


@pytest.fixture(scope="module")
def md_cluster(capi_extension: Extension) -> Cluster:
    """One cluster per test module: a control plane Machine and a MachineDeployment of 3."""
    from .rollout import create_cluster

    return create_cluster(capi_extension, "md", START_VERSION, md_replicas=3)
