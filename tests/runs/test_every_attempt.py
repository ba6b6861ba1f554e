"""One rule for every attempt (docs/operator-controls.md): a new attempt (the first, one after a retry
backoff, one after the retry annotation) waits for the maintenance window, the pause and the
``kubernetes`` health checks exactly like a first one, and a cancel fails every update whose next attempt
has not started; only a play that has started finishes. RunService with the fake runner, a clock the test
moves (so a backoff ends when the test says) and the hold the request carries (as the MCM agent's)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from hostlab.proc import wait_until
from run_deps import run_service

from inplace_extension.plays.steps import DRAIN_TASK
from inplace_extension.runs import holds
from inplace_extension.runs.model import Hold, Progress, ProgressState, RunRequest
from inplace_extension.runs.policy import RETRY_ANNOTATION
from inplace_extension.runs.service import RunService
from inplace_extension.runs.windows import MaintenanceWindow, Schedule
from inplace_extension.settings import Settings

from .fakes import FakeRunner, failed_events, unreachable_events, write_artifacts
from .test_service import CEPH_DOWN, INVENTORY, PLAYBOOKS, Clock, Health, req, settle, utc

pytestmark = pytest.mark.anyio

OWNER = "MachineDeployment default/md-0"
PAUSED = Hold(f"paused by {OWNER} (annotation {holds.PAUSE_ANNOTATION})")
CANCELLED = Hold(f"cancelled by {OWNER} (annotation {holds.PAUSE_ANNOTATION}=cancel)", cancel=True)
# a window from 22:00 to 23:00 UTC every night; the tests start at 22:59, inside it
NIGHTS = Schedule((MaintenanceWindow("nights", "0 22 * * *", 3600),))
RETRYING = "host unreachable, retrying (attempt 2)"
WINDOW = 'waiting for maintenance window "nights" (opens 2026-12-02T22:00Z)'
CEPH_WAITING = (
    'waiting for health check "ceph" (object.status.health == "HEALTH_OK" is false on '
    "CephCluster rook-ceph/ceph)"
)


def held(request: RunRequest, hold: Hold | None) -> RunRequest:
    return replace(request, hold=hold)


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(INVENTORY)
    return Settings(
        inventory=inventory,
        allowed_cidrs=["10.79.9.0/24"],
        runs_dir=tmp_path / "runs",
        playbooks_dir=PLAYBOOKS,
        retry_after_seconds=1,
    )


@pytest.fixture
def clock() -> Clock:
    return Clock(utc("2026-12-01T22:59:00"))


@pytest.fixture
def health() -> Health:
    return Health()


@pytest.fixture
def svc(settings: Settings, fake: FakeRunner, clock: Clock, health: Health) -> Iterator[RunService]:
    service = run_service(settings, windows=NIGHTS, clock=clock, object_health=health)
    yield service
    if fake.gate is not None:
        fake.gate.set()
    service.close()


async def in_backoff(svc: RunService, fake: FakeRunner, clock: Clock) -> None:
    """m1's first attempt finds its host unreachable (inside the window, every check holding), and the
    clock moves past its backoff (1 s) and past the window's end: its next attempt is due now."""
    fake.scripts["m1"] = [lambda run: ("failed", 4, unreachable_events())]
    assert (await settle(svc, req())).message == RETRYING
    assert fake.count("m1") == 1


async def test_a_retry_after_the_backoff_meets_a_closed_window_and_waits_for_the_next(
    svc: RunService, fake: FakeRunner, clock: Clock
) -> None:
    await in_backoff(svc, fake, clock)
    clock.now = utc("2026-12-01T23:00:05")  # the backoff is over, and so is the window
    for _ in range(2):
        answer = await svc.poll(req())
        assert (answer.state, answer.message, answer.waiting) == (ProgressState.IN_PROGRESS, WINDOW, "window")
    assert fake.count("m1") == 1, "no second attempt outside the window"
    clock.now = utc("2026-12-02T22:00:00")
    assert (await settle(svc, req())).state is ProgressState.DONE
    assert fake.count("m1") == 2


async def test_a_retry_after_the_backoff_meets_a_failing_health_check(
    svc: RunService, fake: FakeRunner, clock: Clock, health: Health
) -> None:
    await in_backoff(svc, fake, clock)
    clock.now += 2  # the backoff is over, the window still open
    health.failing = CEPH_DOWN  # the CephCluster the operator guards went unhealthy meanwhile
    for _ in range(2):
        answer = await svc.poll(req())
        assert (answer.state, answer.waiting) == (ProgressState.IN_PROGRESS, "health_check")
        assert answer.message == CEPH_WAITING
    assert fake.count("m1") == 1, "no second attempt while the check does not hold"
    health.failing = None
    assert (await settle(svc, req())).state is ProgressState.DONE
    assert fake.count("m1") == 2


async def test_a_retry_after_the_backoff_meets_a_pause(
    svc: RunService, fake: FakeRunner, clock: Clock
) -> None:
    await in_backoff(svc, fake, clock)
    # during the backoff the answer says so; once it is over, the pause holds the next attempt
    assert (await svc.poll(held(req(), PAUSED))).message == RETRYING
    clock.now += 2
    for _ in range(2):
        answer = await svc.poll(held(req(), PAUSED))
        assert (answer.message, answer.waiting) == (PAUSED.message, "pause")
    assert fake.count("m1") == 1, "no second attempt under the pause"
    assert (await settle(svc, req())).state is ProgressState.DONE  # the annotation removed
    assert fake.count("m1") == 2


async def test_a_cancel_during_the_backoff_fails_the_update_at_once(
    svc: RunService, fake: FakeRunner, clock: Clock
) -> None:
    await in_backoff(svc, fake, clock)
    for _ in range(2):  # still inside the backoff: the next attempt has not started, and never will
        assert await svc.poll(held(req(), CANCELLED)) == Progress(
            ProgressState.FAILED, CANCELLED.message, cancelled=True
        )
    clock.now += 2  # past the backoff: still cancelled
    assert (await svc.poll(held(req(), CANCELLED))).cancelled
    assert fake.count("m1") == 1
    # not remembered: once the annotation is gone, the next attempt starts
    assert (await settle(svc, req())).state is ProgressState.DONE
    assert fake.count("m1") == 2


async def test_a_retry_by_the_annotation_obeys_the_window_the_pause_and_the_checks(
    svc: RunService, fake: FakeRunner, clock: Clock, health: Health
) -> None:
    fake.scripts["m1"] = [lambda run: ("failed", 2, failed_events("ntp", "Restart chrony"))]
    assert (await settle(svc, req())).message == 'ntp: task "Restart chrony" failed on host'
    retried = req(annotations={RETRY_ANNOTATION: "1"})
    clock.now = utc("2026-12-01T23:30:00")
    assert (await svc.poll(retried)).waiting == "window"
    clock.now = utc("2026-12-02T22:10:00")
    assert (await svc.poll(held(retried, PAUSED))).waiting == "pause"
    assert (await svc.poll(held(retried, CANCELLED))).cancelled
    health.failing = CEPH_DOWN
    assert (await svc.poll(retried)).waiting == "health_check"
    assert fake.count("m1") == 1, "the retry annotation alone starts nothing the operator holds"
    health.failing = None
    assert (await settle(svc, retried)).state is ProgressState.DONE
    assert fake.count("m1") == 2


async def test_a_play_in_flight_finishes_after_its_window_closed(
    svc: RunService, fake: FakeRunner, clock: Clock
) -> None:
    fake.gate = threading.Event()
    await svc.poll(req())
    assert wait_until(lambda: fake.count("m1") == 1, 5, 0.01)
    clock.now = utc("2026-12-01T23:30:00")  # the window closes, a pause and a cancel come: it goes on
    assert (await svc.poll(held(req(), CANCELLED))).state is ProgressState.IN_PROGRESS
    fake.gate.set()
    assert (await settle(svc, held(req(), CANCELLED))).state is ProgressState.DONE
    assert fake.count("m1") == 1


def killed_mid_play(
    settings: Settings, drain_before: str | None, tasks: list[tuple[str | None, str]], resumes: bool = False
) -> None:
    """A previous process died mid-play: m1's attempt 1 with its meta.json (its drain point; whether it
    resumed a play that had died past its own) and the events its play wrote so far (``tasks``: role and
    task of each task started), no status, no outcome."""
    ident = req().ident
    attempt = settings.runs_dir / ident / "attempt-0001"
    attempt.mkdir(parents=True)
    batch = settings.runs_dir / ".batches" / "batch-dead"
    events = [{"event": "runner_on_start", "event_data": {"role": r, "task": t}} for r, t in tasks]
    write_artifacts(batch, batch.name, None, None, [{"event": "playbook_on_play_start"}, *events])
    for path in (batch / "artifacts" / batch.name / "job_events").glob("*.json"):
        event = json.loads(path.read_text())
        if event["event"] == "runner_on_start":
            event["event_data"]["host"] = ident
            path.write_text(json.dumps(event))
    meta = {"attempt": 1, "started": utc("2026-12-01T22:59:30"), "retry_token": "", "lock_token": "dead"}
    meta |= {"batch_dir": str(batch), "batch_ident": batch.name, "host": ident, "drain_before": drain_before}
    meta |= {"resumes": resumes}
    (attempt / "meta.json").write_text(json.dumps(meta))


@pytest.mark.parametrize(
    ("drain_before", "tasks", "resumes"),
    [
        # it waited at its drain point: the Node may be cordoned
        (
            "kubeadm_files",
            [(None, "Check the run parameters"), ("ntp", "Write config"), (None, DRAIN_TASK)],
            False,
        ),
        # no drain point: a step began, the host may be half changed
        (None, [(None, "Check the run parameters"), ("ntp", "Write config")], False),
        # it resumed such a play and died before its own drain point: the machine is still disrupted
        ("kubeadm_files", [(None, "Check the run parameters")], True),
    ],
    ids=["past-its-drain-point", "no-drain-point-a-step-began", "a-resume-before-its-drain-point"],
)
async def test_an_attempt_whose_play_died_past_its_drain_point_resumes_outside_the_window(
    settings: Settings,
    fake: FakeRunner,
    clock: Clock,
    drain_before: str | None,
    tasks: list[tuple[str | None, str]],
    resumes: bool,
) -> None:
    """Its play may have disrupted the machine: the next attempt finishes it, unchecked."""
    killed_mid_play(settings, drain_before, tasks, resumes)
    clock.now = utc("2026-12-01T23:30:00")
    service = run_service(settings, windows=NIGHTS, clock=clock)
    try:
        assert (await settle(service, held(req(), CANCELLED))).state is ProgressState.DONE
        assert [run.attempt_dir.name for run in fake.started] == ["attempt-0002"]
        meta = json.loads((fake.started[0].attempt_dir / "meta.json").read_text())
        assert meta["drain_before"] is None, "each attempt records its drain point (none here)"
        assert meta["resumes"] is True, "and that it resumes: if it dies too, the next one resumes"
    finally:
        service.close()


@pytest.mark.parametrize(
    ("drain_before", "tasks"),
    [
        # only the steps before its drain point ran (on a schedulable Node): nothing disrupted
        ("kubeadm_files", [(None, "Check the run parameters"), ("ntp", "Write config")]),
        # no drain point, and no step began
        (None, [(None, "Check the run parameters")]),
        # no event at all: its play never started
        ("kubeadm_files", []),
    ],
    ids=["before-its-drain-point", "no-drain-point-no-step", "no-play"],
)
async def test_an_attempt_whose_play_died_before_it_disrupted_anything_is_a_new_start(
    settings: Settings,
    fake: FakeRunner,
    clock: Clock,
    drain_before: str | None,
    tasks: list[tuple[str | None, str]],
) -> None:
    """The next attempt is a whole new play (drain, restarts): the window, the pause and the cancel
    hold it like any new start."""
    killed_mid_play(settings, drain_before, tasks)
    clock.now = utc("2026-12-01T23:30:00")
    service = run_service(settings, windows=NIGHTS, clock=clock)
    try:
        answer = await service.poll(req())
        assert (answer.message, answer.waiting) == (WINDOW, "window")
        assert (await service.poll(held(req(), CANCELLED))).cancelled
        clock.now = utc("2026-12-02T22:00:00")
        assert (await service.poll(held(req(), PAUSED))).waiting == "pause"
        assert fake.count("m1") == 0, "no play while the operator holds it"
        assert (await settle(service, req())).state is ProgressState.DONE
        assert [run.attempt_dir.name for run in fake.started] == ["attempt-0002"]
        assert json.loads((fake.started[0].attempt_dir / "meta.json").read_text())["resumes"] is False
    finally:
        service.close()


@pytest.fixture
def one_slot(settings: Settings, fake: FakeRunner, clock: Clock, health: Health) -> Iterator[RunService]:
    """``--max-parallel-runs 1``: a second Machine waits in the queue while the first plays."""
    one = settings.model_copy(update={"max_parallel_runs": 1})
    service = run_service(one, windows=NIGHTS, clock=clock, object_health=health)
    yield service
    if fake.gate is not None:
        fake.gate.set()
    service.close()


async def queued_behind_m1(svc: RunService, fake: FakeRunner) -> threading.Event:
    """m1 takes the one slot and plays until the returned gate opens; m2, started inside its window with
    every check holding, waits for the slot."""
    gate = fake.gate = threading.Event()
    await svc.poll(req())
    assert wait_until(lambda: fake.count("m1") == 1, 5, 0.01)
    queued = await svc.poll(req("m2"))
    assert (queued.message, queued.in_flight) == ("queued: position 1 of 1", True)
    assert (await svc.poll(req("m2"))).in_flight, "a queued attempt the checks let start stays queued"
    return gate


async def test_a_queued_attempt_is_cancelled_and_never_plays_after_its_window_closed(
    one_slot: RunService, fake: FakeRunner, clock: Clock
) -> None:
    """The window closes and the operator cancels while m2 waits for the slot: its poll takes it out of
    the queue and answers the cancel; the slot frees and m2 has not played, nor does it later."""
    gate = await queued_behind_m1(one_slot, fake)
    clock.now = utc("2026-12-01T23:30:00")
    assert await one_slot.poll(held(req("m2"), CANCELLED)) == Progress(
        ProgressState.FAILED, CANCELLED.message, cancelled=True
    )
    gate.set()
    assert (await settle(one_slot, req())).state is ProgressState.DONE  # m1's play finishes
    answer = await one_slot.poll(req("m2"))  # the annotation removed: the window still holds it
    assert (answer.message, answer.waiting) == (WINDOW, "window")
    assert fake.count("m2") == 0, "no play of m2 after the cancel, nor outside its window"
    clock.now = utc("2026-12-02T22:00:00")
    assert (await settle(one_slot, req("m2"))).state is ProgressState.DONE
    assert fake.count("m2") == 1


@pytest.mark.parametrize("what", ["window", "health_check"])
async def test_a_queued_attempt_is_checked_again_as_it_takes_its_slot(
    one_slot: RunService, settings: Settings, fake: FakeRunner, clock: Clock, health: Health, what: str
) -> None:
    """Nobody polls m2 while it waits; when m1 ends and the slot is m2's, its window has closed (or a
    health check stopped holding): it leaves without playing, and its next poll says why."""
    gate = await queued_behind_m1(one_slot, fake)
    if what == "window":
        clock.now = utc("2026-12-01T23:30:00")
    else:
        health.failing = CEPH_DOWN
    gate.set()
    assert await one_slot.wait_end(req("m2"), 10), "m2 still in flight"
    assert fake.count("m2") == 0, "m2 played although it may no longer start"
    answer = await one_slot.poll(req("m2"))
    assert (answer.message, answer.waiting) == (WINDOW if what == "window" else CEPH_WAITING, what)
    assert not list((settings.runs_dir / req("m2").ident).glob("attempt-*")), "no attempt recorded"
