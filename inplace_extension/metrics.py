"""Prometheus metrics of the service: one :class:`Metrics` per app, each with its own CollectorRegistry.

The app creates one ``Metrics``, calls :meth:`Metrics.observe_hook` once per hook answer, gives the run
service :meth:`Metrics.run_finished` and the two gauges, and mounts :meth:`Metrics.endpoint` at
``/metrics``. Nothing here is global: two apps in one process (tests) never see each other's numbers.
Label values come from our own tables (hook names, run outcomes), never from request data, so the
number of time series stays bounded.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final, Literal, get_args

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import choose_encoder
from starlette.requests import Request
from starlette.responses import Response

NAMESPACE: Final = "inplace_extension"

HookStatus = Literal["Success", "Failure"]
"""The ``status`` of a hook answer as CAPI reads it (docs/capi-hooks.md §3.2)."""

RunOutcome = Literal["successful", "task_failed", "unreachable", "host_busy", "interrupted", "withdrawn"]
"""How a run ended: the values of ``inplace_extension.runs.attempts.OutcomeKind`` (successful; a task failed;
SSH never connected; the host lock was held by another run; killed or no proof of completion; taken
back by a hold before its play began)."""

WaitReason = Literal["window", "pause", "health_check"]
"""Why an update waits without a run in flight: outside its maintenance window; paused; its health gate."""


@dataclass(frozen=True)
class UpdateCounts:
    """Where the updates asked about lately stand (``inplace_extension.runs.status``)."""

    waiting: Mapping[WaitReason, int]
    blocked: int  # retry budget spent: blocked until the retry annotation changes
    failed: int  # a Failure other than blocked (a task failed, a health check timed out, a cancel)
    oldest_update_seconds: float  # age of the oldest update started and not done (0: none)


HOOK_STATUSES: Final[frozenset[str]] = frozenset(get_args(HookStatus))
RUN_OUTCOMES: Final[frozenset[str]] = frozenset(get_args(RunOutcome))

# A hook answers within its timeoutSeconds, at most 30 s (docs/capi-hooks.md §1.4); we aim for < 1 s.
HOOK_BUCKETS: Final = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
# A run is a playbook over SSH: seconds for a no-op (stamp already applied) up to an hour for an upgrade.
RUN_BUCKETS: Final = (1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0, 3600.0)

# Hook label values are names from the HOOKS table ("Discovery", "CanUpdateMachine", ...).
_HOOK_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9]{0,63}$")


@dataclass(frozen=True)
class Family:
    """One metric family we export, named ``inplace_extension_<name>`` (:data:`FAMILIES`)."""

    kind: Literal["counter", "gauge", "histogram"]
    help: str
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] = ()  # histograms only


# Every metric family of the service and the MCM agent: the one table of names, kinds, help and labels.
FAMILIES: Final[Mapping[str, Family]] = {
    # the service (``serve``, and the run service the MCM agent shares)
    "hook_calls": Family(
        "counter", "Hook answers by hook and status (Success or Failure as sent to CAPI).", ("hook", "status")
    ),
    "hook_duration_seconds": Family(
        "histogram",
        "Time from receiving a hook request to having its answer, by hook.",
        ("hook",),
        HOOK_BUCKETS,
    ),
    "runs": Family("counter", "Finished update runs by outcome.", ("outcome",)),
    "run_duration_seconds": Family(
        "histogram", "Wall-clock duration of finished update runs (all outcomes).", buckets=RUN_BUCKETS
    ),
    "runs_in_flight": Family("gauge", "Update runs executing now."),
    "run_queue_length": Family("gauge", "Update runs waiting in the FIFO queue for a free slot."),
    "updates_waiting": Family(
        "gauge",
        "Updates waiting without a run in flight, by reason: window (outside its maintenance window), "
        "pause, health_check (a kubernetes health check before the start, or the health gate after "
        "the play).",
        ("reason",),
    ),
    "updates_blocked": Family(
        "gauge", "Updates blocked after their retry budget (--max-failed-attempts) was spent."
    ),
    "updates_failed": Family(
        "gauge",
        "Updates answered with a Failure other than blocked (a task failed, the health gate, a health "
        "check past its timeout before the start, a cancel).",
    ),
    "oldest_update_age_seconds": Family(
        "gauge",
        "Age of the oldest update started and not done (running, retrying, health gate); 0 if none.",
    ),
    # the MCM agent's own (:mod:`inplace_extension.mcm.metrics`)
    "mcm_nodes_updating": Family("gauge", "Nodes whose in-place update this agent is running now."),
    "mcm_update_results": Family(
        "counter", "Results written to Nodes (update-result label) by value.", ("result",)
    ),
    "mcm_critical_taints_removed": Family(
        "counter", "critical-components-not-ready taints removed after MCM finished a Node."
    ),
}


class Metrics:
    """The service's metrics, registered in a private :class:`CollectorRegistry`."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._hook_calls = self.counter("hook_calls")
        self._hook_seconds = self.histogram("hook_duration_seconds")
        self._runs = self.counter("runs")
        self._run_seconds = self.histogram("run_duration_seconds")
        self._in_flight = self.gauge("runs_in_flight")
        self._queue_length = self.gauge("run_queue_length")
        self._waiting = self.gauge("updates_waiting")
        self._blocked = self.gauge("updates_blocked")
        self._failed = self.gauge("updates_failed")
        self._oldest = self.gauge("oldest_update_age_seconds")
        # the labelled series of each (hook, status) seen, so an answer costs no label lookup (bounded:
        # hook names come from the HOOKS table, statuses are two)
        self._hook_series: dict[tuple[str, str], tuple[Counter, Histogram]] = {}
        # Pre-create the outcome series so a dashboard shows 0 rather than "no data" before the first run.
        for outcome in sorted(RUN_OUTCOMES):
            self._runs.labels(outcome=outcome)

    def counter(self, name: str) -> Counter:
        """The counter ``name`` of :data:`FAMILIES`, registered here."""
        family = _family(name, "counter")
        return Counter(name, family.help, family.labels, namespace=NAMESPACE, registry=self.registry)

    def gauge(self, name: str) -> Gauge:
        """The gauge ``name`` of :data:`FAMILIES`, registered here."""
        family = _family(name, "gauge")
        return Gauge(name, family.help, family.labels, namespace=NAMESPACE, registry=self.registry)

    def histogram(self, name: str) -> Histogram:
        """The histogram ``name`` of :data:`FAMILIES`, registered here."""
        family = _family(name, "histogram")
        return Histogram(
            name,
            family.help,
            family.labels,
            namespace=NAMESPACE,
            registry=self.registry,
            buckets=family.buckets,
        )

    def observe_hook(self, hook: str, status: HookStatus, seconds: float) -> None:
        """Count one hook answer and record how long it took."""
        series = self._hook_series.get((hook, status))
        if series is None:  # first answer of this hook with this status: check the labels once
            if not _HOOK_NAME.match(hook):
                raise ValueError(f"hook label must be a hook name from the HOOKS table, got {hook!r}")
            if status not in HOOK_STATUSES:
                raise ValueError(f"hook status must be one of {sorted(HOOK_STATUSES)}, got {status!r}")
        duration = _duration(seconds)  # validated before anything is recorded
        if series is None:
            series = self._hook_calls.labels(hook=hook, status=status), self._hook_seconds.labels(hook=hook)
            self._hook_series[(hook, status)] = series
        calls, seconds_histogram = series
        calls.inc()
        seconds_histogram.observe(duration)

    def run_finished(self, outcome: str, seconds: float) -> None:
        """Count one finished run and record its duration. ``outcome`` is a :data:`RunOutcome` value;
        it is typed ``str`` so ``OutcomeKind.value`` passes as is, and checked here instead."""
        if outcome not in RUN_OUTCOMES:
            raise ValueError(f"run outcome must be one of {sorted(RUN_OUTCOMES)}, got {outcome!r}")
        duration = _duration(seconds)
        self._runs.labels(outcome=outcome).inc()
        self._run_seconds.observe(duration)

    def set_runs_in_flight(self, count: int) -> None:
        self._in_flight.set(_count(count, "runs in flight"))

    def set_queue_length(self, count: int) -> None:
        self._queue_length.set(_count(count, "queue length"))

    def bind_run_gauges(self, runs_in_flight: Callable[[], int], queue_length: Callable[[], int]) -> None:
        """Read both gauges from the run service at scrape time instead of being told every change."""
        self._in_flight.set_function(lambda: _count(runs_in_flight(), "runs in flight"))
        self._queue_length.set_function(lambda: _count(queue_length(), "queue length"))

    def bind_update_status(self, read: Callable[[], UpdateCounts]) -> None:
        """Read the update gauges from the run service's status board at scrape time."""

        def waiting(reason: WaitReason) -> Callable[[], float]:
            return lambda: read().waiting[reason]

        for reason in get_args(WaitReason):
            self._waiting.labels(reason=reason).set_function(waiting(reason))
        self._blocked.set_function(lambda: read().blocked)
        self._failed.set_function(lambda: read().failed)
        self._oldest.set_function(lambda: read().oldest_update_seconds)

    def render(self, accept: str = "") -> tuple[bytes, str]:
        """The exposition text for an ``Accept`` header: (body, content type). OpenMetrics when asked for."""
        encoder, content_type = choose_encoder(accept)
        return encoder(self.registry), content_type

    async def endpoint(self, request: Request) -> Response:
        """Starlette endpoint for ``GET /metrics``."""
        body, content_type = self.render(request.headers.get("accept", ""))
        return Response(body, media_type=content_type)


def _family(name: str, kind: str) -> Family:
    family = FAMILIES[name]
    if family.kind != kind:
        raise ValueError(f"metric {name} is a {family.kind}, not a {kind}")
    return family


def _duration(seconds: float) -> float:
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"a duration must be a finite number of seconds >= 0, got {seconds!r}")
    return seconds


def _count(value: int, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{what} must be an integer >= 0, got {value!r}")
    return value
