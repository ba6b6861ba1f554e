"""End-to-end fixtures: the real service as a subprocess, lab hosts with Kubernetes stand-ins, and a
release server on the lab gateway for the kubernetes_version role's binary downloads.

What is a stand-in here: kubeadm, kubelet, kubectl and systemctl on the lab hosts (tests/playbooks/
standins.py; the hosts have no systemd and no Kubernetes). The service, the playbooks, SSH and the hosts'
files, users and configs are real.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest
from hostlab.lab import Host, Lab
from playbooks.standins import install_standins, lab_run_on_host
from playbooks.support import ReleaseServer

from inplace_extension.plays.ssh import close_control_masters

from .service import Service, serve_argv

REPO = Path(__file__).resolve().parents[2]
START_VERSION = "v1.30.2"
NEXT_VERSION = "v1.31.0"


StartService = Callable[..., Service]


def _wait_for_orphans(runs_dir: Path, within: float = 120.0) -> None:
    """Plays left running by a killed service (they are detached on purpose) must end before teardown."""
    deadline = time.monotonic() + within
    while True:
        alive = []
        for pid_dir in Path("/proc").iterdir():
            if not pid_dir.name.isdigit():
                continue
            try:
                cmdline = (pid_dir / "cmdline").read_bytes()
            except OSError:
                continue
            if b"ansible-playbook" in cmdline and str(runs_dir).encode() in cmdline:
                alive.append(pid_dir.name)
        if not alive:
            return
        assert time.monotonic() < deadline, f"ansible-playbook processes still running: {alive}"
        time.sleep(0.2)


@pytest.fixture
def start_service(tmp_path: Path, e2e_capabilities: Path, lab: Lab) -> Iterator[StartService]:
    started: list[Service] = []

    def start(
        inventory: Path,
        runs_dir: Path | None = None,
        *,
        max_parallel: int = 8,
        name: str = "service",
        extra_args: Sequence[str] = (),
    ) -> Service:
        runs = runs_dir or tmp_path / f"runs-{name}"
        capabilities = e2e_capabilities
        if "--capabilities-file" in extra_args:  # the test's own file, with the lab's role settings added
            given = list(extra_args)
            index = given.index("--capabilities-file")
            capabilities = tmp_path / f"capabilities-{name}.yaml"
            own = Path(given[index + 1]).read_text()
            capabilities.write_text(own + e2e_capabilities.read_text())
            extra_args = given[:index] + given[index + 2 :]
        argv = serve_argv(
            inventory,
            str(lab.network),
            runs,
            "--capabilities-file",
            str(capabilities),
            "--max-parallel-runs",
            str(max_parallel),
            *extra_args,
        )
        service = Service(argv, tmp_path / f"{name}.log", runs)
        started.append(service)
        return service

    yield start
    for service in started:
        service.stop()
    for runs in {s.runs_dir for s in started}:
        _wait_for_orphans(runs)
        close_control_masters(runs)


@pytest.fixture(scope="session")
def release_server(lab: Lab) -> Iterator[str]:
    """dl.k8s.io's layout (stand-in binaries + .sha256) served on the lab gateway, the only place the lab
    hosts reach: the playbook tests' ReleaseServer."""
    with ReleaseServer(lab.gateway) as server:
        yield server.base_url


@pytest.fixture(scope="session")
def e2e_capabilities(release_server: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A capabilities file with the lab's role settings (the shipped playbooks unchanged): Kubernetes
    binaries from the lab release server, the way a site points the role at an internal mirror."""
    path = tmp_path_factory.mktemp("capabilities") / "capabilities.yaml"
    path.write_text(
        "# tests/e2e/conftest.py: lab hosts reach only the lab gateway\n"
        "role_settings:\n"
        "  kubernetes_version:\n"
        "    package_source: binary\n"
        f"    binary_base_url: {release_server}\n"
        "    health_delay_seconds: 1\n"
    )
    return path


@pytest.fixture
def nodes(lab: Lab, lab_hosts: list[Host]) -> list[Host]:
    """Fresh lab hosts with the Kubernetes stand-ins at START_VERSION."""
    for host in lab_hosts:
        install_standins(lab_run_on_host(lab, host), version=START_VERSION)
    return lab_hosts
