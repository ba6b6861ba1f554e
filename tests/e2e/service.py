"""``inplace-extension serve`` as a subprocess on loopback, and the command lines that start it, for the
tests and the benches."""

from __future__ import annotations

import re
import signal
import ssl
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import httpx
from hostlab.proc import stop_child

REPO = Path(__file__).resolve().parents[2]
SERVING_RE = re.compile(r"serving (https?)://127\.0\.0\.1:(\d+)")
# the service's imports take about 1 s of CPU, but beside a parallel run's labs on 2 shared cores a cold
# start was seen to take over 30 s of wall time
START_TIMEOUT = 120.0


SERVE_COMMAND = (sys.executable, "-m", "inplace_extension", "serve")  # this checkout's, by this Python


def loopback_serve_argv(*flags: str) -> list[str]:
    """``inplace-extension serve`` over plain HTTP on a free loopback port (the port in its "serving" line),
    with ``flags``: the one command line the tests and the benches start the service with, unless they
    need TLS."""
    return [*SERVE_COMMAND, "--listen", "127.0.0.1:0", "--plain-http", *flags]


def serve_argv(inventory: Path, allowed_cidrs: str, runs_dir: Path, *extra: str) -> list[str]:
    """:func:`loopback_serve_argv` for the lab's hosts: the ``inventory``, the hosts' network as
    ``--allowed-cidrs``, ``--retry-after-seconds 1`` (a test polls again at once) and the ``extra`` flags."""
    return loopback_serve_argv(
        "--inventory",
        str(inventory),
        "--allowed-cidrs",
        allowed_cidrs,
        "--runs-dir",
        str(runs_dir),
        "--retry-after-seconds",
        "1",
        *extra,
    )


class Service:
    """``inplace-extension serve`` in a subprocess on loopback: plain HTTP, or TLS trusted through ``ca``."""

    def __init__(self, argv: Sequence[str], log_path: Path, runs_dir: Path, ca: Path | None = None) -> None:
        self.log_path = log_path
        self.runs_dir = runs_dir
        self._log = log_path.open("ab")
        self.proc = subprocess.Popen(
            list(argv), stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=REPO
        )
        deadline = time.monotonic() + START_TIMEOUT
        try:
            while not (match := SERVING_RE.search(self.log())):
                assert self.proc.poll() is None, f"service exited: {self.log()}"
                assert time.monotonic() < deadline, f"service did not start: {self.log()}"
                time.sleep(0.05)
        except BaseException:
            # the caller never gets this object to stop it: a service that did not start must not outlive us
            self.proc.kill()
            self.proc.wait(10)
            self._log.close()
            raise
        self.url = f"{match.group(1)}://127.0.0.1:{match.group(2)}"
        verify: ssl.SSLContext | bool = ssl.create_default_context(cafile=str(ca)) if ca else True
        self.client = httpx.Client(base_url=self.url, timeout=15, verify=verify)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def kill(self) -> None:
        """SIGKILL, as an OOM kill or a node failure would."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)
        self.client.close()
        self._log.close()

    def stop(self) -> None:
        stop_child(self.proc, 15)
        self.client.close()
        self._log.close()
