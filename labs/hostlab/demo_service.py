"""The service the demo drives: ``inplace-extension serve`` on loopback with the lab's inventory.

Started as a subprocess on a free port (read from its ``serving URL`` line), stopped with SIGTERM at
the end, and its ControlPersist ssh masters closed so no ssh process outlives the demo.
"""

from __future__ import annotations

import contextlib
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from hostlab.errors import DemoError
from hostlab.lab import Lab
from hostlab.proc import stop_child

SERVING_RE = re.compile(r"serving (http://127\.0\.0\.1:\d+)")


@dataclass
class Service:
    proc: subprocess.Popen[bytes]
    url: str
    log_path: Path


@contextlib.contextmanager
def running_service(inventory: Path, lab: Lab, workdir: Path, retry_after: int) -> Iterator[Service]:
    log_path = workdir / "service.log"
    flags = {
        "--listen": "127.0.0.1:0",
        "--inventory": str(inventory),
        "--allowed-cidrs": str(lab.network),
        "--runs-dir": str(workdir / "runs"),
        "--retry-after-seconds": str(retry_after),
    }
    pairs = [arg for flag in flags.items() for arg in flag]
    argv = [sys.executable, "-m", "inplace_extension", "serve", "--plain-http", *pairs]
    with log_path.open("ab") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not (match := SERVING_RE.search(log_path.read_text(errors="replace"))):
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-20:])
                raise DemoError(f"the service did not start (see {log_path}):\n{tail}")
            time.sleep(0.05)
        yield Service(proc, match.group(1), log_path)
    finally:
        stop_child(proc, 20)
        _close_run_ssh_masters(workdir / "runs")


def _close_run_ssh_masters(runs_dir: Path) -> None:
    """End the service's ControlPersist ssh masters (they would linger for a minute after the runs)."""
    try:
        from inplace_extension.plays.ssh import close_control_masters
    except ImportError:  # hostlab runs without the service installed too
        return
    close_control_masters(runs_dir)
