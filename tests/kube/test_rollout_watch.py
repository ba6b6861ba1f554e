"""``status --watch``'s reader (``kube.rollout.RolloutReader.watch``) over a scripted list-then-watch loop:
one snapshot once both kinds are listed, then one per batch of changes the watches bring (none while
nothing changes: it never lists again on its own), the owner's Machines only, Events about Machines only.
tests/kube/test_kube_rollout.py runs it against the real API server."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from inplace_extension.kube import rollout
from inplace_extension.kube.machines import MACHINE
from inplace_extension.kube.rollout import Owner, RolloutReader, Snapshot

pytestmark = pytest.mark.anyio
LABEL = "cluster.x-k8s.io/deployment-name"


def machine(name: str, deployment: str, version: str) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "uid": f"u-{name}",
            "labels": {LABEL: deployment},
            "resourceVersion": version,
        }
    }


def event(name: str, kind: str, reason: str) -> dict[str, Any]:
    return {
        "metadata": {"name": f"{name}.{reason}", "uid": f"e-{name}-{reason}"},
        "involvedObject": {"kind": kind, "name": name},
        "reason": reason,
    }


class Script:
    """The list-then-watch loop per kind, fed by the test; counts how often each kind was listed."""

    def __init__(self) -> None:
        self.feeds: dict[str, asyncio.Queue[tuple[str, list[dict[str, Any]]]]] = {
            "Machine": asyncio.Queue(),
            "Event": asyncio.Queue(),
        }
        self.started: list[str] = []

    async def loop(
        self, _client: Any, resource: Any, namespace: str | None = None
    ) -> AsyncIterator[tuple[str, list[dict[str, Any]]]]:
        kind = "Machine" if resource is MACHINE else "Event"
        self.started.append(f"{kind} in {namespace}")
        while True:
            yield await self.feeds[kind].get()


async def idle() -> None:
    """Let every task that can run (the reader's, its loops') run until all wait: nothing here waits on
    time or I/O, only on the test's queues."""
    for _ in range(50):
        await asyncio.sleep(0)


def shown(snapshot: Snapshot) -> tuple[list[str], list[str]]:
    machines = sorted(
        f"{m['metadata']['name']}@{m['metadata']['resourceVersion']}" for m in snapshot.machines
    )
    return machines, sorted(f"{e['involvedObject']['name']}:{e['reason']}" for e in snapshot.events)


async def test_a_snapshot_per_change_of_the_owners_machines_and_their_events(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    script = Script()
    monkeypatch.setattr(rollout, "list_then_watch", script.loop)
    reader = RolloutReader(client=None)  # type: ignore[arg-type]
    watch = aiter(reader.watch(Owner("MachineDeployment", "ns", "md-0")))
    machines, events = script.feeds["Machine"], script.feeds["Event"]
    await machines.put(
        ("LISTED", [machine("a", "md-0", "1"), machine("b", "md-0", "1"), machine("x", "md-1", "1")])
    )
    nothing = asyncio.ensure_future(anext(watch))
    await idle()
    assert not nothing.done(), "no snapshot before the Events are listed too"
    await events.put(("LISTED", [event("a", "Machine", "Queued"), event("node-1", "Node", "NodeReady")]))
    async with asyncio.timeout(5):
        assert shown(await nothing) == (["a@1", "b@1"], ["a:Queued"])
        await machines.put(("MODIFIED", [machine("b", "md-0", "2")]))
        assert shown(await anext(watch)) == (["a@1", "b@2"], ["a:Queued"])
        # changes that arrive together are one snapshot
        await events.put(("ADDED", [event("b", "Machine", "Running")]))
        await machines.put(("MODIFIED", [machine("x", "md-1", "2")]))
        await machines.put(("DELETED", [machine("a", "md-0", "3")]))
        assert shown(await anext(watch)) == (["b@2"], ["a:Queued", "b:Running"])
        # the watch came back after an outage: its new list replaces what was held
        await machines.put(("LISTED", [machine("b", "md-0", "5"), machine("c", "md-0", "5")]))
        assert shown(await anext(watch)) == (["b@5", "c@5"], ["a:Queued", "b:Running"])
    waiting = asyncio.ensure_future(anext(watch))
    await idle()
    assert not waiting.done(), "no snapshot without a change"
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    await watch.aclose()  # type: ignore[attr-defined]
    # one loop per kind for the whole watch: it lists once (again only after an outage) and then waits
    assert script.started == ["Machine in ns", "Event in ns"]
