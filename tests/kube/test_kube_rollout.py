"""inplace_extension.kube.rollout against the kubelab's real API server with CAPI's Machine CRD: the
Machines of an owner (by CAPI's owner label) and the service's Events about them, read once and watched:
a change arrives by the watch, a new snapshot per change, with no list after the first (no polling).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
import pytest
from kubelab.lab import Lab

from inplace_extension.kube import events
from inplace_extension.kube.client import connect_async
from inplace_extension.kube.rollout import Owner, RolloutReader, Snapshot

from .conftest import create_machine

pytestmark = [pytest.mark.kube, pytest.mark.anyio]
MACHINE = "machine.cluster.x-k8s.io"
DEADLINE = 30.0


def names(snapshot: Snapshot) -> set[str]:
    return {m["metadata"]["name"] for m in snapshot.machines}


def counted(calls: list[str], name: str, method: Callable[..., Any]) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:
        calls.append(name)
        return method(*args, **kwargs)

    return call


async def next_until(
    watch: AsyncIterator[Snapshot], holds: Callable[[Snapshot], bool], seen: list[Snapshot]
) -> Snapshot:
    with anyio.fail_after(DEADLINE):
        while True:
            snapshot = await anext(watch)
            seen.append(snapshot)
            if holds(snapshot):
                return snapshot


async def test_an_owners_machines_and_their_events_read_then_watched(with_machines: Lab, client: Any) -> None:
    lab, ns = with_machines, f"r-{uuid.uuid4().hex[:6]}"
    for name, deployment in (("md-0-a", "md-0"), ("md-0-b", "md-0"), ("md-1-a", "md-1")):
        create_machine(lab, ns, name, [], None)
        lab.kubectl("label", MACHINE, name, "-n", ns, f"cluster.x-k8s.io/deployment-name={deployment}")
    queued = events.machine_event(ns, "md-0-a", None, "run-a", "Normal", "Queued", "queued")
    assert events.post(client, queued)
    owner = Owner("MachineDeployment", ns, "md-0")
    reader = RolloutReader(connect_async(lab.kubeconfig))
    try:
        read = await reader.snapshot(owner)
        assert names(read) == {"md-0-a", "md-0-b"}  # not md-1's
        assert [(e["involvedObject"]["name"], e["reason"]) for e in read.events] == [("md-0-a", "Queued")]

        calls: list[str] = []
        kube: Any = reader._client  # counted from here on: every list and watch request the reader makes
        kube.list = counted(calls, "list", kube.list)
        kube.watch = counted(calls, "watch", kube.watch)
        seen: list[Snapshot] = []
        watch = aiter(reader.watch(owner))
        first = await next_until(
            watch, lambda s: names(s) == {"md-0-a", "md-0-b"} and len(s.events) == 1, seen
        )
        assert first.events[0]["reason"] == "Queued"

        def change() -> None:
            lab.kubectl("annotate", MACHINE, "md-0-b", "-n", ns, "example.com/step=two")
            done = events.machine_event(ns, "md-0-b", None, "run-b", "Normal", "Done", "update applied")
            assert events.post(client, done)

        await anyio.to_thread.run_sync(change)

        def changed(s: Snapshot) -> bool:
            b = next(m for m in s.machines if m["metadata"]["name"] == "md-0-b")
            reasons = {(e["involvedObject"]["name"], e["reason"]) for e in s.events}
            return (
                "example.com/step" in (b["metadata"].get("annotations") or {})
                and ("md-0-b", "Done") in reasons
            )

        await next_until(watch, changed, seen)
        # one list and one watch per kind (Machines, Events), then only what the watches brought: at most
        # one snapshot per change seen (the first, the annotation, the Event), never one without a change
        assert sorted(calls) == ["list", "list", "watch", "watch"]
        assert 2 <= len(seen) <= 3
        await watch.aclose()  # type: ignore[attr-defined]
    finally:
        await reader.close()
