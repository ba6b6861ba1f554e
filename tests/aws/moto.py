"""moto's own server (``moto_server`` from the ``moto[server]`` dev dependency), the AWS API emulator of
the tests: a process on 127.0.0.1 at a free port until the block ends, stopped by its PID; for the tests
that need them, the requests it received (moto's own recorder) and an outage that keeps its state."""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from hostlab.proc import stop_child
from kubelab.ports import free_port

START_SECONDS = 60.0


@dataclass(frozen=True)
class MotoServer:
    url: str
    pid: int
    recording: Path | None  # moto's recorder file (every request it received), when asked for

    @contextmanager
    def outage(self) -> Iterator[None]:
        """The API answers nothing until the block ends: the process is stopped (SIGSTOP) and continued
        (SIGCONT). The kernel still accepts connections on its port, so a client sees what a hung AWS
        endpoint does (connected, no answer: its read timeout); moto's state in memory (instances,
        tags) is kept, which a restart of the server would lose."""
        os.kill(self.pid, signal.SIGSTOP)
        try:
            yield
        finally:
            os.kill(self.pid, signal.SIGCONT)

    def requests(self, action: str) -> list[dict[str, list[str]]]:
        """The form parameters of each query-protocol request (EC2's) for ``action`` it received, oldest
        first; needs ``record=True``."""
        assert self.recording is not None, "moto_server(record=True) records the requests"
        found: list[dict[str, list[str]]] = []
        lines = self.recording.read_text().splitlines() if self.recording.exists() else []
        for line in lines:
            entry = json.loads(line)
            body = entry.get("body") or ""
            if entry.get("body_encoded"):
                body = base64.b64decode(body).decode()
            params = urllib.parse.parse_qs(body)
            if params.get("Action") == [action]:
                found.append(params)
        return found


@contextmanager
def moto_server(log: Path, record: bool = False) -> Iterator[MotoServer]:
    """The server once it answers; its output in ``log``; ``record``: moto's recorder writes every
    request to a file beside the log (``MotoServer.requests``)."""
    port = free_port()
    server = Path(sys.executable).with_name("moto_server")
    recording = log.with_name(f"{log.stem}-requests.jsonl") if record else None
    env = dict(os.environ)
    if recording is not None:
        env.update(MOTO_ENABLE_RECORDING="true", MOTO_RECORDER_FILEPATH=str(recording))
    with log.open("w") as out:
        proc = subprocess.Popen(
            [str(server), "-H", "127.0.0.1", "-p", str(port)], stdout=out, stderr=subprocess.STDOUT, env=env
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
        yield MotoServer(url, proc.pid, recording)
    finally:
        stop_child(proc, 10)
