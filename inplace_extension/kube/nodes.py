"""Nodes: what the health gate reads of a workload Node (Ready, the kubelet's version), and what the
MCM agent reads and writes of a target cluster's Nodes (list-then-watch, metadata merge patches guarded
by resourceVersion, one taint removal). Nodes are plain dicts for the agent; cordon and drain are in
:mod:`inplace_extension.kube.drain`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from typing import Any

from lightkube import AsyncClient, Client
from lightkube.resources.core_v1 import Node
from lightkube.types import PatchType

from inplace_extension.kube.client import list_then_watch, plain, translated
from inplace_extension.kube.errors import Conflict, KubeError, NotFound
from inplace_extension.kube.port import NodeHealth, NodeSeen


def node_health(client: Client, node: str) -> NodeHealth:
    try:
        with translated(f"get Node {node}"):
            obj = client.get(Node, node)
    except NotFound:
        return NodeHealth(False, False, None, False)
    status = obj.status
    ready = any(c.type == "Ready" and c.status == "True" for c in (status.conditions or [] if status else []))
    info = status.nodeInfo if status else None
    return NodeHealth(
        exists=True,
        ready=ready,
        kubelet_version=info.kubeletVersion if info else None,
        unschedulable=bool(obj.spec and obj.spec.unschedulable),
    )


async def watch_nodes(client: AsyncClient, connected: asyncio.Event | None = None) -> AsyncIterator[NodeSeen]:
    """Every Node as it is now (a full list after each (re)connect), then each change; never ends. A
    deleted Node is reported as gone (None), and so is one a list after a reconnect no longer has (it
    was deleted while the watch was away): a watcher's copy of the Nodes never keeps a Node that is gone."""
    known: set[str] = set()
    async for event, nodes in list_then_watch(client, Node, connected=connected):
        names = [str(node.get("metadata", {}).get("name", "")) for node in nodes]
        if event == "LISTED":
            for gone in sorted(known - set(names)):
                yield gone, None
            known = set(names)
        for name, node in zip(names, nodes, strict=True):
            if event == "DELETED":
                known.discard(name)
                yield name, None
            else:
                known.add(name)
                yield name, node


async def patch_metadata(
    client: AsyncClient,
    name: str,
    resource_version: str | None,
    labels: Mapping[str, str | None] | None = None,
    annotations: Mapping[str, str | None] | None = None,
) -> dict[str, Any]:
    """JSON merge patch of Node labels/annotations (None removes a key), only if the Node is still at
    ``resource_version`` (else Conflict; ``None``: at any version). Nothing outside
    ``metadata.labels/annotations`` is sent."""
    metadata: dict[str, Any] = {} if resource_version is None else {"resourceVersion": resource_version}
    if labels:
        metadata["labels"] = dict(labels)
    if annotations:
        metadata["annotations"] = dict(annotations)
    with translated(f"patch Node {name}"):
        node = await client.patch(Node, name, {"metadata": metadata}, patch_type=PatchType.MERGE)
    return plain(node)


async def remove_taint(client: AsyncClient, node: Mapping[str, Any], key: str, effect: str) -> bool:
    """Remove one taint (JSON patch tested against the read resourceVersion); False when it is absent."""
    taints = list(node.get("spec", {}).get("taints") or [])
    kept = [t for t in taints if not (t.get("key") == key and t.get("effect") == effect)]
    if len(kept) == len(taints):
        return False
    name = node["metadata"]["name"]
    ops = [
        {"op": "test", "path": "/metadata/resourceVersion", "value": node["metadata"]["resourceVersion"]},
        {"op": "replace", "path": "/spec/taints", "value": kept},
    ]
    try:
        with translated(f"patch Node {name}"):
            await client.patch(Node, name, ops, patch_type=PatchType.JSON)
    except KubeError as exc:
        if exc.status == 422:  # the test op failed: the Node changed since it was read
            raise Conflict(exc.message, exc.status) from None
        raise
    return True
