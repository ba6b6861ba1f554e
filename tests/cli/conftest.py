"""CLI fixtures: run ``python -m inplace_extension`` as a subprocess in a clean environment; stop by PID."""

from __future__ import annotations

import os
import queue
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from hostlab.proc import stop_child

ROOT = Path(__file__).resolve().parent.parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "capi"
SERVING = re.compile(r"serving (https?://127\.0\.0\.1:\d+)")


def clean_env(state: Path) -> dict[str, str]:
    """The caller's environment without INPLACE_* settings; state (runs, dev TLS) under ``state``."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("INPLACE_")}
    env["XDG_STATE_HOME"] = str(state)
    return env


def run_cli(*args: str, env: dict[str, str], stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "inplace_extension", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        input=stdin,
        timeout=60,
        check=False,
    )


# beside a cold Go build and the other workers (scripts/test overlaps them) a start took over 30 s at
# load 16-31: the deadline is for a server that never announces, not for a slow one
START_SECONDS = 120


@dataclass
class Server:
    url: str
    proc: subprocess.Popen[str]
    output: list[str]


@pytest.fixture
def start_server(tmp_path: Path) -> Iterator[object]:
    """Start ``serve`` with the given flags; returns a Server once it printed its URL (deadline
    START_SECONDS)."""
    started: list[tuple[subprocess.Popen[str], threading.Thread]] = []

    def start(*flags: str) -> Server:
        proc = subprocess.Popen(
            [sys.executable, "-m", "inplace_extension", "serve", *flags],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=clean_env(tmp_path / "state"),
            cwd=ROOT,
        )
        lines: queue.Queue[str] = queue.Queue()
        output: list[str] = []

        def pump() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                lines.put(line)

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        started.append((proc, reader))
        deadline = time.monotonic() + START_SECONDS
        while time.monotonic() < deadline:
            try:
                line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
            output.append(line)
            match = SERVING.search(line)
            if match:
                return Server(match.group(1), proc, output)
        raise AssertionError("server did not announce its URL:\n" + "".join(output))

    yield start
    for proc, reader in started:  # by PID, never by name
        stop_child(proc, 15)
        reader.join(timeout=10)  # the pipe reaches EOF once the process is gone
        if proc.stdout is not None:
            proc.stdout.close()
