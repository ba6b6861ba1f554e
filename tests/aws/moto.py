"""moto's own server (``moto_server`` from the ``moto[server]`` dev dependency), the AWS API emulator of
the tests: a process on 127.0.0.1 at a free port until the block ends, stopped by its PID."""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from hostlab.proc import stop_child
from kubelab.ports import free_port

START_SECONDS = 60.0


@contextmanager
def moto_server(log: Path) -> Iterator[str]:
    """The server's URL once it answers; its output in ``log``."""
    port = free_port()
    server = Path(sys.executable).with_name("moto_server")
    with log.open("w") as out:
        proc = subprocess.Popen(
            [str(server), "-H", "127.0.0.1", "-p", str(port)], stdout=out, stderr=subprocess.STDOUT
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_SECONDS
        while True:
            try:
                with urllib.request.urlopen(f"{url}/moto-api/", timeout=2):  # noqa: S310 (loopback URL of ours)
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"moto_server did not start: {log.read_text()[-2000:]}") from None
                time.sleep(0.2)  # polling a condition with a deadline, not synchronisation by time
        yield url
    finally:
        stop_child(proc, 10)
