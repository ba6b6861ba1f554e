"""Fixtures of the Kubernetes adapter tests: CAPI's Machine CRD in the kubelab, Machines, a client."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from kubelab import manifests, objects
from kubelab.lab import Lab

from inplace_extension.kube.client import connect

MACHINES_CRD = "cluster.x-k8s.io_machines.yaml"


@pytest.fixture
def client(kubelab: Lab) -> Iterator[Any]:
    c = connect(kubelab.kubeconfig)
    yield c
    c.close()


@pytest.fixture(scope="module")
def with_machines(kubelab: Lab) -> Lab:
    manifests.install_crds(kubelab, [manifests.capi_crd(kubelab, MACHINES_CRD)], only_missing=True)
    return kubelab


def create_machine(
    lab: Lab, namespace: str, name: str, addresses: list[dict[str, str]], node: str | None
) -> dict[str, Any]:
    """A v1beta2 Machine with the given status (set through the status subresource, as CAPI does)."""
    objects.ensure_namespace(lab, namespace)
    objects.apply(
        lab,
        {
            "apiVersion": "cluster.x-k8s.io/v1beta2",
            "kind": "Machine",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "clusterName": "c1",
                "bootstrap": {"dataSecretName": f"{name}-bootstrap"},
                "infrastructureRef": {
                    "apiGroup": "infrastructure.cluster.x-k8s.io",
                    "kind": "DockerMachine",
                    "name": name,
                },
            },
        },
    )
    status: dict[str, Any] = {"addresses": addresses}
    if node is not None:
        status["nodeRef"] = {"name": node}
    lab.kubectl(
        "patch", "machine.cluster.x-k8s.io", name, "-n", namespace, "--subresource=status",
        "--type=merge", "-p", json.dumps({"status": status}),
    )  # fmt: skip
    machine = objects.get(lab, "machine.cluster.x-k8s.io", name, namespace)
    assert machine is not None
    return machine
