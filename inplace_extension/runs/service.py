"""RunService: the UpdateMachine executor. ``await poll(request)`` answers at once and never blocks.

Each poll: a run in flight here -> queued/running; else the attempts on disk decide (policy.py): done,
remembered failure, backoff wait, or resolve the host and queue a new attempt. Attempts run in worker
threads (registry.py) through the ansible-runner adapter (runner.py); their outcome is summarised into
the attempt directory, so a restarted service answers from disk. Request checks: validate.py; held
polls: waiters.py; phases: steps.py. Built by ``inplace_extension.engine`` (for ``serve`` and ``mcm-agent``).
"""

from __future__ import annotations

import logging
import os
import secrets
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Final

import anyio.to_thread

from inplace_extension.metrics import Metrics, WaitReason
from inplace_extension.runs import health_wait, model, progress, runner, ssh, validate
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
from inplace_extension.runs.inventory import InventorySource
from inplace_extension.runs.memo import Memo
from inplace_extension.runs.model import (
    NO_CLUSTER_SIDE,
    NO_OBJECT_HEALTH,
    Blocked,
    ClusterSide,
    Hold,
    ObjectHealth,
    Progress,
    ProgressState,
    RunRequest,
    Unhealthy,
)
from inplace_extension.runs.outcomes import classify, load_attempts
from inplace_extension.runs.policy import RETRY_ANNOTATION, Verdict, decide, retry_token
from inplace_extension.runs.registry import Job, RunRegistry
from inplace_extension.runs.resolve import (
    HostTarget,
    ResolveError,
    parse_cidrs,
    resolve_host,
    status_addresses,
)
from inplace_extension.runs.status import StatusBoard
from inplace_extension.runs.steps import StepTracker, blocked_outcome, drain_outcome
from inplace_extension.runs.waiters import EndWaiters
from inplace_extension.runs.windows import Schedule
from inplace_extension.settings import Settings

log = logging.getLogger(__name__)

CLOSE_WAIT_SECONDS = 15.0
# How long a poll for a run in flight may wait for it to end before answering "running". Well inside
# UpdateMachine's timeoutSeconds (10 in the hook table); it turns "done" around without waiting for
# CAPI's next retryAfterSeconds (at least 1 s) to pass.
LONG_POLL_SECONDS = 2.0
# Runs queued within this window share one ansible-playbook (one Ansible start-up, forks): CAPI
# polls the Machines of a rollout in quick succession.
BATCH_WINDOW_SECONDS = 0.15
# retryAfterSeconds while an operator pauses: removing the annotation resumes within this long
PAUSE_RETRY_SECONDS = 30
# Beyond the drain timeout, how long a play waits at its drain point (cordon, API retries, the file write)
DRAIN_POINT_MARGIN_SECONDS = 120
# Finished plays' ansible-runner artifacts (events, stdout) are kept this long for operators to read.
BATCH_RETENTION_SECONDS = 7 * 24 * 3600


@dataclass(frozen=True)
class _Pending:
    """What a queued job needs to run: the request, where it goes, the retry token it started with."""

    request: RunRequest
    target: HostTarget
    token: str


@dataclass(frozen=True, kw_only=True)
class PlayConfig:
    """What the capabilities file adds to every play: user-defined roles' directories, the health gate's
    command checks (run on the host before the stamp) and the roles' settings (extra vars)."""

    roles_paths: tuple[Path, ...]
    host_checks: tuple[model.HostCheck, ...]
    role_vars: Mapping[str, Any]


# no capabilities file: the shipped roles only, no command checks, no role settings
NO_PLAY_CONFIG: Final = PlayConfig(roles_paths=(), host_checks=(), role_vars={})


@dataclass(frozen=True, kw_only=True)
class RunDeps:
    """Everything a :class:`RunService` is built from, each named by its caller (``engine.py``, tests):
    no default stands in for one that was forgotten."""

    settings: Settings
    metrics: Metrics | None  # None: nothing exported (tests, commands without /metrics)
    cluster: ClusterSide  # what a run does in the cluster around its play; NO_CLUSTER_SIDE without access
    object_health: ObjectHealth  # checks of cluster objects around each update; NO_OBJECT_HEALTH: none
    windows: Schedule  # when a new update may start; NO_WINDOWS: any time
    clock: Callable[[], float]  # wall-clock seconds (time.time; tests pass their own)
    play: PlayConfig


class RunService:
    """The :class:`~inplace_extension.runs.model.Executor`: fast, durable, bounded."""

    def __init__(self, deps: RunDeps) -> None:
        settings = deps.settings
        self._clock = deps.clock
        self._runs_dir = settings.runs_dir.expanduser().resolve()
        self._runs_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._allowed = parse_cidrs(settings.allowed_cidrs)
        self._address_types = tuple(settings.address_types)
        self._cluster = deps.cluster
        # what this process did already, so that the next poll does not do it again; bounded (memo.py),
        # and never the record: forgetting one only repeats work whose answer is the same
        self._settled: Memo[str] = Memo()  # idents whose settle() answered done (health gate passed)
        self._reported: Memo[tuple[str, str]] = Memo()  # (ident, failure) handed to cluster.failed
        self._inventory = InventorySource(settings.inventory)
        self._playbook, self._ansible_cfg = runner.locate_playbook(settings.playbooks_dir)
        self._wrapper = runner.install_wrapper(self._runs_dir)
        self._play = deps.play
        self._host_checks_timeout = settings.health_gate_timeout_seconds
        self._object_health = deps.object_health
        self._gate_seconds = settings.health_gate_timeout_seconds
        # a play at its drain point waits this long for the drain's end (it has its own timeout)
        self._drain_wait_seconds = settings.drain_timeout_seconds + DRAIN_POINT_MARGIN_SECONDS
        self._prune()
        self._retry_after = settings.retry_after_seconds
        self._budget = settings.max_failed_attempts
        self._registry: RunRegistry[_Pending] = RunRegistry(
            settings.max_parallel_runs, self._run_batch, window=BATCH_WINDOW_SECONDS
        )
        self._metrics = deps.metrics
        self._board = StatusBoard(deps.clock)
        if deps.metrics is not None:
            deps.metrics.bind_run_gauges(self._registry.running_count, self._registry.queued_count)
            deps.metrics.bind_update_status(self._board.counts)
        self._cache_lock = threading.Lock()
        self._attempts: dict[str, list[Attempt]] = {}  # ident -> attempts on disk (cache)
        self._ends = EndWaiters()
        self._windows = deps.windows
        # ident -> the message of a not-started update last posted as an Event (a wait, a timed-out check)
        self._announced: dict[str, str] = {}

    async def poll(self, request: RunRequest) -> Progress:
        problem = validate.problem(request)
        if problem is not None:
            return Progress(ProgressState.FAILED, f"InvalidRequest: {problem}")
        answer = await self._answer(request)
        attempts = self._cached(request.ident) or ()
        started = min((a.started for a in attempts if a.started > 0), default=None)
        self._board.record(request.ident, answer, started)
        return answer

    async def _answer(self, request: RunRequest) -> Progress:
        view = self._registry.view(request.ident)
        if view is not None:
            # hold the call briefly: a run ending meanwhile is answered now, not a retryAfterSeconds later
            await self._ends.hold(request.ident, LONG_POLL_SECONDS, self._registry.view)
            view = self._registry.view(request.ident)
            if view is not None:
                return self._in_progress(view.message())
        attempts = self._cached(request.ident)
        if attempts is None:
            attempts = await anyio.to_thread.run_sync(self._load, request)
        token = retry_token(request.annotations.get(RETRY_ANNOTATION))
        now = self._clock()
        standing = decide(attempts, token, now, self._retry_after, self._budget)
        if standing.verdict is Verdict.DONE:
            return await self._settle(request, attempts)
        if standing.verdict is Verdict.FAILED:
            reported = (request.ident, standing.message)
            # once, unless the clean-up could not be done (the API server away): then on the next poll
            if (
                reported not in self._reported
                and self._cluster is not NO_CLUSTER_SIDE
                and await anyio.to_thread.run_sync(self._cluster.failed, request, standing.message)
            ):
                self._reported.add(reported)
            return Progress(ProgressState.FAILED, standing.message, blocked=standing.blocked)
        # Every new attempt (the first, one after a retry backoff, one after the retry annotation) is a
        # new start: it obeys the operator's cancel and pause, the maintenance window and the kubernetes
        # health checks alike. Only a play that has started finishes: one in flight (answered above) or
        # one whose process died mid-play (``resumes``), which must also undo what it did in the cluster.
        if standing.verdict is Verdict.START and standing.resumes:
            return await self._start_now(request, token)
        hold = await self._hold(request)
        if hold is not None and hold.cancel:  # the next attempt has not started: it never will
            return await self._cancelled(request, hold)
        if standing.verdict is Verdict.WAIT:
            return Progress(ProgressState.IN_PROGRESS, standing.message, standing.wait_seconds, retrying=True)
        if hold is not None:  # paused: no new attempt starts
            await self._end_health_wait(request)  # the wait for a check begins afresh after it
            return self._waiting(request, hold.message, PAUSE_RETRY_SECONDS, "pause")
        closed = self._windows.closed(request.labels, now)
        if closed is not None:
            await self._end_health_wait(request)
            return self._waiting(request, closed.message(), closed.retry_after(now), "window")
        if self._object_health is not NO_OBJECT_HEALTH:
            # the cluster must be healthy before this machine's next attempt starts (a started one finishes)
            unhealthy = await anyio.to_thread.run_sync(self._object_health.unhealthy, request)
            if unhealthy is not None:
                return await self._unhealthy_before_start(request, token, unhealthy)
        return await self._start_now(request, token)

    async def _start_now(self, request: RunRequest, token: str) -> Progress:
        """The attempt starts now: whatever it waited for is over."""
        self._announced.pop(request.ident, None)  # it starts: its waits are over
        await self._end_health_wait(request)
        return await self._start(request, token)

    async def _hold(self, request: RunRequest) -> Hold | None:
        """The operator's hold on this machine: the one the request carries (the MCM agent reads it with
        the desired state), else the cluster side's (read in a worker thread), else none."""
        if request.hold is not None or self._cluster is NO_CLUSTER_SIDE:
            return request.hold
        return await anyio.to_thread.run_sync(self._cluster.hold, request)

    async def _cancelled(self, request: RunRequest, hold: Hold) -> Progress:
        """Cancelled before its next attempt started: a Failure saying by whom, one ``Cancelled`` Event;
        not remembered (typed ``cancelled``), so once the annotation is gone a later call starts it."""
        await self._end_health_wait(request)
        if (request.ident, hold.message) not in self._reported:
            self._reported.add((request.ident, hold.message))
            self._cluster.state(request, "Cancelled", hold.message, warning=True)
        return Progress(ProgressState.FAILED, hold.message, cancelled=True)

    def _waiting(self, request: RunRequest, message: str, retry_after: int, why: WaitReason) -> Progress:
        """Not started, and not now: an Event the first time this Machine waits for this."""
        if self._announced.get(request.ident) != message:
            self._announced[request.ident] = message
            self._cluster.state(request, "Waiting", message)
        return Progress(ProgressState.IN_PROGRESS, message, retry_after, waiting=why)

    async def _unhealthy_before_start(
        self, request: RunRequest, token: str, unhealthy: Unhealthy
    ) -> Progress:
        """A ``kubernetes`` health check does not hold before the update starts: wait, or past the check's
        timeout (counted on disk from the first call that found it not holding, health_wait.py) a
        Failure naming it, with one ``Failed`` Event. Not remembered: once the check holds, the next
        call starts the update."""
        ident_dir = self._runs_dir / request.ident
        timeout = unhealthy.start_timeout_seconds
        if timeout is None:
            await self._end_health_wait(request)  # a wait for another check that has a timeout is over
            return self._waiting(request, unhealthy.waiting, self._retry_after, "health_check")
        now = self._clock()
        began = await anyio.to_thread.run_sync(health_wait.began, ident_dir, unhealthy.check, token, now)
        if now - began < timeout:
            return self._waiting(request, unhealthy.waiting, self._retry_after, "health_check")
        failure = unhealthy.start_failure(timeout)
        if self._announced.get(request.ident) != failure:  # once; again after a new wait
            self._announced[request.ident] = failure
            self._cluster.state(request, "Failed", failure, warning=True)
        return Progress(ProgressState.FAILED, failure, transient=True)

    async def _end_health_wait(self, request: RunRequest) -> None:
        """Remove the wait's clock (health_wait.py), in a worker thread: the event loop never waits on the
        disk. Only where checks of cluster objects are configured: else there is none to remove."""
        if self._object_health is not NO_OBJECT_HEALTH:
            await anyio.to_thread.run_sync(health_wait.end, self._runs_dir / request.ident)

    async def _settle(self, request: RunRequest, attempts: list[Attempt]) -> Progress:
        """Applied on the host; the health gate decides (once passed, remembered): with a cluster side
        its Node checks, then the checks of cluster objects."""
        gated = self._cluster is not NO_CLUSTER_SIDE or self._object_health is not NO_OBJECT_HEALTH
        if not gated or request.ident in self._settled:
            return Progress(ProgressState.DONE, progress.APPLIED)
        applied = max(
            (a for a in attempts if a.outcome and a.outcome.kind is OutcomeKind.SUCCESSFUL),
            key=lambda a: a.outcome.finished if a.outcome else 0.0,
        )
        applied_at = applied.outcome.finished if applied.outcome else 0.0
        if self._cluster is not NO_CLUSTER_SIDE:
            settled = await anyio.to_thread.run_sync(
                self._cluster.settle, request, applied_at, applied.address
            )
            if settled.state is ProgressState.IN_PROGRESS:
                return Progress(settled.state, settled.message, self._retry_after, waiting="health_check")
            if settled.state is ProgressState.FAILED:
                return settled
        unhealthy = await anyio.to_thread.run_sync(self._object_health.unhealthy, request)
        if unhealthy is None:
            self._settled.add(request.ident)
            self._cluster.state(request, "Done", progress.APPLIED)
            return Progress(ProgressState.DONE, progress.APPLIED)
        if self._clock() - applied_at < self._gate_seconds:
            message = progress.health_waiting(unhealthy.waiting)
            return Progress(ProgressState.IN_PROGRESS, message, self._retry_after, waiting="health_check")
        failure = unhealthy.failure(self._gate_seconds)
        self._cluster.state(request, "Failed", failure, warning=True)
        return Progress(ProgressState.FAILED, failure)

    def hosts_problem(self) -> str | None:
        """Why no UpdateMachine can reach a host with the settings as they are, or None: every address
        must be inside --allowed-cidrs, so with none no run can start (``serve`` warns, ``/readyz`` says)."""
        if self._allowed:
            return None
        entries = "" if self._inventory.current().hosts else ", and the inventory has no entry"
        return (
            "UpdateMachine cannot reach any host: no --allowed-cidrs (nothing is allowed until configured)"
            + entries
        )

    def close(self, timeout: float = CLOSE_WAIT_SECONDS) -> None:
        """Admit no more runs and give the running ones ``timeout`` seconds to end.

        Runs are never killed: one still going when the process exits finishes on its own (detach.py),
        and the next service's attempt waits for its host lock and finds the stamp.
        """
        deadline = time.monotonic() + timeout
        threads = self._registry.close()
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        if not any(thread.is_alive() for thread in threads):
            ssh.close_control_masters(self._runs_dir)  # a run still going needs its master

    def _in_progress(self, message: str) -> Progress:
        return Progress(ProgressState.IN_PROGRESS, message, self._retry_after)

    def _cached(self, ident: str) -> list[Attempt] | None:
        with self._cache_lock:
            return self._attempts.get(ident)

    def _load(self, request: RunRequest) -> list[Attempt]:
        attempts = load_attempts(self._runs_dir / request.ident, request.fingerprint)
        with self._cache_lock:
            self._attempts[request.ident] = attempts
        return attempts

    async def _start(self, request: RunRequest, token: str) -> Progress:
        inventory = self._inventory.current()

        # the machine's status.addresses: those the request carries (the MCM agent's Node), else the live
        # Machine's, read (blocking) only in the Kubernetes-aware mode and only when needed
        reads_cluster = request.addresses is None and self._cluster is not NO_CLUSTER_SIDE
        live = partial(self._cluster.addresses, request) if self._cluster is not NO_CLUSTER_SIDE else None
        addresses = status_addresses(request.addresses, live)

        def resolve() -> HostTarget:
            return resolve_host(
                request.namespace,
                request.name,
                request.labels,
                request.annotations,
                inventory,
                self._allowed,
                addresses,
                self._address_types,
            )

        try:
            target = await anyio.to_thread.run_sync(resolve) if reads_cluster else resolve()
        except ResolveError as exc:
            log.warning("machine=%s run=%s: %s", request.machine, request.ident, exc)
            return Progress(ProgressState.FAILED, str(exc))
        pending = _Pending(request, target, token)
        self._registry.submit(
            Job(request.ident, request.machine, pending, on_done=partial(self._ends.ended, request.ident))
        )
        self._cluster.state(request, "Queued", "queued")
        view = self._registry.view(request.ident)
        if view is None:  # it already ended (or the service is closing): the next poll reads the result
            return self._in_progress(progress.running(progress.STARTING))
        return self._in_progress(view.message())

    def _run_batch(self, jobs: list[Job[_Pending]]) -> None:
        """Worker thread: one play for the admitted jobs, from attempt directories to outcomes."""
        batch_ident = f"batch-{uuid.uuid4().hex[:12]}"
        batch_dir = self._runs_dir / ".batches" / batch_ident
        batch_dir.mkdir(mode=0o700, parents=True)
        played: list[tuple[Job[_Pending], runner.HostRun]] = []
        for job in jobs:
            run = self._begin(job, BatchRef(batch_dir, batch_ident, job.payload.request.ident))
            if run is not None:
                played.append((job, run))
        if played:
            self._play_batch(batch_dir, batch_ident, played)
        self._prune()

    def _begin(self, job: Job[_Pending], ref: BatchRef) -> runner.HostRun | None:
        """Record a new attempt of ``job`` (its directory and ``meta.json``) and prepare its cluster side;
        the host's part of the play, or None when the cluster side kept it out (its outcome is written)."""
        request, target = job.payload.request, job.payload.target
        ident_dir = self._runs_dir / request.ident
        # before the new attempt exists: the lock tokens of this Machine's plays that have ended
        takeover_tokens = ended_lock_tokens(ident_dir)
        lock_token = secrets.token_hex(16)
        stop_waiting_plays(ident_dir)  # an orphaned play at its drain point gives up
        number, attempt_dir = new_attempt_dir(ident_dir)
        job.attempt = number
        meta = {
            "attempt": number,
            "started": self._clock(),
            "retry_token": job.payload.token,
            "machine": request.machine,
            "address": target.address,
            # recorded before the play starts, so a later attempt can tell a lock left by this one
            "lock_token": lock_token,
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
            self._finish(job, attempt_dir, blocked_outcome(failure, self._clock()), "not started")
            return None
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
            drain_before=self._cluster.drain_point(request),
            drain_wait_seconds=self._drain_wait_seconds,
        )

    def _play_batch(
        self, batch_dir: Path, batch_ident: str, played: list[tuple[Job[_Pending], runner.HostRun]]
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
            roles_paths=self._play.roles_paths,
            host_checks=self._play.host_checks,
            host_checks_timeout_seconds=self._host_checks_timeout,
            role_vars=self._play.role_vars,
        )
        by_ident = {run.ident: (job, run) for job, run in played}
        steps = StepTracker(
            [job.payload.request for job, _ in played],
            self._registry.set_phase,
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
        for job, run in played:
            self._finish(job, run.attempt_dir, outcomes[run.ident], status)
            if self._metrics is not None:
                self._metrics.run_finished(outcomes[run.ident].kind.value, seconds)

    def _start_drain(self, run: runner.HostRun, job: Job[_Pending]) -> None:
        """The play reached ``run``'s drain point: drain in a thread of its own (the event thread serves
        every host of the batch), then tell the play waiting there how it went."""
        thread = threading.Thread(
            target=self._drain_at_point, args=(run, job), name=f"drain-{run.ident}", daemon=True
        )
        thread.start()

    def _drain_at_point(self, run: runner.HostRun, job: Job[_Pending]) -> None:
        request = job.payload.request
        try:
            # the cluster side reports progress (``draining: 3 pods left``) as the job's phase
            failure = self._cluster.drain(request, partial(self._registry.set_phase, request.ident))
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

    def _finish(self, job: Job[_Pending], attempt_dir: Path, outcome: Outcome, status: str) -> None:
        request = job.payload.request
        self._cluster.after_play(request)  # before the outcome: a restart in between cleans up on its poll
        write_json(attempt_dir / "outcome.json", outcome.to_json())
        log.info(
            "machine=%s run=%s state=%s attempt=%d runner_status=%s %s",
            request.machine,
            request.ident,
            outcome.kind.value,
            job.attempt,
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
        self._load(request)
