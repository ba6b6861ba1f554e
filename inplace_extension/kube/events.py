"""Kubernetes Events on CAPI Machines: what ``kubectl describe machine`` shows an operator.

One Event per state change, never one per poll: an Event's name is derived from the Machine, the run
and the state (reason + message), and it is created only if absent. The same state reported again (by
another poll, by a restarted service, by a second replica) is the same Event, so there is no spam and
nothing to aggregate in memory. Events are posted by one background thread from a bounded queue, so
recording never blocks the event loop or a run; a full queue drops the Event with a log line.
"""

from __future__ import annotations

import hashlib
import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Final

from lightkube import ApiError, Client
from lightkube.models.core_v1 import EventSource, ObjectReference
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Event

from inplace_extension.kube.machines import MACHINE_API_VERSION

log = logging.getLogger(__name__)

COMPONENT: Final = "inplace-extension"
QUEUE_SIZE: Final = 1000
MAX_MESSAGE: Final = 1024  # Event messages are meant to be short; ours are one line


@dataclass(frozen=True)
class MachineEvent:
    namespace: str
    machine: str
    uid: str | None  # kubectl describe finds Events by the object's uid; None when unknown
    run: str  # run ident: the same state of another run is another Event
    type: str  # Normal | Warning
    reason: str  # CamelCase: Queued, Started, Running, Drained, Done, Failed ...
    message: str

    @property
    def name(self) -> str:
        digest = hashlib.sha256(f"{self.run}\0{self.reason}\0{self.message}".encode()).hexdigest()[:16]
        return f"{self.machine[:200]}.{digest}"


def to_event(record: MachineEvent, now: datetime) -> Event:
    return Event(
        metadata=ObjectMeta(name=record.name, namespace=record.namespace),
        involvedObject=ObjectReference(
            apiVersion=MACHINE_API_VERSION,
            kind="Machine",
            name=record.machine,
            namespace=record.namespace,
            uid=record.uid,
        ),
        reason=record.reason,
        message=record.message[:MAX_MESSAGE],
        type=record.type,
        source=EventSource(component=COMPONENT),
        reportingComponent=COMPONENT,
        firstTimestamp=now,
        lastTimestamp=now,
        count=1,
    )


class EventRecorder:
    """Posts :class:`MachineEvent` s from a background thread; :meth:`record` never blocks."""

    def __init__(self, client: Client, uid_of: Callable[[str, str], str | None] | None = None) -> None:
        """``uid_of(namespace, machine)`` finds the uid of an Event's Machine when the caller did not
        know it (UpdateMachine requests carry none): ``kubectl describe`` matches Events by uid."""
        self._client = client
        self._uid_of = uid_of
        self._uids: dict[tuple[str, str], str] = {}
        self._queue: queue.Queue[MachineEvent | None] = queue.Queue(QUEUE_SIZE)
        self._thread = threading.Thread(target=self._loop, name="machine-events", daemon=True)
        self._thread.start()

    def record(self, event: MachineEvent) -> None:
        try:
            self._queue.put_nowait(event)
        except queue.Full:
            log.warning(
                "machine=%s/%s: event queue full, dropped %s", event.namespace, event.machine, event.reason
            )

    def close(self, timeout: float = 5.0) -> None:
        """Post what is queued (up to ``timeout``), then stop the thread."""
        try:
            self._queue.put(None, timeout=timeout)
        except queue.Full:
            return
        self._thread.join(timeout)

    def _uid(self, namespace: str, machine: str) -> str | None:
        uid = self._uids.get((namespace, machine))
        if uid is None and self._uid_of is not None:
            uid = self._uid_of(namespace, machine)
            if uid is not None:
                self._uids[(namespace, machine)] = uid
        return uid

    def _loop(self) -> None:
        while True:
            event = self._queue.get()
            if event is None:
                return
            self.post(event)

    def post(self, event: MachineEvent) -> bool:
        """Create the Event now (True), or find it already there or fail with a log line (False)."""
        try:
            if event.uid is None and self._uid_of is not None:
                event = replace(event, uid=self._uid(event.namespace, event.machine))
            self._client.create(to_event(event, datetime.now(UTC)), namespace=event.namespace)
        except ApiError as exc:
            if exc.response.status_code != 409:  # 409: this state was already recorded
                log.warning(
                    "machine=%s/%s: event %s not recorded: the API server answered %d",
                    event.namespace, event.machine, event.reason, exc.response.status_code,
                )  # fmt: skip
            return False
        except Exception as exc:  # a broken connection must not end the thread
            log.warning(
                "machine=%s/%s: event %s not recorded: %s", event.namespace, event.machine, event.reason, exc
            )
            return False
        return True
