"""The ``local`` backend: the record is the runs directory on disk, and each attempt's play runs in a
worker thread of this process (the default of ``serve`` and ``mcm-agent``); :meth:`LocalBackend.play`
plays one attempt in the calling thread instead (what runs inside the Job of the ``kubernetes`` backend).

Attempts are queued in the registry (registry.py), which batches Machines queued together into one
play; in a worker thread each attempt gets its directory and ``meta.json`` (artifacts.py), the cluster
side prepares it, ansible-runner plays it (runner.py), and its outcome is classified (outcomes.py) and
written as ``outcome.json``, so a restarted process answers from disk. Only the attempts of the machine's
current episode answer (episode.py): a desired state that comes back after another plays again. The
health-wait clock is a file beside the attempts (health_wait.py).
"""

from __future__ import annotations

import logging
import os
import secrets
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Final

import anyio.to_thread

from inplace_extension.metrics import Metrics
from inplace_extension.runs import episode, health_wait, model, progress, runner, ssh
from inplace_extension.runs.artifacts import (
    Attempt,
    BatchRef,
    Outcome,
    OutcomeKind,
    drain_failure_file,
    drain_file,
    ended_lock_tokens,
    new_attempt_dir,
    prune_batches,
    stop_waiting_plays,
    write_json,
)
from inplace_extension.runs.backend import Launch
from inplace_extension.runs.forkserver_process import ForkServer
from inplace_extension.runs.memo import Recent
from inplace_extension.runs.model import Blocked, ClusterSide, RunRequest
from inplace_extension.runs.outcomes import classify, load_attempts
from inplace_extension.runs.registry import Entry, EntryState, RunRegistry
from inplace_extension.runs.steps import StepTracker, blocked_outcome, drain_outcome
from inplace_extension.runs.waiters import EndWaiters
from inplace_extension.settings import Settings

log = logging.getLogger(__name__)

# Runs queued within this window share one ansible-playbook (one Ansible start-up, forks): CAPI
# polls the Machines of a rollout in quick succession.
BATCH_WINDOW_SECONDS = 0.15
# Beyond the drain timeout, how long a play waits at its drain point (cordon, API retries, the file write)
DRAIN_POINT_MARGIN_SECONDS = 120
# Finished plays' ansible-runner artifacts (events, stdout) are kept this long for operators to read.
BATCH_RETENTION_SECONDS = 7 * 24 * 3600


@dataclass(frozen=True, kw_only=True)
class PlayConfig:
    """What the capabilities file adds to every play: user-defined roles' directories, the health gate's
    command checks (run on the host before the stamp) and the roles' settings (extra vars)."""

    roles_paths: tuple[Path, ...]
    host_checks: tuple[model.HostCheck, ...]
    role_vars: Mapping[str, Any]


# no capabilities file: the shipped roles only, no command checks, no role settings
NO_PLAY_CONFIG: Final = PlayConfig(roles_paths=(), host_checks=(), role_vars={})


@dataclass(frozen=True)
class HostLock:
    """The host lock an attempt's play holds (``token``) and the tokens of ended attempts it may take
    over at once; given by the caller when the record is elsewhere (the ``kubernetes`` backend's Job)."""

    token: str
    takeover_tokens: tuple[str, ...]


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
        on_phase: Callable[[str, str], None] | None = None,
        fork_server: bool = False,
    ) -> None:
        """``on_phase(ident, phase)``: also told each phase change (the ``attempt`` command publishes it);
        ``fork_server``: plays start from this process's fork server (forkserver_process.py), not as a new
        ansible-playbook (the ``attempt`` command of a Job plays once: it has nothing to share)."""
        self._clock = clock
        self._runs_dir = settings.runs_dir.expanduser().resolve()
        self._runs_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._cluster = cluster
        self._play = play
        self._metrics = metrics
        self._playbook, self._ansible_cfg = runner.locate_playbook(settings.playbooks_dir)
        self._wrapper = runner.install_wrapper(self._runs_dir)
        self._fork_server = ForkServer(self._runs_dir, runner.play_python_env()) if fork_server else None
        self._host_checks_timeout = settings.health_gate_timeout_seconds
        # a play at its drain point waits this long for the drain's end (it has its own timeout)
        self._drain_wait_seconds = settings.drain_timeout_seconds + DRAIN_POINT_MARGIN_SECONDS
        self._prune()
        self._registry: RunRegistry[Launch] = RunRegistry(
            settings.max_parallel_runs, self._run_batch, window=BATCH_WINDOW_SECONDS
        )
        self._on_phase = on_phase
        if metrics is not None:
            metrics.bind_run_gauges(self._registry.running_count, self._registry.queued_count)
        # ident -> its attempts as last read from disk: a cache of the updates polled lately, bounded (an
        # update forgotten is read from disk again on its next poll)
        self._attempts: Recent[str, tuple[Attempt, ...]] = Recent()
        self._locks: dict[str, HostLock] = {}  # ident -> the host lock given with play()
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
        if not self._registry.withdraw(request.ident):
            return False
        self._locks.pop(request.ident, None)  # a lock given with the launch goes with it
        return True

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

    def play(self, launch: Launch, lock: HostLock) -> None:
        """Play ``launch``'s attempt in the calling thread, at once, holding ``lock``: no queue, batch
        window or worker thread (the ``attempt`` command in a Job plays one attempt and nothing else).
        Its outcome is on disk when this returns, as for a queued one."""
        ident = launch.request.ident
        self._locks[ident] = lock
        self._run_batch([Entry(ident, launch.request.machine, launch)])

    def close(self, timeout: float) -> None:
        """Runs are never killed: one still going when the process exits finishes on its own (detach.py),
        and the next attempt waits for its host lock and finds the stamp."""
        deadline = time.monotonic() + timeout
        threads = self._registry.close()
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        if self._fork_server is not None:
            # it exits after its last play, as that play's detach.py does
            self._fork_server.close(max(0.0, deadline - time.monotonic()))
        if not any(thread.is_alive() for thread in threads):
            ssh.close_control_masters(self._runs_dir)  # a run still going needs its master

    def _set_phase(self, ident: str, phase: str) -> None:
        self._registry.set_phase(ident, phase)
        if self._on_phase is not None:
            self._on_phase(ident, phase)

    # a batch, in a worker thread

    def _run_batch(self, entries: list[Entry[Launch]]) -> None:
        """Worker thread: one play for the admitted entries, from attempt directories to outcomes."""
        batch_ident = f"batch-{uuid.uuid4().hex[:12]}"
        batch_dir = self._runs_dir / ".batches" / batch_ident
        batch_dir.mkdir(mode=0o700, parents=True)
        played: list[tuple[Entry[Launch], runner.HostRun]] = []
        for entry in entries:
            if not self._may_begin(entry):
                self._registry.release(entry)  # the next poll answers why: a hold, a window, a check
                continue
            run = self._begin(entry, BatchRef(batch_dir, batch_ident, entry.payload.request.ident))
            if run is not None:
                played.append((entry, run))
        if played:
            self._play_batch(batch_dir, batch_ident, played)
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
            self._locks.pop(entry.ident, None)
            log.info("machine=%s run=%s: not started: held at its start", entry.machine, entry.ident)
        return allowed

    def _begin(self, entry: Entry[Launch], ref: BatchRef) -> runner.HostRun | None:
        """Record a new attempt of ``entry`` (its directory and ``meta.json``) and prepare its cluster side;
        the host's part of the play, or None when the cluster side kept it out (its outcome is written)."""
        request, target = entry.payload.request, entry.payload.target
        ident_dir = self._runs_dir / request.ident
        # before the new attempt exists: the lock tokens of this Machine's plays that have ended
        given = self._locks.pop(request.ident, None)
        takeover_tokens = given.takeover_tokens if given else ended_lock_tokens(ident_dir)
        lock_token = given.token if given else secrets.token_hex(16)
        stop_waiting_plays(ident_dir)  # an orphaned play at its drain point gives up
        began_in, ended = episode.enter(self._runs_dir, request)
        if ended is not None:  # a new episode: what was read of either desired state is of earlier ones
            self._attempts.pop(ended)
            self._attempts.pop(request.ident)
        number, attempt_dir = new_attempt_dir(ident_dir)
        entry.attempt = number
        meta = {
            "attempt": number,
            "started": self._clock(),
            "retry_token": entry.payload.token,
            "machine": request.machine,
            "address": target.address,
            # recorded before the play starts, so a later attempt can tell a lock left by this one
            "lock_token": lock_token,
            "episode": began_in,  # only attempts of the machine's current episode answer (episode.py)
            # it finishes a play that died past its drain point: if it dies too, the machine stays as
            # disrupted as that one left it, wherever this play gets to (outcomes.past_drain_point)
            "resumes": entry.payload.resumes,
        }
        write_json(attempt_dir / "meta.json", {**meta, "pid": os.getpid(), **ref.to_meta()})
        log.info(
            "machine=%s run=%s state=started attempt=%d host=%s source=%s batch=%s",
            request.machine,
            request.ident,
            number,
            target.address,
            target.source,
            ref.ident,
        )
        self._cluster.state(request, "Started", f"started on host {target.address} ({target.source})")
        failure = self._cluster.before_play(request)
        if failure is not None:  # no Node to drain: this Machine stays out of the play
            self._finish(entry, attempt_dir, blocked_outcome(failure, self._clock()), "not started")
            return None
        drain_before = self._cluster.drain_point(request)
        # where the play may start disrupting the machine: a later attempt tells by it (and the play's
        # events) whether a play that died had passed it (outcomes.past_drain_point)
        write_json(
            attempt_dir / "meta.json",
            {**meta, "pid": os.getpid(), **ref.to_meta(), "drain_before": drain_before},
        )
        return runner.HostRun(
            ident=request.ident,
            host_name=request.ident,  # the ident is the inventory host name
            fingerprint=request.fingerprint,
            capabilities=request.capabilities,
            inputs=request.inputs,
            target=target,
            attempt_dir=attempt_dir,
            roles=request.roles,
            lock_token=lock_token,
            takeover_tokens=takeover_tokens,
            drain_before=drain_before,
            drain_wait_seconds=self._drain_wait_seconds,
        )

    def _play_batch(
        self, batch_dir: Path, batch_ident: str, played: list[tuple[Entry[Launch], runner.HostRun]]
    ) -> None:
        """Run one ansible-playbook for the begun attempts, then classify and finish each of them."""
        hosts = tuple(run for _, run in played)
        spec = runner.BatchSpec(
            ident=batch_ident,
            batch_dir=batch_dir,
            hosts=hosts,
            playbook=self._playbook,
            ansible_cfg=self._ansible_cfg,
            state_dir=self._runs_dir,
            wrapper=self._wrapper,
            fork_server=self._fork_server,
            roles_paths=self._play.roles_paths,
            host_checks=self._play.host_checks,
            host_checks_timeout_seconds=self._host_checks_timeout,
            role_vars=self._play.role_vars,
        )
        by_ident = {run.ident: (entry, run) for entry, run in played}
        steps = StepTracker(
            [entry.payload.request for entry, _ in played],
            self._set_phase,
            self._cluster,
            on_drain_point=lambda ident: self._start_drain(by_ident[ident][1], by_ident[ident][0]),
        )
        started = time.monotonic()
        try:
            status = runner.start(spec, steps.on_task).wait()
            ended = self._clock()
            outcomes = {
                run.ident: drain_outcome(run.attempt_dir, ended)
                or classify(BatchRef(batch_dir, batch_ident, run.host_name), run.fingerprint, ended)
                for run in hosts
            }
        except runner.RunStartError as exc:
            status, ended = "not started", self._clock()
            outcomes = {
                run.ident: Outcome(OutcomeKind.INTERRUPTED, detail=str(exc), finished=ended) for run in hosts
            }
        seconds = time.monotonic() - started
        for entry, run in played:
            self._finish(entry, run.attempt_dir, outcomes[run.ident], status)
            if self._metrics is not None:
                self._metrics.run_finished(outcomes[run.ident].kind.value, seconds)

    def _start_drain(self, run: runner.HostRun, entry: Entry[Launch]) -> None:
        """The play reached ``run``'s drain point: drain in a thread of its own (the event thread serves
        every host of the batch), then tell the play waiting there how it went."""
        thread = threading.Thread(
            target=self._drain_at_point, args=(run, entry), name=f"drain-{run.ident}", daemon=True
        )
        thread.start()

    def _drain_at_point(self, run: runner.HostRun, entry: Entry[Launch]) -> None:
        request = entry.payload.request
        try:
            # the cluster side reports progress (``draining: 3 pods left``) as the entry's phase
            failure = self._cluster.drain(request, partial(self._set_phase, request.ident))
        except Exception:  # the play must hear back in any case, or it waits until its own timeout
            log.exception("machine=%s run=%s: drain failed unexpectedly", request.machine, request.ident)
            failure = Blocked("drain: failed unexpectedly (see the service log)", retriable=True)
        if failure is not None:
            done = (
                request.capabilities[: request.capabilities.index(run.drain_before)]
                if run.drain_before
                else ()
            )
            message = failure.message
            if done:  # they stay applied: say so, the host is not as it was
                message += f"; applied before the drain: {', '.join(done)}"
            write_json(
                drain_failure_file(run.attempt_dir), {"message": message, "retriable": failure.retriable}
            )
        write_json(drain_file(run.attempt_dir), {"drained": failure is None})

    def _prune(self) -> None:
        for removed in prune_batches(self._runs_dir / ".batches", BATCH_RETENTION_SECONDS, self._clock()):
            log.info("removed the artifacts of %s (older than the retention)", removed.name)

    def _finish(self, entry: Entry[Launch], attempt_dir: Path, outcome: Outcome, status: str) -> None:
        request = entry.payload.request
        self._cluster.after_play(request)  # before the outcome: a restart in between cleans up on its poll
        write_json(attempt_dir / "outcome.json", outcome.to_json())
        log.info(
            "machine=%s run=%s state=%s attempt=%d runner_status=%s %s",
            request.machine,
            request.ident,
            outcome.kind.value,
            entry.attempt,
            status,
            outcome.detail,
        )
        if outcome.kind is OutcomeKind.TASK_FAILED:
            log.warning(
                "machine=%s run=%s failed: capability=%s task=%r (artifacts: %s)",
                request.machine,
                request.ident,
                outcome.capability,
                outcome.task,
                attempt_dir,
            )
        self._load_now(request)
