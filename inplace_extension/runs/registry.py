"""Runs in flight: a registry keyed by run ident, a FIFO queue, and at most N runs at once, in batches.

Process memory only (a cache: the truth is on disk and on the host): it answers "queued: position 3 of 7" /
"running: ntp" and hands admitted jobs to a worker thread, several at once when they arrive together (one
ansible-playbook for many Machines: one Ansible start-up, forks). Thread-safe: poll() reads it from the event
loop while worker threads update phases and finish jobs. Used by :mod:`inplace_extension.runs.service`.
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


class JobState(enum.Enum):
    QUEUED = "queued"
    RUNNING = "running"


@dataclass
class Job(Generic[P]):
    """One run waiting for or holding a slot; ``payload`` is what the batch runner needs to run it."""

    ident: str
    machine: str  # "ns/name": at most one run per Machine at a time, even across fingerprints
    payload: P
    state: JobState = JobState.QUEUED
    phase: str = progress.STARTING
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
            return progress.queued(self.position, self.queued)
        return progress.running(self.phase)


class RunRegistry(Generic[P]):
    """``run_batch(jobs)`` runs admitted jobs in a worker thread. With ``window > 0`` admission waits that
    long after a submit, so that jobs submitted together (CAPI polling several Machines) share a batch."""

    def __init__(
        self, max_parallel: int, run_batch: Callable[[list[Job[P]]], None], window: float = 0.0
    ) -> None:
        if max_parallel < 1:
            raise ValueError("max_parallel must be >= 1")
        self._max = max_parallel
        self._run_batch = run_batch
        self._window = window
        self._lock = threading.Lock()
        self._jobs: dict[str, Job[P]] = {}
        self._queue: deque[Job[P]] = deque()
        self._running: dict[str, Job[P]] = {}
        self._timer: threading.Timer | None = None
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

    def job(self, ident: str) -> Job[P] | None:
        """``ident``'s job while it is queued or running."""
        with self._lock:
            return self._jobs.get(ident)

    def submit(self, job: Job[P]) -> bool:
        """Queue ``job`` unless a job with its ident is already known; admit what fits after the window."""
        with self._lock:
            if self._closed or job.ident in self._jobs:
                return False
            self._jobs[job.ident] = job
            self._queue.append(job)
            log.info("machine=%s run=%s state=queued position=%d", job.machine, job.ident, len(self._queue))
            if self._window > 0:
                if self._timer is None:
                    self._timer = threading.Timer(self._window, self._window_over)
                    self._timer.daemon = True
                    self._timer.start()
                return True
        self._dispatch()
        return True

    def withdraw(self, ident: str) -> bool:
        """Take ``ident``'s job out of the queue before a slot admits it (an operator's hold came while it
        waited); True when it was queued and is gone now, False when it runs already (or is unknown)."""
        with self._lock:
            job = self._jobs.get(ident)
            if job is None or job.state is not JobState.QUEUED:
                return False
            self._queue.remove(job)
            del self._jobs[ident]
        log.info("machine=%s run=%s state=withdrawn (from the queue)", job.machine, ident)
        self._done(job)
        return True

    def release(self, job: Job[P]) -> None:
        """``job`` was admitted to a batch but does not play (it may no longer start): it leaves the
        registry and its slot now, not when the batch's play ends."""
        with self._lock:
            if self._running.get(job.ident) is not job:
                return
            del self._running[job.ident]
            del self._jobs[job.ident]
        log.info("machine=%s run=%s state=withdrawn (at its start)", job.machine, job.ident)
        self._done(job)
        self._dispatch()

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
            for job in self._queue:
                del self._jobs[job.ident]
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
            batch: list[Job[P]] = []
            for job in list(self._queue):
                if len(self._running) >= self._max:
                    break
                if job.machine in busy:
                    continue  # FIFO except that one Machine never runs twice at once
                self._queue.remove(job)
                job.state = JobState.RUNNING
                self._running[job.ident] = job
                busy.add(job.machine)
                batch.append(job)
            if not batch:
                return
            thread = threading.Thread(
                target=self._run, args=(batch,), name=f"run-{batch[0].ident}", daemon=True
            )
            for job in batch:
                job.thread = thread
        for job in batch:
            log.info(
                "machine=%s run=%s state=running phase=%s batch=%d",
                job.machine,
                job.ident,
                job.phase,
                len(batch),
            )
        thread.start()

    def _run(self, batch: list[Job[P]]) -> None:
        try:
            self._run_batch(batch)
        except Exception:
            # the batch runner records outcomes itself; reaching here is a bug, but the slots must come back
            log.exception("run=%s: batch of %d failed", batch[0].ident, len(batch))
        finally:
            with self._lock:
                # a job released before the play left already (and its ident may be queued again)
                ended = [job for job in batch if self._running.get(job.ident) is job]
                for job in ended:
                    del self._running[job.ident]
                    del self._jobs[job.ident]
            for job in ended:
                self._done(job)
            self._dispatch()

    @staticmethod
    def _done(job: Job[P]) -> None:
        if job.on_done is not None:
            try:
                job.on_done()
            except Exception:
                log.exception("machine=%s run=%s: completion callback failed", job.machine, job.ident)
