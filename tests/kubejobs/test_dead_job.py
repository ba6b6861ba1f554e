"""A Job that died mid-play (its Pod deleted, evicted, killed, out of time; the Job gone) with the
``kubernetes`` executor (docs/operator-controls.md, "Plays that run unchecked"): the attempt after it
finishes what it began, unchecked, when its play had passed its drain point (the Node may be cordoned,
the host half changed) or nobody can tell that it had not; when it had not, nothing was disrupted and
the attempt after it is a new start, which the cancel, the pause, the windows and the health checks hold
back. Against the in-memory fake of the ``kube`` ports (tests/kubefake.py); what a Job reports of its
own play is tests/kubejobs/test_attempt.py's."""

from __future__ import annotations

from dataclasses import replace

import pytest
from kubefake import FakeJob, FakeJobs
from run_deps import run_service
from runs.test_service import Clock, utc

from inplace_extension.kubejobs.spec import termination_message
from inplace_extension.runs.attempts import Outcome, OutcomeKind
from inplace_extension.runs.model import Hold, Progress, ProgressState, RunRequest
from inplace_extension.runs.service import RunService
from inplace_extension.runs.windows import MaintenanceWindow, Schedule
from inplace_extension.settings import Settings
from kubejobs.support import START_SECONDS

from .test_backend import (
    CANCELLED,
    PAUSED,
    STARTING,
    UNSCHEDULABLE,
    job_of,
    machine_backend,
    pending_pod,
    record,
    req,
    spec_of,
)

pytestmark = pytest.mark.anyio

RETRYING = "run interrupted, retrying (attempt 2)"
# a window from 22:00 to 23:00 UTC every night: the first attempt starts inside it, at 22:30; its Job
# dies, and the attempt after it is decided from 23:30, when it is closed
NIGHTS = Schedule((MaintenanceWindow("nights", "0 22 * * *", 3600),))
WINDOW = 'waiting for maintenance window "nights" (opens 2026-12-02T22:00Z)'
CLOSED = utc("2026-12-01T23:30:00")
SUCCESSFUL = Outcome(OutcomeKind.SUCCESSFUL)


@pytest.fixture
def clock() -> Clock:
    return Clock(utc("2026-12-01T22:30:00"))


def replica(settings: Settings, cluster: FakeJobs, clock: Clock) -> RunService:
    """A fresh replica with the nightly window: its own (empty) memory, the cluster shared."""
    return run_service(settings, windows=NIGHTS, clock=clock, backend=machine_backend(cluster, clock))


def held(hold: Hold) -> RunRequest:
    return replace(req(), hold=hold)


def job(cluster: FakeJobs, attempt: int) -> FakeJob:
    name = job_of(cluster, attempt)
    return next(j for (_, n), j in cluster.jobs.items() if n == name)


def died(past_drain_point: bool, now: float) -> str:
    """The termination message of a Job whose play was stopped mid-way (SIGTERM: its Pod deleted or
    evicted), saying, as kubejobs/attempt.py does, whether it had passed its drain point."""
    stopped = Outcome(
        OutcomeKind.INTERRUPTED,
        detail="the attempt was stopped (SIGTERM: its Pod was deleted or evicted)",
        finished=now,
        died_past_drain_point=past_drain_point,
    )
    return termination_message(stopped)


async def test_a_job_that_died_before_its_drain_point_is_followed_by_a_new_start(
    settings: Settings, cluster: FakeJobs, clock: Clock
) -> None:
    """Nothing was disrupted: after its backoff the next attempt waits for the window, waits while
    paused, is failed by a cancel, and starts once nothing holds it back, as a new start (checked again
    while its Pod waits to start)."""
    svc = replica(settings, cluster, clock)
    assert await svc.poll(req()) == STARTING
    clock.now = CLOSED  # its Job dies as the window has closed
    cluster.finish(job_of(cluster, 1), died(False, clock.now))
    assert (await svc.poll(req())).message == RETRYING
    clock.now += 2  # past the backoff
    closed = await svc.poll(req())
    assert (closed.message, closed.waiting, closed.in_flight) == (WINDOW, "window", False)
    clock.now = utc("2026-12-02T22:00:00")  # the window opens
    paused = await svc.poll(held(PAUSED))
    assert (paused.message, paused.waiting, paused.in_flight) == (PAUSED.message, "pause", False)
    cancelled = Progress(ProgressState.FAILED, CANCELLED.message, cancelled=True)
    assert await replica(settings, cluster, clock).poll(held(CANCELLED)) == cancelled
    assert len(cluster.jobs) == 1, "no attempt started while held"
    assert await svc.poll(req()) == STARTING
    assert not spec_of(cluster, 2).resumes and not record(cluster).attempts[-1].resumes
    job(cluster, 2).pending = True  # its Pod waits to start: a pause now takes it back
    assert (await svc.poll(held(PAUSED))).waiting == "pause"
    withdrawn = record(cluster).attempts[-1].outcome
    assert withdrawn is not None and withdrawn.kind is OutcomeKind.WITHDRAWN


@pytest.mark.parametrize("how", ["stopped-past-its-drain-point", "killed-without-an-outcome", "job-gone"])
async def test_a_job_that_died_past_its_drain_point_or_not_known_is_finished_unchecked(
    settings: Settings, cluster: FakeJobs, clock: Clock, how: str
) -> None:
    """Its play may have disrupted the machine (the Node cordoned, the host half changed): the next
    attempt finishes it whatever holds a new start back (a closed window, a pause, a cancel), also while
    its Pod waits to start. A Job that ended without a word, or is gone, may have passed its drain point
    as far as anybody can tell: the safe side is to finish it (kubejobs/backend.py says why)."""
    svc = replica(settings, cluster, clock)
    assert await svc.poll(req()) == STARTING
    first = job_of(cluster, 1)
    clock.now = CLOSED  # its Job dies as the window has closed (gone: long after it began)
    if how == "stopped-past-its-drain-point":
        cluster.finish(first, died(True, clock.now))
    elif how == "killed-without-an-outcome":
        cluster.finish(first, None)
    else:
        cluster.expire_job(first)
    answer = await svc.poll(held(CANCELLED))
    assert (answer.message, answer.retrying) == (RETRYING, True), "not cancelled: it is resumed"
    (dead,) = record(cluster).attempts
    assert dead.outcome is not None and dead.outcome.died_past_drain_point
    clock.now += 2  # past the backoff; the window closed, and paused
    assert await svc.poll(held(PAUSED)) == STARTING
    assert spec_of(cluster, 2).resumes and record(cluster).attempts[-1].resumes
    job(cluster, 2).pending = True  # its Pod waits to start: no hold takes it back, on no replica
    for service in (svc, replica(settings, cluster, clock)):
        assert (await service.poll(held(CANCELLED))).in_flight
    assert cluster.calls.count["delete_job"] == 0
    cluster.finish(job_of(cluster, 2), termination_message(replace(SUCCESSFUL, finished=clock.now)))
    assert await svc.poll(held(CANCELLED)) == Progress(ProgressState.DONE, "update applied")


async def test_a_resume_that_never_played_leaves_the_next_attempt_a_resume_within_the_budget(
    settings: Settings, cluster: FakeJobs, clock: Clock
) -> None:
    """A resume whose Pod never started leaves the machine as disrupted as the play it resumed: the
    attempt after it resumes as well. The retry budget counts them all: a Job that dies again and again
    ends blocked (whose clean-up uncordons the Node) instead of looping."""
    svc = replica(settings.model_copy(update={"max_failed_attempts": 3}), cluster, clock)
    assert await svc.poll(req()) == STARTING
    clock.now = CLOSED
    cluster.finish(job_of(cluster, 1), died(True, clock.now))
    clock.now += 2
    assert await svc.poll(held(PAUSED)) == STARTING
    job(cluster, 2).pod_status = pending_pod(None, UNSCHEDULABLE)
    clock.now += START_SECONDS
    assert (await svc.poll(held(PAUSED))).retrying
    given_up = record(cluster).attempts[-1].outcome
    assert given_up is not None and "did not start within" in given_up.detail
    assert given_up.died_past_drain_point, "the machine is as the Job it resumed left it"
    clock.now += 10
    assert await svc.poll(held(PAUSED)) == STARTING
    assert spec_of(cluster, 3).resumes
    cluster.finish(job_of(cluster, 3), died(True, clock.now))
    clock.now += 10
    blocked = Progress(ProgressState.FAILED, "blocked after 3 failed attempts: run interrupted", blocked=True)
    assert await svc.poll(held(PAUSED)) == blocked
