"""The AWS API emulator the AWS adapter is tested against: moto's own server (``moto_server`` from the
``moto[server]`` dev dependency), a process on 127.0.0.1 at a free port, stopped by its PID."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from hostlab.proc import stop_child
from kubelab.ports import free_port

START_SECONDS = 60.0


@pytest.fixture(scope="module")
def moto_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The emulator's URL; every test module gets a fresh one (moto keeps its state in memory)."""
    port = free_port()
    log = tmp_path_factory.mktemp("moto") / "moto_server.log"
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


@pytest.fixture
def ec2_endpoint(moto_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """boto3 talks to the emulator (its own AWS_ENDPOINT_URL_EC2 setting), never to AWS."""
    monkeypatch.setenv("AWS_ENDPOINT_URL_EC2", moto_url)
    for name in [n for n in os.environ if n.startswith(("AWS_PROFILE", "AWS_CONFIG_FILE"))]:
        monkeypatch.delenv(name)
    return moto_url
