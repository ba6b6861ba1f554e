"""Fixtures of the Kubernetes adapter tests: CAPI's Machine CRD in the kubelab, Machines, a client, and
the fake play of the tests that run a RunService against the lab (held until the test releases it)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from kubelab import manifests
from kubelab.flavours import capi_objects as co
from kubelab.lab import Lab
from runs.fakes import FakeRunner

from inplace_extension.kube.client import connect
from inplace_extension.runs import runner as runner_mod

MACHINES_CRD = "cluster.x-k8s.io_machines.yaml"


@pytest.fixture
def client(kubelab: Lab) -> Iterator[Any]:
    c = connect(kubelab.kubeconfig)
    yield c
    c.close()


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeRunner:
    """runner.start replaced by a fake whose every batch waits on its gate."""
    fake = FakeRunner(gate=threading.Event())
    monkeypatch.setattr(runner_mod, "start", fake.start)
    return fake


@pytest.fixture(scope="module")
def with_machines(kubelab: Lab) -> Lab:
    manifests.install_crds(kubelab, [manifests.capi_crd(kubelab, MACHINES_CRD)], only_missing=True)
    return kubelab


def create_machine(
    lab: Lab, namespace: str, name: str, addresses: list[dict[str, str]], node: str | None
) -> dict[str, Any]:
    """A v1beta2 Machine with the given status (set through the status subresource, as CAPI does)."""
    return co.machine_with_status(lab, namespace, name, addresses, node)
