"""The target cluster's Node watch as the MCM agent consumes it (``kube.nodes.watch_nodes``): each Node by
name, and None once it is gone, also for a Node deleted while the watch was away (missing from the list
after a reconnect). The list-then-watch loop underneath is scripted here; tests/mcm runs the agent on
it against the real API server."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from inplace_extension.kube import nodes

pytestmark = pytest.mark.anyio


def node(name: str, version: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "resourceVersion": version}}


SCRIPT = [
    ("LISTED", [node("a", "1"), node("b", "1")]),
    ("MODIFIED", [node("a", "2")]),
    ("DELETED", [node("b", "3")]),
    ("ADDED", [node("c", "4")]),
    # the watch was away: c was deleted and d created meanwhile; the new list says so
    ("LISTED", [node("a", "2"), node("d", "6")]),
]


async def test_deleted_nodes_are_reported_gone_also_those_a_reconnect_finds_missing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def scripted(*_args: Any, **_kwargs: Any) -> AsyncIterator[tuple[str, list[dict[str, Any]]]]:
        for step in SCRIPT:
            yield step
        await asyncio.Event().wait()  # a watch never ends

    monkeypatch.setattr(nodes, "list_then_watch", scripted)
    seen: list[tuple[str, str | None]] = []
    async with asyncio.timeout(5):
        async for name, found in nodes.watch_nodes(client=None):  # type: ignore[arg-type]
            seen.append((name, None if found is None else found["metadata"]["resourceVersion"]))
            if len(seen) == 8:
                break
    assert seen == [
        ("a", "1"),
        ("b", "1"),
        ("a", "2"),
        ("b", None),
        ("c", "4"),
        ("c", None),  # gone while the watch was away
        ("a", "2"),
        ("d", "6"),
    ]
