"""The ``local`` backend: the record is the runs directory on disk, and each attempt's play runs in a
worker thread of this process (the default of ``serve`` and ``mcm-agent``).

Attempts are queued in the registry (registry.py), which batches Machines queued together into one
play; a worker thread plays each batch (plays/batch.py: each attempt's directory and ``meta.json``, the
cluster side, ansible-runner, the outcome classified and written as ``outcome.json``), so a restarted
process answers from disk. Only the attempts of the machine's current episode answer (episode.py): a
desired state that comes back after another plays again. The health-wait clock is a file beside the
attempts (health_wait.py). A call held for a play's end waits in waiters.py.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from functools import partial

import anyio.to_thread

from inplace_extension.local import episode, health_wait
from inplace_extension.local.registry import Entry, EntryState, RunRegistry
from inplace_extension.local.waiters import EndWaiters
from inplace_extension.metrics import Metrics
from inplace_extension.plays import ssh
from inplace_extension.plays.artifacts import prune_batches
from inplace_extension.plays.batch import BatchAttempt, BatchPlayer, PlayConfig
from inplace_extension.plays.outcomes import load_attempts
from inplace_extension.runs import progress
from inplace_extension.runs.attempts import Attempt
from inplace_extension.runs.backend import Launch
from inplace_extension.runs.memo import Recent
from inplace_extension.runs.model import ClusterSide, RunRequest
from inplace_extension.settings import Settings

log = logging.getLogger(__name__)

# Runs queued within this window share one ansible-playbook (one Ansible start-up, forks): CAPI
# polls the Machines of a rollout in quick succession.
BATCH_WINDOW_SECONDS = 0.15
# Finished plays' ansible-runner artifacts (events, stdout) are kept this long for operators to read.
BATCH_RETENTION_SECONDS = 7 * 24 * 3600


class LocalBackend:
    """:class:`~inplace_extension.runs.backend.Backend` on this process's disk and threads."""

    def __init__(
        self,
        settings: Settings,
        *,
        cluster: ClusterSide,
        play: PlayConfig,
        metrics: Metrics | None,
        clock: Callable[[], float],
        fork_server: bool = False,
    ) -> None:
        """``fork_server``: plays start from this process's fork server (forkserver_process.py), not as a
        new ansible-playbook."""
        self._clock = clock
        self._runs_dir = settings.runs_dir.expanduser().resolve()
        self._player = BatchPlayer(
            settings,
            cluster=cluster,
            play=play,
            metrics=metrics,
            clock=clock,
            set_phase=self._set_phase,
            episode=self._enter_episode,
            finished=self._load_now,
            fork_server=fork_server,
        )
        self._prune()
        self._registry: RunRegistry[Launch] = RunRegistry(
            settings.max_parallel_runs, self._run_batch, window=BATCH_WINDOW_SECONDS
        )
        if metrics is not None:
            metrics.bind_run_gauges(self._registry.running_count, self._registry.queued_count)
        # ident -> its attempts as last read from disk: a cache of the updates polled lately, bounded (an
        # update forgotten is read from disk again on its next poll)
        self._attempts: Recent[str, tuple[Attempt, ...]] = Recent()
        self._ends = EndWaiters()

    # the record

    def cached(self, ident: str) -> Sequence[Attempt]:
        return self._attempts.get(ident) or ()

    async def attempts(self, request: RunRequest) -> list[Attempt]:
        cached = self._attempts.get(request.ident)
        if cached is not None:
            return list(cached)
        return await anyio.to_thread.run_sync(self._load_now, request)

    async def wait_began(self, request: RunRequest, check: str, token: str, now: float) -> float:
        ident_dir = self._runs_dir / request.ident
        return await anyio.to_thread.run_sync(health_wait.began, ident_dir, check, token, now)

    async def end_wait(self, request: RunRequest) -> None:
        await anyio.to_thread.run_sync(health_wait.end, self._runs_dir / request.ident)

    async def gate_passed(self, request: RunRequest, number: int) -> None:
        """Nothing: this process answers every poll of its runs dir, and remembers the gate it saw pass."""

    def _load_now(self, request: RunRequest) -> list[Attempt]:
        # only the machine's current episode answers: after A -> B -> A, the first A's attempts do not
        answers = episode.answering(self._runs_dir, request)
        attempts = (
            []
            if answers is None
            else load_attempts(self._runs_dir / request.ident, request.fingerprint, answers)
        )
        self._attempts.set(request.ident, tuple(attempts))
        return attempts

    # the launcher

    async def reconcile(self, request: RunRequest) -> str | None:
        view = self._registry.view(request.ident)
        return None if view is None else view.message()

    def pending(self, ident: str) -> bool:
        entry = self._registry.entry(ident)
        return entry is not None and entry.state is EntryState.QUEUED and entry.payload.may_begin is not None

    async def withdraw(self, request: RunRequest) -> bool:
        return self._registry.withdraw(request.ident)

    async def wait_end(self, request: RunRequest, seconds: float) -> bool:
        # woken by the worker thread as the entry leaves the registry, after its outcome.json and cache
        await self._ends.hold(request.ident, seconds, self._registry.view)
        return self._registry.view(request.ident) is None

    async def launch(self, launch: Launch) -> str:
        return self.submit(launch)

    def submit(self, launch: Launch) -> str:
        """Queue ``launch`` (its play holds a fresh lock token, and may take over the locks of this ident's
        ended attempts on disk). The message a poll answers now."""
        ident = launch.request.ident
        view = self._registry.view(ident)
        if view is not None:  # launched already (a concurrent poll): that one is the attempt
            return view.message()
        self._registry.submit(
            Entry(ident, launch.request.machine, launch, on_done=partial(self._ends.ended, ident))
        )
        view = self._registry.view(ident)
        if view is None:  # it already ended (or the process is closing): the next poll reads the result
            return progress.running(progress.STARTING)
        return view.message()

    def close(self, timeout: float) -> None:
        """Runs are never killed: one still going when the process exits finishes on its own (detach.py),
        and the next attempt waits for its host lock and finds the stamp."""
        deadline = time.monotonic() + timeout
        threads = self._registry.close()
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        self._player.close(max(0.0, deadline - time.monotonic()))
        if not any(thread.is_alive() for thread in threads):
            ssh.close_control_masters(self._runs_dir)  # a run still going needs its master

    def _set_phase(self, ident: str, phase: str) -> None:
        self._registry.set_phase(ident, phase)

    # a batch, in a worker thread

    def _run_batch(self, entries: list[Entry[Launch]]) -> None:
        """Worker thread: one play for the admitted entries whose start checks still allow them."""
        admitted = []
        for entry in entries:
            if self._may_begin(entry):
                admitted.append(BatchAttempt(entry.payload))
            else:
                self._registry.release(entry)  # the next poll answers why: a hold, a window, a check
        if admitted:
            self._player.play(admitted)
        self._prune()

    def _may_begin(self, entry: Entry[Launch]) -> bool:
        """Whether ``entry``'s play may begin now, as it takes its slot: the service's start checks asked
        again (it may have waited for the slot while a hold came or its window closed)."""
        check = entry.payload.may_begin
        if check is None:
            return True
        try:
            allowed = check()
        except Exception:  # the checks never raise by contract; if one does, nothing starts unchecked
            log.exception("machine=%s run=%s: the start checks failed", entry.machine, entry.ident)
            allowed = False
        if not allowed:
            log.info("machine=%s run=%s: not started: held at its start", entry.machine, entry.ident)
        return allowed

    def _enter_episode(self, request: RunRequest) -> str:
        """The episode an attempt beginning now belongs to (episode.py); a new one forgets what was read
        of either desired state."""
        began_in, ended = episode.enter(self._runs_dir, request)
        if ended is not None:  # a new episode: what was read of either desired state is of earlier ones
            self._attempts.pop(ended)
            self._attempts.pop(request.ident)
        return began_in

    def _prune(self) -> None:
        for removed in prune_batches(self._runs_dir / ".batches", BATCH_RETENTION_SECONDS, self._clock()):
            log.info("removed the artifacts of %s (older than the retention)", removed.name)
