"""Kubernetes Events on a Node (``core/v1``): what operators see in ``kubectl describe node``.

Best effort by design: an Event that cannot be written is logged, never fails the caller's work.
"""

from __future__ import annotations

import datetime
import logging
import uuid
from collections.abc import Mapping
from typing import Any

import httpx2  # lightkube's transport: its connection errors are httpx2's
from lightkube import AsyncClient
from lightkube.core.exceptions import ApiError
from lightkube.models.core_v1 import EventSource, ObjectReference
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Event

log = logging.getLogger(__name__)

NODE_EVENTS_NAMESPACE = "default"  # where kubelet and MCM put Events about (cluster-scoped) Nodes


async def node_event(
    client: AsyncClient,
    node: Mapping[str, Any],
    reason: str,
    message: str,
    component: str,
    warning: bool = False,
) -> None:
    metadata = node.get("metadata", {})
    name = str(metadata.get("name", ""))
    now = datetime.datetime.now(datetime.UTC)
    event = Event(
        metadata=ObjectMeta(name=f"{name}.{uuid.uuid4().hex[:12]}", namespace=NODE_EVENTS_NAMESPACE),
        involvedObject=ObjectReference(kind="Node", apiVersion="v1", name=name, uid=metadata.get("uid")),
        reason=reason,
        message=message,
        type="Warning" if warning else "Normal",
        source=EventSource(component=component),
        firstTimestamp=now,
        lastTimestamp=now,
        count=1,
    )
    try:
        await client.create(event)
    except (ApiError, httpx2.HTTPError) as exc:
        log.warning("event %s on node %s not written: %s", reason, name, exc)


async def events_for(client: AsyncClient, node: str) -> list[dict[str, Any]]:
    """The Events about ``node`` (tests and ``kubectl``-free diagnostics)."""
    found = []
    fields: dict[str, Any] = {"involvedObject.kind": "Node", "involvedObject.name": node}
    async for event in client.list(Event, namespace=NODE_EVENTS_NAMESPACE, fields=fields):
        found.append(event.to_dict())
    return found
