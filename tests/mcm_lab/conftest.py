"""Fixtures for the runs beside the real MCM: the lab hosts with Kubernetes stand-ins and the test
playbooks of the end-to-end tests (tests/e2e/conftest.py, reused as they are), and a factory for
``inplace-extension mcm-agent`` subprocesses that are stopped (and their plays waited for) at the end.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

import pytest
from e2e.conftest import _wait_for_orphans, e2e_capabilities, nodes, release_server
from hostlab.lab import Host
from hostlab.lab import Lab as HostLab
from kubelab.lab import Lab

from inplace_extension.plays.ssh import close_control_masters

from .agentproc import AgentProcess, agent_argv, write_inventory

__all__ = ["e2e_capabilities", "nodes", "release_server"]

StartAgent = Callable[..., AgentProcess]


@pytest.fixture
def start_agent(
    kubelab_mcm: Lab, lab: HostLab, e2e_capabilities: Path, tmp_path: Path
) -> Iterator[StartAgent]:
    started: list[AgentProcess] = []

    def start(
        runs_dir: Path | None = None,
        name: str = "agent",
        capabilities: Path | None = None,
        extra: Sequence[str] = (),
        unlisted: Sequence[Host] = (),
        env: Mapping[str, str] | None = None,
    ) -> AgentProcess:
        """``capabilities``: another capabilities file (a test's own windows); ``extra``: more flags;
        ``unlisted``: hosts without an inventory entry; ``env``: more environment variables."""
        runs = runs_dir or tmp_path / f"runs-{name}"
        port = kubelab_mcm.free_port()
        inventory = write_inventory(lab, tmp_path / f"inventory-{name}.yaml", unlisted)
        argv = agent_argv(kubelab_mcm, lab, inventory, runs, capabilities or e2e_capabilities, port, extra)
        agent = AgentProcess(argv, tmp_path / f"{name}.log", port, runs, env)
        started.append(agent)
        return agent

    yield start
    for agent in started:
        agent.stop()
    for runs in {a.runs_dir for a in started}:
        _wait_for_orphans(runs)
        close_control_masters(runs)
