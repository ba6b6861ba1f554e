"""machine-controller-manager's objects in the control cluster (``machine.sapcloud.io/v1alpha1``), read
only, as plain dicts: Machines, MachineSets, MachineDeployments, MachineClasses of one namespace, the
Secrets MachineClasses name (the AWS credentials the agent tags instances with), and the target
cluster's Nodes of a MachineDeployment's Machines (``plan --machines-of mcd/NAME``)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Final

from lightkube import AsyncClient
from lightkube.generic_resource import create_namespaced_resource
from lightkube.operators import in_
from lightkube.resources.core_v1 import Node, Secret

from inplace_extension.kube.client import connect, list_then_watch, plain, translated
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


# MCM labels each Node with its Machine's name (the MCM agent finds a Node's Machine by it, mcm/desired.py)
NODE_MACHINE_LABEL: Final = "node.gardener.cloud/machine-name"


def deployment_nodes(
    control: Path | None, target: Path | None, namespace: str, name: str
) -> tuple[list[str], list[dict[str, Any]]] | None:
    """``plan --machines-of mcd/NAME``: the names of the Machines of MCM MachineDeployment
    ``namespace/name`` in the control cluster (``control``'s; those its ``spec.selector.matchLabels``
    select, as MCM's MachineSets select theirs) and the Nodes of the target cluster (``target``'s) that
    carry one of those names in :data:`NODE_MACHINE_LABEL`, as plain dicts; None when there is no such
    MachineDeployment. Get and list only; a bad config raises KubeConfigError."""
    client = connect(control)
    nodes_client = client if target == control else connect(target)
    try:
        with translated(f"get MachineDeployment {namespace}/{name}"):
            deployment = plain(client.get(MachineDeployment, name, namespace=namespace))
        selector = ((deployment.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
        if not selector:  # MCM refuses a MachineDeployment without one; selecting everything is wrong
            return [], []
        with translated(f"list the Machines of MachineDeployment {namespace}/{name}"):
            machines = sorted(
                str(plain(obj)["metadata"]["name"])
                for obj in client.list(Machine, namespace=namespace, labels=dict(selector))
            )
        if not machines:
            return [], []
        with translated("list the Nodes"):
            listed = nodes_client.list(Node, labels={NODE_MACHINE_LABEL: in_(machines)})
            nodes = [plain(obj) for obj in listed]
        return machines, nodes
    except NotFound:
        return None
    finally:
        client.close()
        if nodes_client is not client:
            nodes_client.close()
