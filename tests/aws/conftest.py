"""The AWS API emulator the AWS adapter is tested against: moto's own server (``moto_server`` from the
``moto[server]`` dev dependency), a process on 127.0.0.1 at a free port, stopped by its PID."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from .moto import moto_server


@pytest.fixture(scope="module")
def moto_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The emulator's URL; every test module gets a fresh one (moto keeps its state in memory)."""
    with moto_server(tmp_path_factory.mktemp("moto") / "moto_server.log") as server:
        yield server.url


@pytest.fixture
def ec2_endpoint(moto_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """boto3 talks to the emulator (its own AWS_ENDPOINT_URL_EC2 setting), never to AWS."""
    monkeypatch.setenv("AWS_ENDPOINT_URL_EC2", moto_url)
    for name in [n for n in os.environ if n.startswith(("AWS_PROFILE", "AWS_CONFIG_FILE"))]:
        monkeypatch.delenv(name)
    return moto_url
