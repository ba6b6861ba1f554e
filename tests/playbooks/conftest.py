"""Fixtures of the playbook tests on lab hosts."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from hostlab.lab import Host, Lab

from .standins import install_standins, lab_run_on_host
from .support import WRAPPER


@pytest.fixture(scope="session", autouse=True)
def _fork_server() -> Iterator[None]:
    """The plays of these tests run through one fork server, retired at the session's end."""
    yield
    WRAPPER.close()


@pytest.fixture
def host(lab: Lab, lab_hosts: list[Host]) -> Host:
    """A fresh lab host with the Kubernetes stand-ins at v1.30.2 (test_os_update.py has its own: a host
    with the OS update stand-ins)."""
    install_standins(lab_run_on_host(lab, lab_hosts[0]), version="v1.30.2")
    return lab_hosts[0]


@pytest.fixture
def sentinel() -> Iterator[str]:
    """A fresh path the injection payloads create if they are ever evaluated (on the controller or the
    host); removed after the test."""
    path = f"/tmp/inplace-sentinel-{uuid.uuid4().hex[:12]}"
    yield path
    Path(path).unlink(missing_ok=True)
