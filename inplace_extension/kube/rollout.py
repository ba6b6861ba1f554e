"""The management cluster as ``status`` reads it: an owner (MachineDeployment, MachineSet,
KubeadmControlPlane or Cluster), its Machines (by the label CAPI puts on each Machine of that owner) and
the Events about Machines in its namespace, as plain dicts: read once (:meth:`RolloutReader.snapshot`),
or listed and then watched, a new snapshot after each change (:meth:`RolloutReader.watch`). Read-only:
get, list and watch; nothing is written.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from lightkube import AsyncClient
from lightkube.resources.core_v1 import Event

from inplace_extension.kube.client import connect_async, list_then_watch, plain, translated
from inplace_extension.kube.errors import NotFound
from inplace_extension.kube.machines import MACHINE
from inplace_extension.kube.objects import resource_of
from inplace_extension.kube.port import ObjectQuery

# the owners whose Machines ``status`` shows: their API version, and the label CAPI sets on each of
# their Machines to the owner's name
OWNERS: Final = {
    "MachineDeployment": ("cluster.x-k8s.io/v1beta2", "cluster.x-k8s.io/deployment-name"),
    "MachineSet": ("cluster.x-k8s.io/v1beta2", "cluster.x-k8s.io/set-name"),
    "KubeadmControlPlane": ("controlplane.cluster.x-k8s.io/v1beta2", "cluster.x-k8s.io/control-plane-name"),
    "Cluster": ("cluster.x-k8s.io/v1beta2", "cluster.x-k8s.io/cluster-name"),
}


@dataclass(frozen=True)
class Owner:
    kind: str  # a key of OWNERS
    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.kind} {self.namespace}/{self.name}"

    @property
    def label(self) -> str:
        return OWNERS[self.kind][1]


@dataclass(frozen=True)
class Snapshot:
    """The owner's Machines and the Events about Machines of its namespace, as read at one moment."""

    machines: tuple[dict[str, Any], ...]
    events: tuple[dict[str, Any], ...]


class RolloutReader:
    """Reads an owner's rollout over one asynchronous client."""

    def __init__(self, client: AsyncClient) -> None:
        self._client = client

    async def owner_exists(self, owner: Owner) -> bool:
        api_version = OWNERS[owner.kind][0]
        resource = resource_of(ObjectQuery(api_version, owner.kind, owner.namespace, owner.name))
        try:
            with translated(f"get {owner}"):
                await self._client.get(resource, owner.name, namespace=owner.namespace)
        except NotFound:
            return False
        return True

    async def snapshot(self, owner: Owner) -> Snapshot:
        with translated(f"list the Machines of {owner}"):
            machines = [
                plain(obj)
                async for obj in self._client.list(
                    MACHINE, namespace=owner.namespace, labels={owner.label: owner.name}
                )
            ]
        fields: dict[str, Any] = {"involvedObject.kind": "Machine"}
        with translated(f"list the Events about Machines in {owner.namespace}"):
            events = [
                plain(obj) async for obj in self._client.list(Event, namespace=owner.namespace, fields=fields)
            ]
        return Snapshot(tuple(machines), tuple(events))

    async def watch(self, owner: Owner) -> AsyncIterator[Snapshot]:
        """A snapshot once both kinds are listed, then one after each change (changes that arrive
        together make one); never ends. Each kind is watched (``client.list_then_watch``: listed again
        after an outage), so nothing is read again while nothing changes."""
        changes: asyncio.Queue[tuple[str, str, list[dict[str, Any]]]] = asyncio.Queue()

        async def feed(kind: str, resource: Any) -> None:
            async for event, objects in list_then_watch(self._client, resource, owner.namespace):
                await changes.put((kind, event, objects))

        held: dict[str, dict[str, dict[str, Any]]] = {"Machine": {}, "Event": {}}
        listed: set[str] = set()
        tasks = [
            asyncio.create_task(feed("Machine", MACHINE)),
            asyncio.create_task(feed("Event", Event)),
        ]
        try:
            while True:
                change = await changes.get()
                while True:  # what arrived together is one redraw
                    kind, event, objects = change
                    _apply(held[kind], event, objects)
                    if event == "LISTED":
                        listed.add(kind)
                    try:
                        change = changes.get_nowait()
                    except asyncio.QueueEmpty:
                        break
                if listed == set(held):
                    yield _snapshot(owner, held)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def close(self) -> None:
        await self._client.close()


def _key(obj: dict[str, Any]) -> str:
    metadata = obj.get("metadata") or {}
    return str(metadata.get("uid") or metadata.get("name"))


def _apply(held: dict[str, dict[str, Any]], event: str, objects: list[dict[str, Any]]) -> None:
    if event == "LISTED":
        held.clear()
    for obj in objects:
        if event == "DELETED":
            held.pop(_key(obj), None)
        else:
            held[_key(obj)] = obj


def _snapshot(owner: Owner, held: dict[str, dict[str, dict[str, Any]]]) -> Snapshot:
    machines = [
        m
        for m in held["Machine"].values()
        if ((m.get("metadata") or {}).get("labels") or {}).get(owner.label) == owner.name
    ]
    events = [e for e in held["Event"].values() if (e.get("involvedObject") or {}).get("kind") == "Machine"]
    return Snapshot(tuple(machines), tuple(events))


def connect_rollout(kubeconfig: Path | None) -> RolloutReader:
    """``status``'s reader (``--kubeconfig``, ``$KUBECONFIG`` or the in-cluster account); a bad config
    raises KubeConfigError."""
    return RolloutReader(connect_async(kubeconfig))
