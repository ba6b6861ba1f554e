"""machine-controller-manager's objects in the control cluster (``machine.sapcloud.io/v1alpha1``), read
only, as plain dicts: Machines, MachineSets, MachineDeployments, MachineClasses of one namespace."""

from __future__ import annotations

from typing import Any, Final

from lightkube import AsyncClient
from lightkube.core.exceptions import ApiError
from lightkube.generic_resource import create_namespaced_resource

GROUP: Final = "machine.sapcloud.io"
VERSION: Final = "v1alpha1"

Machine = create_namespaced_resource(GROUP, VERSION, "Machine", "machines")
MachineSet = create_namespaced_resource(GROUP, VERSION, "MachineSet", "machinesets")
MachineDeployment = create_namespaced_resource(GROUP, VERSION, "MachineDeployment", "machinedeployments")
MachineClass = create_namespaced_resource(GROUP, VERSION, "MachineClass", "machineclasses")

KINDS: Final = {
    "Machine": Machine,
    "MachineSet": MachineSet,
    "MachineDeployment": MachineDeployment,
    "MachineClass": MachineClass,
}


def _plain(obj: Any) -> dict[str, Any]:
    result: dict[str, Any] = obj.to_dict()
    return result


async def get(client: AsyncClient, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
    """One object by kind name (a key of KINDS), or None when it does not exist."""
    try:
        obj = await client.get(KINDS[kind], name, namespace=namespace)
    except ApiError as exc:
        if exc.status.code == 404:
            return None
        raise
    return _plain(obj)


async def list_all(client: AsyncClient, kind: str, namespace: str) -> list[dict[str, Any]]:
    found = []
    async for obj in client.list(KINDS[kind], namespace=namespace):
        found.append(_plain(obj))
    return found
