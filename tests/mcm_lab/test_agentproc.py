"""The agent subprocess helper itself (no lab): an agent that does not start leaves nothing behind."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import pytest

from .agentproc import AgentProcess


def open_here(path: Path) -> bool:
    """This process has ``path`` open."""
    return any(fd.resolve() == path.resolve() for fd in Path("/proc/self/fd").iterdir())


def test_an_agent_that_exits_at_start_leaves_its_log_closed(tmp_path: Path) -> None:
    with socket.socket() as probe:  # a port nothing listens on: the agent never answers /healthz
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    log = tmp_path / "agent.log"
    argv = [sys.executable, "-c", "print('bad flag'); raise SystemExit(2)"]
    with pytest.raises(AssertionError, match="mcm-agent exited: bad flag"):
        AgentProcess(argv, log, port, tmp_path / "runs")
    assert not open_here(log)
