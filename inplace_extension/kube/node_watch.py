"""Nodes of a target cluster, as plain dicts: a list-then-watch stream that reconnects, and the few
writes the MCM agent makes (metadata merge patches guarded by resourceVersion, one taint removal,
deleting the Pods left on a Node).

The watch is our own loop rather than lightkube's retrying one: after any error (API outage, expired
resourceVersion) it waits with a capped exponential backoff, lists again (so no change is missed:
the list is a full snapshot) and watches from the list's resourceVersion.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Mapping
from typing import Any

import httpx2  # lightkube's transport: its connection errors are httpx2's
from lightkube import AsyncClient
from lightkube.core.exceptions import ApiError, NotReadyError
from lightkube.resources.core_v1 import Node, Pod
from lightkube.types import PatchType

log = logging.getLogger(__name__)

BACKOFF_START = 0.5
BACKOFF_CAP = 30.0
WATCH_TIMEOUT = 300  # seconds; the server ends each watch request after this and we resume


class Conflict(Exception):
    """The object changed since it was read (HTTP 409): read it again and decide again."""


def _dict(obj: Any) -> dict[str, Any]:
    result: dict[str, Any] = obj.to_dict()
    return result


async def list_nodes(client: AsyncClient) -> tuple[list[dict[str, Any]], str]:
    """All Nodes and the list's resourceVersion."""
    nodes = []
    result = client.list(Node)
    async for node in result:
        nodes.append(_dict(node))
    try:
        version = result.resourceVersion
    except NotReadyError:  # no list chunk arrived: watch from "now"
        version = ""
    return nodes, version


async def get_node(client: AsyncClient, name: str) -> dict[str, Any] | None:
    try:
        return _dict(await client.get(Node, name))
    except ApiError as exc:
        if exc.status.code == 404:
            return None
        raise


async def watch_nodes(
    client: AsyncClient, connected: asyncio.Event | None = None
) -> AsyncIterator[dict[str, Any]]:
    """Every Node as it is now (a full list after each (re)connect), then each change; never ends.

    ``connected`` is set while a list or watch succeeds and cleared during an outage (``/healthz``).
    A deleted Node is not reported: the agent only acts on Nodes that exist.
    """
    delay = BACKOFF_START
    while True:
        try:
            nodes, version = await list_nodes(client)
            if connected is not None:
                connected.set()
            delay = BACKOFF_START
            for node in nodes:
                yield node
            async for event, changed in client.watch(
                Node, resource_version=version, server_timeout=WATCH_TIMEOUT
            ):
                if event != "DELETED":
                    yield _dict(changed)
        except (ApiError, httpx2.HTTPError, OSError) as exc:
            if connected is not None:
                connected.clear()
            log.warning("node watch interrupted (%s); listing again in %.1fs", type(exc).__name__, delay)
            await asyncio.sleep(delay)
            delay = min(BACKOFF_CAP, delay * 2)


async def patch_metadata(
    client: AsyncClient,
    name: str,
    resource_version: str,
    labels: Mapping[str, str | None] | None = None,
    annotations: Mapping[str, str | None] | None = None,
) -> dict[str, Any]:
    """JSON merge patch of Node labels/annotations (None removes a key), only if the Node is still at
    ``resource_version`` (else Conflict). Nothing outside ``metadata.labels/annotations`` is sent."""
    metadata: dict[str, Any] = {"resourceVersion": resource_version}
    if labels:
        metadata["labels"] = dict(labels)
    if annotations:
        metadata["annotations"] = dict(annotations)
    try:
        node = await client.patch(Node, name, {"metadata": metadata}, patch_type=PatchType.MERGE)
    except ApiError as exc:
        if exc.status.code == 409:
            raise Conflict(name) from exc
        raise
    return _dict(node)


async def remove_taint(client: AsyncClient, node: Mapping[str, Any], key: str, effect: str) -> bool:
    """Remove one taint (JSON patch tested against the read resourceVersion); False when it is absent."""
    taints = list(node.get("spec", {}).get("taints") or [])
    kept = [t for t in taints if not (t.get("key") == key and t.get("effect") == effect)]
    if len(kept) == len(taints):
        return False
    ops = [
        {"op": "test", "path": "/metadata/resourceVersion", "value": node["metadata"]["resourceVersion"]},
        {"op": "replace", "path": "/spec/taints", "value": kept},
    ]
    try:
        await client.patch(Node, node["metadata"]["name"], ops, patch_type=PatchType.JSON)
    except ApiError as exc:
        if exc.status.code in (409, 422):  # 422: the test op failed (the Node changed)
            raise Conflict(node["metadata"]["name"]) from exc
        raise
    return True


async def delete_pods_on_node(client: AsyncClient, node: str, keep_kinds: frozenset[str]) -> int:
    """Delete the Pods bound to ``node`` except those owned by ``keep_kinds`` (e.g. DaemonSet)."""
    deleted = 0
    async for pod in client.list(Pod, namespace="*", fields={"spec.nodeName": node}):
        owners = {ref.kind for ref in (pod.metadata.ownerReferences or [])} if pod.metadata else set()
        if owners & keep_kinds or pod.metadata is None or pod.metadata.name is None:
            continue
        try:
            await client.delete(Pod, pod.metadata.name, namespace=pod.metadata.namespace)
            deleted += 1
        except ApiError as exc:
            if exc.status.code != 404:
                raise
    return deleted
