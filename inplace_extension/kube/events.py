"""Kubernetes Events: the one writer, for CAPI Machines (``kubectl describe machine``) and for Nodes
(``kubectl describe node``).

One rule for both (:class:`~inplace_extension.kube.port.KubeEvent`): the name comes from the object, the
occurrence and the state, and an Event is created only if absent (409: already recorded), so a state
reported again is the same Event. Writing is best effort: an Event that cannot be written is a log line,
never an error of the caller's work. :class:`EventRecorder` posts from one background thread with a
bounded queue (the Kubernetes-aware steps never wait on it; a full queue drops the Event with a log
line); :func:`post_async` posts from the MCM agent's event loop.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Mapping
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any, Final

from lightkube import AsyncClient, Client
from lightkube.models.core_v1 import EventSource, ObjectReference
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Event

from inplace_extension.kube.client import plain, translated
from inplace_extension.kube.errors import Conflict, KubeError
from inplace_extension.kube.machines import MACHINE_API_VERSION
from inplace_extension.kube.port import Involved, KubeEvent

log = logging.getLogger(__name__)

COMPONENT: Final = "inplace-extension"
QUEUE_SIZE: Final = 1000


def machine_event(
    namespace: str, machine: str, uid: str | None, run: str, type: str, reason: str, message: str
) -> KubeEvent:
    """An Event on a CAPI Machine for run ``run`` (the same state of another run is another Event)."""
    about = Involved("Machine", MACHINE_API_VERSION, machine, namespace, uid)
    return KubeEvent(about, run, type, reason, message, COMPONENT)


def node_event(
    node: Mapping[str, Any], reason: str, message: str, component: str, warning: bool = False
) -> KubeEvent:
    """An Event on a Node as read (its resourceVersion is the occurrence: the same state reported again
    for the same read Node is the same Event)."""
    metadata = node.get("metadata", {})
    about = Involved("Node", "v1", str(metadata.get("name", "")), None, metadata.get("uid"))
    occurrence = str(metadata.get("resourceVersion", ""))
    return KubeEvent(about, occurrence, "Warning" if warning else "Normal", reason, message, component)


def to_event(record: KubeEvent, now: datetime) -> Event:
    about = record.about
    return Event(
        metadata=ObjectMeta(name=record.name, namespace=record.namespace),
        involvedObject=ObjectReference(
            apiVersion=about.api_version,
            kind=about.kind,
            name=about.name,
            namespace=about.namespace,
            uid=about.uid,
        ),
        reason=record.reason,
        message=record.short_message,
        type=record.type,
        source=EventSource(component=record.component),
        reportingComponent=record.component,
        firstTimestamp=now,
        lastTimestamp=now,
        count=1,
    )


def _what(event: KubeEvent) -> str:
    return f"record Event {event.reason} on {event.about.kind} {event.about.name}"


def _failed(event: KubeEvent, exc: KubeError) -> bool:
    if not isinstance(exc, Conflict):  # a Conflict: this state was already recorded
        log.warning("%s/%s: event %s not recorded: %s", event.namespace, event.about.name, event.reason, exc)
    return False


def post(client: Client, event: KubeEvent) -> bool:
    """Create the Event now (True), or find it already there or fail with a log line (False)."""
    try:
        with translated(_what(event)):
            client.create(to_event(event, datetime.now(UTC)), namespace=event.namespace)
    except KubeError as exc:
        return _failed(event, exc)
    return True


async def post_async(client: AsyncClient, event: KubeEvent) -> bool:
    """:func:`post` from an event loop."""
    try:
        with translated(_what(event)):
            await client.create(to_event(event, datetime.now(UTC)))
    except KubeError as exc:
        return _failed(event, exc)
    return True


async def events_about(client: AsyncClient, kind: str, name: str, namespace: str) -> list[dict[str, Any]]:
    """The Events about one object (tests and ``kubectl``-free diagnostics)."""
    fields: dict[str, Any] = {"involvedObject.kind": kind, "involvedObject.name": name}
    with translated(f"list Events about {kind} {name}"):
        return [plain(event) async for event in client.list(Event, namespace=namespace, fields=fields)]


class EventRecorder:
    """Posts Events from a background thread; :meth:`record` never blocks."""

    def __init__(self, client: Client, uid_of: Callable[[str, str], str | None] | None = None) -> None:
        """``uid_of(namespace, machine)`` finds the uid of an Event's Machine when the caller did not
        know it (UpdateMachine requests carry none): ``kubectl describe`` matches Events by uid."""
        self._client = client
        self._uid_of = uid_of
        self._uids: dict[tuple[str, str], str] = {}
        self._queue: queue.Queue[KubeEvent | None] = queue.Queue(QUEUE_SIZE)
        self._thread = threading.Thread(target=self._loop, name="kube-events", daemon=True)
        self._thread.start()

    def record(self, event: KubeEvent) -> None:
        try:
            self._queue.put_nowait(event)
        except queue.Full:
            log.warning(
                "%s/%s: event queue full, dropped %s", event.namespace, event.about.name, event.reason
            )

    def close(self, timeout: float = 5.0) -> None:
        """Post what is queued (up to ``timeout``), then stop the thread."""
        try:
            self._queue.put(None, timeout=timeout)
        except queue.Full:
            return
        self._thread.join(timeout)

    def post(self, event: KubeEvent) -> bool:
        """Post now (the recorder's thread, or a test): see :func:`post`."""
        if event.about.uid is None and self._uid_of is not None and event.about.namespace is not None:
            uid = self._uid(event.about.namespace, event.about.name)
            event = replace(event, about=replace(event.about, uid=uid))
        return post(self._client, event)

    def _uid(self, namespace: str, name: str) -> str | None:
        uid = self._uids.get((namespace, name))
        if uid is None and self._uid_of is not None:
            try:
                uid = self._uid_of(namespace, name)
            except KubeError as exc:
                log.warning("%s/%s: uid for an Event not found: %s", namespace, name, exc)
                return None
            if uid is not None:
                self._uids[(namespace, name)] = uid
        return uid

    def _loop(self) -> None:
        while True:
            event = self._queue.get()
            if event is None:
                return
            try:
                self.post(event)
            except Exception:  # a bug must not end the thread: the next Events still get written
                log.exception("%s/%s: event %s not recorded", event.namespace, event.about.name, event.reason)
