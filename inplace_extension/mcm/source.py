"""Reading the desired state of a Node's update from the control cluster (the path is documented in
:mod:`inplace_extension.mcm.desired`; this module only fetches the objects along it).

The objects come from a local copy of one namespace's Machines, MachineSets, MachineDeployments and
MachineClasses, kept by a list-then-watch per kind (:meth:`DesiredStates.run`): a poll of a running
update reads nothing from the API server, and a MachineClass's plan for a Node is made once per
resourceVersion of that MachineClass. An object the copy does not have yet (a watch event still on its
way) is read directly once before the answer says it is missing.

The same walk finds the operator's hold: the pause annotation on the MachineDeployment it passes
through (:mod:`inplace_extension.runs.holds`), so a pause costs no read either and is seen as soon as
the deployment's watch event arrives.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from inplace_extension.inplace.custom import NO_CUSTOM, CustomTable
from inplace_extension.inplace.plan import Plan
from inplace_extension.kube.errors import Unreachable
from inplace_extension.kube.port import ControlCluster
from inplace_extension.mcm.aws_tags import TagsTarget, tags_target
from inplace_extension.mcm.desired import (
    MACHINE_NAME_LABEL,
    DesiredStateError,
    class_name,
    controller_owner,
    current_machine_set,
    parse_spec,
    plan_for,
)
from inplace_extension.runs import holds
from inplace_extension.runs.model import Hold

log = logging.getLogger(__name__)

KINDS: Final = ("Machine", "MachineSet", "MachineDeployment", "MachineClass")
SYNC_TIMEOUT_SECONDS: Final = 10.0


def _name(obj: Mapping[str, Any]) -> str:
    return str(obj.get("metadata", {}).get("name", ""))


def _version(obj: Mapping[str, Any]) -> str:
    return str(obj.get("metadata", {}).get("resourceVersion", ""))


@dataclass(frozen=True)
class Desired:
    """Where a Node's update should go (``plan``) and whether an operator holds it (``hold``: the pause
    annotation on the Node's MachineDeployment)."""

    plan: Plan
    hold: Hold | None = None
    tags: TagsTarget | None = None  # an AWS MachineClass's tags for the Node's instance (mcm/aws_tags.py)


class DesiredStates:
    """The desired state of each Node's update, from the watched copy of MCM's objects."""

    def __init__(
        self,
        control: ControlCluster,
        namespace: str,
        custom: CustomTable = NO_CUSTOM,
        on_deployment: Callable[[], None] = lambda: None,
    ) -> None:
        """``on_deployment``: called on every change of a MachineDeployment (a pause set or removed)."""
        self._control = control
        self._on_deployment = on_deployment
        self._namespace = namespace
        self._custom = custom
        self._objects: dict[str, dict[str, dict[str, Any]]] = {kind: {} for kind in KINDS}
        self._listed = {kind: asyncio.Event() for kind in KINDS}
        self._plans: dict[tuple[str, str, str], Plan] = {}  # (MachineClass, its resourceVersion, Node)

    async def run(self) -> None:
        """Keep the copy current until cancelled (one watch per kind)."""
        async with asyncio.TaskGroup() as group:
            for kind in KINDS:
                group.create_task(self._follow(kind), name=f"watch {kind}")

    async def _follow(self, kind: str) -> None:
        store = self._objects[kind]
        async for event, objects in self._control.watch(kind, self._namespace):
            if event == "LISTED":
                store.clear()
                self._listed[kind].set()
            for obj in objects:
                if event == "DELETED":
                    store.pop(_name(obj), None)
                else:
                    store[_name(obj)] = obj
            if kind == "MachineDeployment":
                self._on_deployment()

    async def desired_for(self, node: Mapping[str, Any]) -> Desired:
        """Node -> Machine -> MachineSet -> MachineDeployment (its hold) -> current MachineSet ->
        MachineClass -> plan."""
        await self._synced()
        metadata = node.get("metadata", {})
        node_name = str(metadata.get("name", ""))
        machine_name = (metadata.get("labels") or {}).get(MACHINE_NAME_LABEL)
        machine = await self._get(
            "Machine", machine_name, f"Node {node_name} has no label {MACHINE_NAME_LABEL}"
        )
        owner_set = await self._get(
            "MachineSet", controller_owner(machine, "MachineSet"), f"Machine {machine_name} has no MachineSet"
        )
        deployment = await self._get(
            "MachineDeployment",
            controller_owner(owner_set, "MachineDeployment"),
            f"MachineSet {_name(owner_set)} has no MachineDeployment",
        )
        current = current_machine_set(deployment, list(self._objects["MachineSet"].values()))
        if current is None:  # a new MachineSet whose watch event is still on its way: read them once
            current = current_machine_set(
                deployment, await self._control.list_all("MachineSet", self._namespace)
            )
        if current is None:
            raise DesiredStateError(
                "NoDesiredState", f"MachineDeployment {_name(deployment)} has no current MachineSet yet"
            )
        machine_class = await self._get("MachineClass", class_name(current), "")
        key = (_name(machine_class), _version(machine_class), node_name)
        plan = self._plans.get(key)
        if plan is None:
            plan = plan_for(parse_spec(machine_class), self._namespace, node_name, self._custom)
            self._plans = {k: v for k, v in self._plans.items() if k[0] != key[0] or k[1] == key[1]}
            self._plans[key] = plan
        owner = f"MachineDeployment {self._namespace}/{_name(deployment)}"
        hold = holds.hold_of(owner, deployment.get("metadata", {}).get("annotations"))
        return Desired(plan, hold, tags_target(machine_class, machine))

    async def _synced(self) -> None:
        try:
            async with asyncio.timeout(SYNC_TIMEOUT_SECONDS):
                for listed in self._listed.values():
                    await listed.wait()
        except TimeoutError:
            raise Unreachable("the control cluster's MCM objects could not be listed yet") from None

    async def _get(self, kind: str, name: str | None, why: str) -> dict[str, Any]:
        if name is None:
            raise DesiredStateError("NoDesiredState", why)
        obj = self._objects[kind].get(name)
        if obj is None:  # not in the copy yet: its watch event may still be on its way
            obj = await self._control.get(kind, self._namespace, name)
        if obj is None:
            raise DesiredStateError("NoDesiredState", f"{kind} {self._namespace}/{name} not found")
        return obj
