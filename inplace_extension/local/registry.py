"""Runs in flight: a registry keyed by run ident, a FIFO queue, and at most N runs at once, in batches.

Process memory only (a cache: the truth is on disk and on the host): it answers "queued: position 3 of 7" /
"running: ntp" and hands admitted entries to a worker thread, several at once when they arrive together (one
ansible-playbook for many Machines: one Ansible start-up, forks). Thread-safe: poll() reads it from the event
loop while worker threads update phases and finish entries. Used by :mod:`inplace_extension.runs.service`.
"""

from __future__ import annotations

import enum
import logging
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from inplace_extension.runs import progress

log = logging.getLogger(__name__)
P = TypeVar("P")


class EntryState(enum.Enum):
    QUEUED = "queued"
    RUNNING = "running"


@dataclass
class Entry(Generic[P]):
    """An entry of the registry: one run waiting for or holding a slot (named so that it is never taken
    for a Kubernetes Job of the ``kubernetes`` executor); ``payload`` is what the batch runner needs to
    run it."""

    ident: str
    machine: str  # "ns/name": at most one run per Machine at a time, even across fingerprints
    payload: P
    state: EntryState = EntryState.QUEUED
    phase: str = progress.STARTING
    on_done: Callable[[], None] | None = None  # called once the entry has left the registry
    thread: threading.Thread | None = field(default=None, repr=False)


@dataclass(frozen=True)
class EntryView:
    """A consistent snapshot of one entry for building a message."""

    state: EntryState
    phase: str
    position: int  # 1-based place in the queue (0 when running)
    queued: int  # how many entries wait in the queue

    def message(self) -> str:
        if self.state is EntryState.QUEUED:
            return progress.queued(self.position, self.queued)
        return progress.running(self.phase)


class RunRegistry(Generic[P]):
    """``run_batch(entries)`` runs admitted entries in a worker thread. With ``window > 0`` admission waits
    that long after a submit, so that entries submitted together (CAPI polling several Machines) share a
    batch."""

    def __init__(
        self, max_parallel: int, run_batch: Callable[[list[Entry[P]]], None], window: float = 0.0
    ) -> None:
        if max_parallel < 1:
            raise ValueError("max_parallel must be >= 1")
        self._max = max_parallel
        self._run_batch = run_batch
        self._window = window
        self._lock = threading.Lock()
        self._entries: dict[str, Entry[P]] = {}
        self._queue: deque[Entry[P]] = deque()
        self._running: dict[str, Entry[P]] = {}
        self._timer: threading.Timer | None = None
        self._closed = False

    def view(self, ident: str) -> EntryView | None:
        with self._lock:
            entry = self._entries.get(ident)
            if entry is None:
                return None
            position = 0
            if entry.state is EntryState.QUEUED:
                position = next(i for i, j in enumerate(self._queue, 1) if j is entry)
            return EntryView(entry.state, entry.phase, position, len(self._queue))

    def entry(self, ident: str) -> Entry[P] | None:
        """``ident``'s entry while it is queued or running."""
        with self._lock:
            return self._entries.get(ident)

    def submit(self, entry: Entry[P]) -> bool:
        """Queue ``entry`` unless an entry with its ident is already known; admit what fits after the
        window."""
        with self._lock:
            if self._closed or entry.ident in self._entries:
                return False
            self._entries[entry.ident] = entry
            self._queue.append(entry)
            log.info(
                "machine=%s run=%s state=queued position=%d", entry.machine, entry.ident, len(self._queue)
            )
            if self._window > 0:
                if self._timer is None:
                    self._timer = threading.Timer(self._window, self._window_over)
                    self._timer.daemon = True
                    self._timer.start()
                return True
        self._dispatch()
        return True

    def withdraw(self, ident: str) -> bool:
        """Take ``ident``'s entry out of the queue before a slot admits it (an operator's hold came while it
        waited); True when it was queued and is gone now, False when it runs already (or is unknown)."""
        with self._lock:
            entry = self._entries.get(ident)
            if entry is None or entry.state is not EntryState.QUEUED:
                return False
            self._queue.remove(entry)
            del self._entries[ident]
        log.info("machine=%s run=%s state=withdrawn (from the queue)", entry.machine, ident)
        self._done(entry)
        return True

    def release(self, entry: Entry[P]) -> None:
        """``entry`` was admitted to a batch but does not play (it may no longer start): it leaves the
        registry and its slot now, not when the batch's play ends."""
        with self._lock:
            if self._running.get(entry.ident) is not entry:
                return
            del self._running[entry.ident]
            del self._entries[entry.ident]
        log.info("machine=%s run=%s state=withdrawn (at its start)", entry.machine, entry.ident)
        self._done(entry)
        self._dispatch()

    def set_phase(self, ident: str, phase: str) -> None:
        with self._lock:
            entry = self._entries.get(ident)
            if entry is None or entry.phase == phase:
                return
            entry.phase = phase
        log.info("machine=%s run=%s state=running phase=%s", entry.machine, ident, phase)

    def in_flight(self) -> int:
        with self._lock:
            return len(self._entries)

    def running_count(self) -> int:
        """Jobs executing now (admitted to a slot); the runs_in_flight gauge."""
        with self._lock:
            return len(self._running)

    def queued_count(self) -> int:
        """Jobs waiting in the FIFO queue for a slot; the run_queue_length gauge."""
        with self._lock:
            return len(self._queue)

    def close(self) -> list[threading.Thread]:
        """Admit nothing more, drop the queue; return the worker threads still running."""
        with self._lock:
            self._closed = True
            if self._timer is not None:
                self._timer.cancel()
            for entry in self._queue:
                del self._entries[entry.ident]
            self._queue.clear()
            return list(
                {id(j.thread): j.thread for j in self._running.values() if j.thread is not None}.values()
            )

    def _window_over(self) -> None:
        with self._lock:
            self._timer = None
        self._dispatch()

    def _dispatch(self) -> None:
        with self._lock:
            if self._closed:
                return
            busy = {j.machine for j in self._running.values()}
            batch: list[Entry[P]] = []
            for entry in list(self._queue):
                if len(self._running) >= self._max:
                    break
                if entry.machine in busy:
                    continue  # FIFO except that one Machine never runs twice at once
                self._queue.remove(entry)
                entry.state = EntryState.RUNNING
                self._running[entry.ident] = entry
                busy.add(entry.machine)
                batch.append(entry)
            if not batch:
                return
            thread = threading.Thread(
                target=self._run, args=(batch,), name=f"run-{batch[0].ident}", daemon=True
            )
            for entry in batch:
                entry.thread = thread
        for entry in batch:
            log.info(
                "machine=%s run=%s state=running phase=%s batch=%d",
                entry.machine,
                entry.ident,
                entry.phase,
                len(batch),
            )
        thread.start()

    def _run(self, batch: list[Entry[P]]) -> None:
        try:
            self._run_batch(batch)
        except Exception:
            # the batch runner records outcomes itself; reaching here is a bug, but the slots must come back
            log.exception("run=%s: batch of %d failed", batch[0].ident, len(batch))
        finally:
            with self._lock:
                # an entry released before the play left already (and its ident may be queued again)
                ended = [entry for entry in batch if self._running.get(entry.ident) is entry]
                for entry in ended:
                    del self._running[entry.ident]
                    del self._entries[entry.ident]
            for entry in ended:
                self._done(entry)
            self._dispatch()

    @staticmethod
    def _done(entry: Entry[P]) -> None:
        if entry.on_done is not None:
            try:
                entry.on_done()
            except Exception:
                log.exception("machine=%s run=%s: completion callback failed", entry.machine, entry.ident)
