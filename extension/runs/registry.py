"""Runs in flight: a registry keyed by run ident, a FIFO queue, and at most N runs at once.

Process memory only (a cache, design.md §3): it answers "queued: position 3 of 7" / "running: ntp" and
hands each admitted job to a worker thread. Thread-safe: poll() reads it from the event loop while
worker threads update phases and finish jobs. Used by :mod:`extension.runs.service`.
"""

from __future__ import annotations

import enum
import logging
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

log = logging.getLogger(__name__)


class JobState(enum.Enum):
    QUEUED = "queued"
    RUNNING = "running"


@dataclass
class Job:
    """One run waiting for or holding a slot. ``work`` runs in a worker thread once admitted."""

    ident: str
    machine: str  # "ns/name": at most one run per Machine at a time, even across fingerprints
    work: Callable[[Job], None]
    state: JobState = JobState.QUEUED
    phase: str = "starting"
    attempt: int = 0  # set by the worker once its attempt directory exists
    on_done: Callable[[], None] | None = None  # called once the job has left the registry
    thread: threading.Thread | None = field(default=None, repr=False)


@dataclass(frozen=True)
class JobView:
    """A consistent snapshot of one job for building a message."""

    state: JobState
    phase: str
    position: int  # 1-based place in the queue (0 when running)
    queued: int  # how many jobs wait in the queue

    def message(self) -> str:
        if self.state is JobState.QUEUED:
            return f"queued: position {self.position} of {self.queued}"
        return f"running: {self.phase}"


class RunRegistry:
    def __init__(self, max_parallel: int) -> None:
        if max_parallel < 1:
            raise ValueError("max_parallel must be >= 1")
        self._max = max_parallel
        self._lock = threading.Lock()
        self._jobs: dict[str, Job] = {}
        self._queue: deque[Job] = deque()
        self._running: dict[str, Job] = {}
        self._closed = False

    def view(self, ident: str) -> JobView | None:
        with self._lock:
            job = self._jobs.get(ident)
            if job is None:
                return None
            position = 0
            if job.state is JobState.QUEUED:
                position = next(i for i, j in enumerate(self._queue, 1) if j is job)
            return JobView(job.state, job.phase, position, len(self._queue))

    def submit(self, job: Job) -> bool:
        """Queue ``job`` unless a job with its ident is already known; then admit what fits."""
        with self._lock:
            if self._closed or job.ident in self._jobs:
                return False
            self._jobs[job.ident] = job
            self._queue.append(job)
            log.info("machine=%s run=%s state=queued position=%d", job.machine, job.ident, len(self._queue))
        self._dispatch()
        return True

    def set_phase(self, ident: str, phase: str) -> None:
        with self._lock:
            job = self._jobs.get(ident)
            if job is None or job.phase == phase:
                return
            job.phase = phase
        log.info("machine=%s run=%s state=running phase=%s", job.machine, ident, phase)

    def in_flight(self) -> int:
        with self._lock:
            return len(self._jobs)

    def close(self) -> list[threading.Thread]:
        """Admit nothing more, drop the queue; return the worker threads still running."""
        with self._lock:
            self._closed = True
            for job in self._queue:
                del self._jobs[job.ident]
            self._queue.clear()
            return [j.thread for j in self._running.values() if j.thread is not None]

    def _dispatch(self) -> None:
        admitted: list[tuple[Job, threading.Thread]] = []
        with self._lock:
            busy = {j.machine for j in self._running.values()}
            for job in list(self._queue):
                if self._closed or len(self._running) >= self._max:
                    break
                if job.machine in busy:
                    continue  # FIFO except that one Machine never runs twice at once
                self._queue.remove(job)
                job.state = JobState.RUNNING
                self._running[job.ident] = job
                busy.add(job.machine)
                job.thread = threading.Thread(
                    target=self._run, args=(job,), name=f"run-{job.ident}", daemon=True
                )
                admitted.append((job, job.thread))
        for job, thread in admitted:
            log.info("machine=%s run=%s state=running phase=%s", job.machine, job.ident, job.phase)
            thread.start()

    def _run(self, job: Job) -> None:
        try:
            job.work(job)
        except Exception:
            # the worker records outcomes itself; reaching here is a bug, but the slot must come back
            log.exception("machine=%s run=%s: worker failed", job.machine, job.ident)
        finally:
            with self._lock:
                self._running.pop(job.ident, None)
                self._jobs.pop(job.ident, None)
            if job.on_done is not None:
                try:
                    job.on_done()
                except Exception:
                    log.exception("machine=%s run=%s: completion callback failed", job.machine, job.ident)
            self._dispatch()
