"""Fixtures of the Kubernetes adapter tests: CAPI's Machine CRD in the kubelab, Machines, a client, the
fake play of the tests that run a RunService against the lab (held until the test releases it), and what
the tests read back of an object (its annotations, a Node's cordon)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from kubelab import manifests, objects
from kubelab.flavours import capi_objects as co
from kubelab.lab import Lab
from runs.fakes import FakeRunner

from inplace_extension.kube.client import connect
from inplace_extension.plays import runner as runner_mod

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


def annotations_of(lab: Lab, kind: str, name: str, ns: str | None = None) -> dict[str, str]:
    """The object's annotations as the API server has them now (none when it does not exist)."""
    return dict((objects.get(lab, kind, name, ns) or {}).get("metadata", {}).get("annotations", {}))


def unschedulable(lab: Lab, node: str) -> bool:
    """The Node is cordoned (spec.unschedulable)."""
    return bool((objects.get(lab, "node", node) or {}).get("spec", {}).get("unschedulable"))
