"""MCM objects for the ``mcm`` flavour's namespace: the userData Secret, MachineClasses and
MachineDeployments as the static-hosts machine controller expects them, and small queries on them.

MCM refuses to create a Machine whose class Secret lacks ``userData``; the static-hosts driver ignores
its content (the hosts exist already). ``providerSpec`` is free-form for this driver: it carries
whatever a node-side updater reads as the desired state.

A MachineClass's ``provider`` picks no driver: MCM's machine controller runs the one driver it was built
with (v0.62.1 reads the field nowhere) and handles every class of its namespace, so a class may say
``provider: AWS`` with an AWS credentials Secret for a node-side updater while the static-hosts driver
still backs its Machines by lab hosts.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from kubelab import objects, reads
from kubelab.flavours.mcm import NAMESPACE

if TYPE_CHECKING:
    from kubelab.lab import Lab

API_VERSION = "machine.sapcloud.io/v1alpha1"
PROVIDER = "static-hosts"
# kubectl resource names with their group: a lab with the capi flavour too has CAPI's Machine,
# MachineSet and MachineDeployment, which kubectl would pick for the short names
MACHINES = "machines.machine.sapcloud.io"
MACHINE_SETS = "machinesets.machine.sapcloud.io"
MACHINE_DEPLOYMENTS = "machinedeployments.machine.sapcloud.io"
USER_DATA_NAME = "static-hosts-userdata"


def secret() -> dict[str, Any]:
    user_data = base64.b64encode(b"# static hosts exist already; nothing to boot\n").decode()
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": USER_DATA_NAME, "namespace": NAMESPACE},
        "data": {"userData": user_data},
    }


def machine_class(
    name: str,
    provider_spec: Mapping[str, Any] | None = None,
    provider: str = PROVIDER,
    credentials_secret: str | None = None,
) -> dict[str, Any]:
    """``credentials_secret``: the name of a Secret of the namespace, the class's ``credentialsSecretRef``
    (MCM's machine controller reads it too: it must exist while the class has Machines)."""
    machine_class: dict[str, Any] = {
        "apiVersion": API_VERSION,
        "kind": "MachineClass",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "provider": provider,
        "providerSpec": dict(provider_spec or {}),
        "secretRef": {"name": USER_DATA_NAME, "namespace": NAMESPACE},
    }
    if credentials_secret is not None:
        machine_class["credentialsSecretRef"] = {"name": credentials_secret, "namespace": NAMESPACE}
    return machine_class


def machine_deployment(
    name: str,
    machine_class_name: str,
    replicas: int,
    orchestration: str = "Auto",
    max_unavailable: int = 1,
    annotations: Mapping[str, str] | None = None,
    in_place_timeout: str = "10m",
) -> dict[str, Any]:
    """An in-place MachineDeployment as an in-place pool needs it: maxSurge 0 (the hosts are fixed),
    ``disableHealthTimeout`` (a failed update must not get the Machine replaced)."""
    template_meta: dict[str, Any] = {"labels": {"name": name}}
    if annotations:
        template_meta["annotations"] = dict(annotations)
    return {
        "apiVersion": API_VERSION,
        "kind": "MachineDeployment",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"name": name}},
            "strategy": {
                "type": "InPlaceUpdate",
                "inPlaceUpdate": {
                    "orchestrationType": orchestration,
                    "maxSurge": 0,
                    "maxUnavailable": max_unavailable,
                },
            },
            "template": {
                "metadata": template_meta,
                "spec": {
                    "class": {"kind": "MachineClass", "name": machine_class_name},
                    "creationTimeout": "5m",
                    "drainTimeout": "3m",
                    "inPlaceUpdateTimeout": in_place_timeout,
                    "disableHealthTimeout": True,
                },
            },
        },
    }


def listed(lab: Lab, kind: str, selector: str, namespace: str | None = NAMESPACE) -> list[dict[str, Any]]:
    """Objects of ``kind`` matching the label ``selector`` (in ``namespace``; None: cluster-scoped)."""
    return reads.list_objects(lab, kind, namespace, selector)


def machines(lab: Lab, deployment: str) -> list[dict[str, Any]]:
    """The Machines of a MachineDeployment (its template label ``name``)."""
    return listed(lab, MACHINES, f"name={deployment}")


def apply_pool(lab: Lab, deployment: dict[str, Any], *classes: dict[str, Any]) -> None:
    """The userData Secret, the classes, then the MachineDeployment."""
    objects.apply(lab, secret(), *classes, deployment)


def phase(machine: Mapping[str, Any]) -> str:
    return str(machine.get("status", {}).get("currentStatus", {}).get("phase", ""))
