"""Reading the desired state of a Node's update from the control cluster (the path is documented in
:mod:`inplace_extension.mcm.desired`; this module only fetches the objects along it)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from inplace_extension.inplace.custom import NO_CUSTOM, CustomTable
from inplace_extension.inplace.plan import Plan
from inplace_extension.kube import mcm_objects
from inplace_extension.kube.client import KubeClient
from inplace_extension.mcm.desired import (
    MACHINE_NAME_LABEL,
    DesiredStateError,
    class_name,
    controller_owner,
    current_machine_set,
    parse_spec,
    plan_for,
)

__all__ = ["DesiredStateError", "desired_plan"]


async def _get(client: KubeClient, kind: str, namespace: str, name: str | None, why: str) -> dict[str, Any]:
    if name is None:
        raise DesiredStateError("NoDesiredState", why)
    obj = await mcm_objects.get(client, kind, namespace, name)
    if obj is None:
        raise DesiredStateError("NoDesiredState", f"{kind} {namespace}/{name} not found")
    return obj


async def desired_plan(
    control: KubeClient, namespace: str, node: Mapping[str, Any], custom: CustomTable = NO_CUSTOM
) -> Plan:
    """Node -> Machine -> MachineSet -> MachineDeployment -> current MachineSet -> MachineClass -> plan."""
    metadata = node.get("metadata", {})
    node_name = str(metadata.get("name", ""))
    machine_name = (metadata.get("labels") or {}).get(MACHINE_NAME_LABEL)
    machine = await _get(
        control, "Machine", namespace, machine_name, f"Node {node_name} has no label {MACHINE_NAME_LABEL}"
    )
    owner_set = await _get(
        control, "MachineSet", namespace, controller_owner(machine, "MachineSet"),
        f"Machine {machine_name} has no MachineSet",
    )  # fmt: skip
    deployment = await _get(
        control, "MachineDeployment", namespace, controller_owner(owner_set, "MachineDeployment"),
        f"MachineSet {owner_set['metadata']['name']} has no MachineDeployment",
    )  # fmt: skip
    machine_sets = await mcm_objects.list_all(control, "MachineSet", namespace)
    current = current_machine_set(deployment, machine_sets)
    if current is None:
        raise DesiredStateError(
            "NoDesiredState",
            f"MachineDeployment {deployment['metadata']['name']} has no current MachineSet yet",
        )
    machine_class = await _get(control, "MachineClass", namespace, class_name(current), "")
    return plan_for(parse_spec(machine_class), namespace, node_name, custom)
