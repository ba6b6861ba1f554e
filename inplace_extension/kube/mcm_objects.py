"""machine-controller-manager's objects in the control cluster (``machine.sapcloud.io/v1alpha1``), read
only, as plain dicts: Machines, MachineSets, MachineDeployments, MachineClasses of one namespace, and
the Secrets MachineClasses name (the AWS credentials the agent tags instances with)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, Final

from lightkube import AsyncClient
from lightkube.generic_resource import create_namespaced_resource
from lightkube.resources.core_v1 import Secret

from inplace_extension.kube.client import list_then_watch, plain, translated
from inplace_extension.kube.errors import NotFound

GROUP: Final = "machine.sapcloud.io"
VERSION: Final = "v1alpha1"

Machine = create_namespaced_resource(GROUP, VERSION, "Machine", "machines")
MachineSet = create_namespaced_resource(GROUP, VERSION, "MachineSet", "machinesets")
MachineDeployment = create_namespaced_resource(GROUP, VERSION, "MachineDeployment", "machinedeployments")
MachineClass = create_namespaced_resource(GROUP, VERSION, "MachineClass", "machineclasses")

# generic (MCM) and typed (Secret) resources: one lookup for both, lightkube overloads on the type
KINDS: Final[dict[str, Any]] = {
    "Machine": Machine,
    "MachineSet": MachineSet,
    "MachineDeployment": MachineDeployment,
    "MachineClass": MachineClass,
    "Secret": Secret,
}


async def get(client: AsyncClient, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
    """One object by kind name (a key of KINDS), or None when it does not exist."""
    try:
        with translated(f"get {kind} {namespace}/{name}"):
            return plain(await client.get(KINDS[kind], name, namespace=namespace))
    except NotFound:
        return None


async def list_all(client: AsyncClient, kind: str, namespace: str) -> list[dict[str, Any]]:
    with translated(f"list {kind} in {namespace}"):
        return [plain(obj) async for obj in client.list(KINDS[kind], namespace=namespace)]


def watch(
    client: AsyncClient, kind: str, namespace: str, connected: asyncio.Event | None = None
) -> AsyncIterator[tuple[str, list[dict[str, Any]]]]:
    """``("LISTED", all)`` after each (re)connect, then each change (see ``client.list_then_watch``)."""
    return list_then_watch(client, KINDS[kind], namespace, connected)
