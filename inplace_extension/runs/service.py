"""RunService: the UpdateMachine executor. ``await poll(request)`` answers at once (near a play's expected
end it waits for the end, a few seconds at most) and never blocks the event loop.

Each poll: an attempt in flight -> queued/running, with retryAfterSeconds from its expected end, or
(near that end) the end waited for briefly (play_time.py); else the recorded attempts decide
(policy.py): done, remembered failure, backoff wait, or (holds, windows, health checks permitting)
resolve the host and launch a new attempt. Where the attempts are recorded and how they run is the
backend's (backend.py: ``local`` in this process and on its disk, local.py; ``kubernetes``, one Job per
attempt, kubejobs/);
the decisions are the same for both. Request checks: validate.py. Built by ``inplace_extension.engine``
(for ``serve`` and ``mcm-agent``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import anyio.to_thread

from inplace_extension.errors import Unavailable
from inplace_extension.metrics import Metrics, WaitReason
from inplace_extension.runs import progress, validate
from inplace_extension.runs.attempts import Attempt, OutcomeKind
from inplace_extension.runs.backend import Backend, Launch
from inplace_extension.runs.inventory import InventorySource
from inplace_extension.runs.memo import Memo, Recent
from inplace_extension.runs.model import (
    NO_CLUSTER_SIDE,
    NO_OBJECT_HEALTH,
    ClusterSide,
    Hold,
    ObjectHealth,
    Progress,
    ProgressState,
    RunRequest,
    Unhealthy,
)
from inplace_extension.runs.play_time import NEAR_END_SECONDS, PlayTimes, retry_after
from inplace_extension.runs.policy import RETRY_ANNOTATION, Verdict, decide, retry_token
from inplace_extension.runs.resolve import (
    HostTarget,
    ResolveError,
    parse_cidrs,
    resolve_host,
    status_addresses,
)
from inplace_extension.runs.status import StatusBoard
from inplace_extension.runs.windows import Schedule
from inplace_extension.settings import Settings

log = logging.getLogger(__name__)

CLOSE_WAIT_SECONDS = 15.0
# retryAfterSeconds while an operator pauses: removing the annotation resumes within this long
PAUSE_RETRY_SECONDS = 30


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
    backend: Backend  # where attempts are recorded and how they run: local/backend.py or kubejobs/


class RunService:
    """The :class:`~inplace_extension.runs.model.Runs`: fast, durable, bounded."""

    def __init__(self, deps: RunDeps) -> None:
        settings = deps.settings
        self._clock = deps.clock
        self._allowed = parse_cidrs(settings.allowed_cidrs)
        self._address_types = tuple(settings.address_types)
        self._cluster = deps.cluster
        self._backend = deps.backend
        # what this process did already, so that the next poll does not do it again; bounded (memo.py),
        # and never the record: forgetting one only repeats work whose answer is the same
        # (ident, episode) whose settle() answered done (health gate passed): a desired state that comes
        # back after another (A -> B -> A) is a new episode, played and gated again
        self._settled: Memo[tuple[str, str]] = Memo()
        # (ident, failure) handed to cluster.failed; a failure's ident carries its episode (``_episode``)
        self._reported: Memo[tuple[str, str]] = Memo()
        self._inventory = InventorySource(settings.inventory)
        self._object_health = deps.object_health
        self._gate_seconds = settings.health_gate_timeout_seconds
        self._retry_after = settings.retry_after_seconds
        self._budget = settings.max_failed_attempts
        self._board = StatusBoard(deps.clock)
        if deps.metrics is not None:
            deps.metrics.bind_update_status(self._board.counts)
        self._windows = deps.windows
        self._play_times = PlayTimes()  # when the plays in flight are expected to end
        # ident -> the message of a not-started update last posted as an Event (a wait, a timed-out check);
        # bounded as the memos are: forgetting one posts that Event once more
        self._announced: Recent[str, str] = Recent()

    async def poll(self, request: RunRequest) -> Progress:
        problem = validate.problem(request)
        if problem is not None:
            return Progress(ProgressState.FAILED, f"InvalidRequest: {problem}")
        try:
            answer = await self._answer(request)
        except Unavailable as exc:
            answer = self._unavailable(request, exc)
        attempts = self._backend.cached(request.ident)
        started = min((a.started for a in attempts if a.started > 0), default=None)
        self._board.record(request.ident, answer, started)
        return answer

    def _unavailable(self, request: RunRequest, exc: Unavailable) -> Progress:
        """The cluster's API server away or busy (no answer, 429, 5xx) while reading or writing the record,
        the Machine or the Job: in progress, as nothing can be decided without it. Nothing is charged
        (no outcome is recorded without the API server) and nothing is posted; the next poll asks again."""
        log.warning(
            "machine=%s run=%s: cluster API unavailable: %s", request.machine, request.ident, exc.message
        )
        message = progress.api_unavailable(exc.message)
        return Progress(ProgressState.IN_PROGRESS, message, self._retry_after, unavailable=True)

    async def wait_end(self, request: RunRequest, seconds: float) -> bool:
        return await self._backend.wait_end(request, seconds)

    async def _answer(self, request: RunRequest) -> Progress:
        phase = await self._backend.reconcile(request)
        if phase is not None and self._backend.pending(request.ident):
            # its play has not begun (waiting for a slot, its Job's Pod not started): it is checked as
            # a new start, and one that may no longer start is taken back and answers why
            token = retry_token(request.annotations.get(RETRY_ANNOTATION))
            held = await self._held(request, token)
            if held is None:
                return self._in_progress(request, phase)
            if await self._backend.withdraw(request):
                log.info(
                    "machine=%s run=%s: taken back before its play: %s",
                    request.machine,
                    request.ident,
                    held.message,
                )
                return held
            phase = await self._backend.reconcile(request)  # it began (or ended) meanwhile
        if phase is not None:
            if self._remaining(request) > self._window(request):
                return self._in_progress(request, phase)
            # in its end window (or past its expected end): wait for the end, then answer from the record
            if not await self._backend.wait_end(request, NEAR_END_SECONDS):
                phase = await self._backend.reconcile(request)
                if phase is not None:
                    return self._in_progress(request, phase)
        attempts = await self._backend.attempts(request)
        self._play_times.learn(request, attempts)
        token = retry_token(request.annotations.get(RETRY_ANNOTATION))
        now = self._clock()
        standing = decide(attempts, token, now, self._retry_after, self._budget)
        if standing.verdict is Verdict.DONE:
            return await self._settle(request, attempts)
        if standing.verdict is Verdict.FAILED:
            reported = (_episode(request, attempts), standing.message)
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
        # health checks alike, when it is decided and again when its play would begin. Only a play that
        # has begun finishes: one in flight (answered above) or one whose process (or Job) died mid-play
        # past its drain point (``resumes``), which may have cordoned the Node and half changed the host.
        if standing.verdict is Verdict.START and standing.resumes:
            return await self._start_now(request, token, checked=False)
        if standing.verdict is Verdict.WAIT:
            hold = None if standing.resumes else await self._hold(request)
            if hold is not None and hold.cancel:  # the next attempt has not started: it never will
                return await self._cancelled(request, hold)
            return Progress(ProgressState.IN_PROGRESS, standing.message, standing.wait_seconds, retrying=True)
        held = await self._held(request, token)
        if held is not None:
            return held
        return await self._start_now(request, token, checked=True)

    async def held(self, request: RunRequest) -> Progress | None:
        """What keeps a new start of ``request`` back now (the operator's cancel or pause, the maintenance
        window, the ``kubernetes`` health checks), answered as :meth:`poll` answers it; None when it may
        start. For work beside the play that obeys the same holds (the MCM agent's AWS tags)."""
        return await self._held(request, retry_token(request.annotations.get(RETRY_ANNOTATION)))

    async def _held(self, request: RunRequest, token: str) -> Progress | None:
        """The start checks of a new attempt: the operator's cancel or pause, the maintenance window,
        the ``kubernetes`` health checks; the answer of the first that holds it back, None when it may
        start now."""
        hold = await self._hold(request)
        if hold is not None and hold.cancel:  # the next attempt has not started: it never will
            return await self._cancelled(request, hold)
        if hold is not None:  # paused: no new attempt starts
            await self._end_health_wait(request)  # the wait for a check begins afresh after it
            return self._waiting(request, hold.message, PAUSE_RETRY_SECONDS, "pause")
        now = self._clock()
        closed = self._windows.closed(request.labels, now)
        if closed is not None:
            await self._end_health_wait(request)
            return self._waiting(request, closed.message(), closed.retry_after(now), "window")
        if self._object_health is not NO_OBJECT_HEALTH:
            # the cluster must be healthy before this machine's next attempt starts (a started one finishes)
            unhealthy = await anyio.to_thread.run_sync(self._object_health.unhealthy, request)
            if unhealthy is not None:
                return await self._unhealthy_before_start(request, token, unhealthy)
        return None

    def _may_begin(self, request: RunRequest) -> bool:
        """The start checks once more as the attempt's play would begin (blocking: the ``local``
        executor's worker thread asks, after any wait for a slot); the next poll answers why not."""
        hold = request.hold
        if hold is None and self._cluster is not NO_CLUSTER_SIDE:
            hold = self._cluster.hold(request)
        if hold is not None or self._windows.closed(request.labels, self._clock()) is not None:
            return False
        return self._object_health.unhealthy(request) is None

    async def _start_now(self, request: RunRequest, token: str, *, checked: bool) -> Progress:
        """The attempt starts now: whatever it waited for is over. ``checked``: it is a new start, asked
        again as its play would begin (else it finishes a play begun, which nothing holds back)."""
        self._announced.pop(request.ident)  # it starts: its waits are over
        await self._end_health_wait(request)
        return await self._start(request, token, checked=checked)

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
            self._announced.set(request.ident, message)
            self._cluster.state(request, "Waiting", message)
        return Progress(ProgressState.IN_PROGRESS, message, retry_after, waiting=why)

    async def _unhealthy_before_start(
        self, request: RunRequest, token: str, unhealthy: Unhealthy
    ) -> Progress:
        """A ``kubernetes`` health check does not hold before the update starts: wait, or past the check's
        timeout (counted in the record from the first call that found it not holding: the backend's) a
        Failure naming it, with one ``Failed`` Event. Not remembered: once the check holds, the next
        call starts the update."""
        timeout = unhealthy.start_timeout_seconds
        if timeout is None:
            await self._end_health_wait(request)  # a wait for another check that has a timeout is over
            return self._waiting(request, unhealthy.waiting, self._retry_after, "health_check")
        now = self._clock()
        began = await self._backend.wait_began(request, unhealthy.check, token, now)
        if now - began < timeout:
            return self._waiting(request, unhealthy.waiting, self._retry_after, "health_check")
        failure = unhealthy.start_failure(timeout)
        if self._announced.get(request.ident) != failure:  # once; again after a new wait
            self._announced.set(request.ident, failure)
            self._cluster.state(request, "Failed", failure, warning=True)
        return Progress(ProgressState.FAILED, failure, transient=True)

    async def _end_health_wait(self, request: RunRequest) -> None:
        """Forget the wait's clock (the backend's record: never on the event loop). Only where checks of
        cluster objects are configured: else there is none to forget."""
        if self._object_health is not NO_OBJECT_HEALTH:
            await self._backend.end_wait(request)

    async def _settle(self, request: RunRequest, attempts: list[Attempt]) -> Progress:
        """Applied on the host; the health gate decides (once passed, remembered): with a cluster side
        its Node checks, then the checks of cluster objects."""
        gated = self._cluster is not NO_CLUSTER_SIDE or self._object_health is not NO_OBJECT_HEALTH
        settled = (request.ident, attempts[-1].episode)
        passed = any(a.gate_passed for a in attempts)  # the record's: any replica saw it pass
        if not gated or passed or settled in self._settled:
            return Progress(ProgressState.DONE, progress.APPLIED)
        applied = max(
            (a for a in attempts if a.outcome and a.outcome.kind is OutcomeKind.SUCCESSFUL),
            key=lambda a: a.outcome.finished if a.outcome else 0.0,
        )
        applied_at = applied.outcome.finished if applied.outcome else 0.0
        if self._cluster is not NO_CLUSTER_SIDE:
            gate = await anyio.to_thread.run_sync(self._cluster.settle, request, applied_at, applied.address)
            if gate.state is ProgressState.IN_PROGRESS:
                return Progress(gate.state, gate.message, self._retry_after, waiting="health_check")
            if gate.state is ProgressState.FAILED:
                return gate
        unhealthy = await anyio.to_thread.run_sync(self._object_health.unhealthy, request)
        if unhealthy is None:
            self._settled.add(settled)
            await self._backend.gate_passed(request, applied.number)
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
        """Admit no more runs and give the running ones ``timeout`` seconds to end (never killed)."""
        self._backend.close(timeout)

    def _remaining(self, request: RunRequest) -> float:
        """Seconds until the play in flight of ``request`` is expected to end."""
        attempts = self._backend.cached(request.ident)
        return self._play_times.remaining(request, attempts, self._clock())

    def _window(self, request: RunRequest) -> float:
        """The end window of the play in flight of ``request``."""
        return self._play_times.window(request, self._backend.cached(request.ident))

    def _in_progress(self, request: RunRequest, message: str) -> Progress:
        """An attempt in flight: ask again as its end window opens (play_time.py)."""
        window = self._window(request)
        retry = retry_after(self._remaining(request), window, self._retry_after)
        return Progress(ProgressState.IN_PROGRESS, message, retry, in_flight=True)

    async def _start(self, request: RunRequest, token: str, *, checked: bool) -> Progress:
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
        may_begin = partial(self._may_begin, request) if checked else None
        expected = self._play_times.expected(request)  # recorded with the attempt: any replica expects it
        launch = Launch(request, target, token, may_begin, expected, resumes=not checked)
        message = await self._backend.launch(launch)
        self._play_times.began(request.ident, self._clock())
        self._cluster.state(request, "Queued", "queued")
        return self._in_progress(request, message)


def _episode(request: RunRequest, attempts: list[Attempt]) -> str:
    """``request``'s ident and the episode of its last attempt: what a failure was reported for (the
    same failure in a later episode of the same desired state is reported, and cleaned up, again)."""
    return f"{request.ident}#{attempts[-1].episode if attempts else ''}"
