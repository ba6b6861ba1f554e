"""RunService.poll end to end with a fake ansible-runner: the UpdateMachine state machine, durably."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import anyio
import pytest
from hostlab.proc import wait_until
from run_deps import run_service

from inplace_extension.local.backend import LocalBackend
from inplace_extension.metrics import Metrics
from inplace_extension.plays import runner as runner_mod
from inplace_extension.plays.runner import RunConfigError
from inplace_extension.runs import holds, memo
from inplace_extension.runs.inventory import InventoryError
from inplace_extension.runs.model import Progress, ProgressState, RunRequest, Unhealthy
from inplace_extension.runs.play_time import NEAR_END_SECONDS, known_cost
from inplace_extension.runs.policy import RETRY_ANNOTATION
from inplace_extension.runs.resolve import ADDRESS_ANNOTATION
from inplace_extension.runs.service import RunService
from inplace_extension.runs.windows import MaintenanceWindow, Schedule
from inplace_extension.settings import Settings

from .fakes import FP, FakeRunner, failed_events, unreachable_events

pytestmark = pytest.mark.anyio
PLAYBOOKS = Path(__file__).resolve().parents[2] / "playbooks"
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIJAm/+qD5i6Qm8kDm+Qr9ygOJL1jDRtSlh6jlxmhLn0T"
INVENTORY = f"""\
hosts:
  - match: {{name: "m*"}}
    address: 10.79.9.11
    known_hosts: "{KEY}"
defaults: {{user: ansible, private_key_file: /keys/id}}
"""


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    inv = tmp_path / "inventory.yaml"
    inv.write_text(INVENTORY)
    return Settings(
        inventory=inv,
        allowed_cidrs=["10.79.9.0/24"],
        runs_dir=tmp_path / "runs",
        playbooks_dir=PLAYBOOKS,
        retry_after_seconds=1,
        max_parallel_runs=2,
    )


@pytest.fixture
def svc(settings: Settings, fake: FakeRunner) -> Iterator[RunService]:
    service = run_service(settings)
    yield service
    if fake.gate is not None:
        fake.gate.set()
    service.close()


def req(name: str = "m1", fp: str = FP, annotations: dict[str, str] | None = None) -> RunRequest:
    return RunRequest(
        namespace="default",
        name=name,
        fingerprint=fp,
        capabilities=("ntp", "kubeadm_files"),
        inputs={"ntp": {"ntp_servers": ["a"]}, "kubeadm_files": {"kubeadm_files_files": []}},
        annotations=annotations or {},
    )


async def settle(svc: RunService, request: RunRequest, within: float = 5.0) -> Progress:
    """Poll like CAPI (without the waiting) until no attempt is in flight (queued, running, draining)."""
    deadline = time.monotonic() + within
    while True:
        progress = await svc.poll(request)
        if not progress.in_flight:
            return progress
        assert time.monotonic() < deadline, f"still {progress.message}"
        await anyio.sleep(0.01)


async def test_first_poll_runs_then_done_and_no_second_run(svc: RunService, fake: FakeRunner) -> None:
    first = await svc.poll(req())
    assert first.state is ProgressState.IN_PROGRESS
    assert first.retry_after_seconds == 1
    assert first.message == "queued: position 1 of 1"  # until the batch window closes
    done = await settle(svc, req())
    assert (done.state, done.retry_after_seconds) == (ProgressState.DONE, 0)
    assert (await svc.poll(req())).state is ProgressState.DONE
    assert fake.count("m1") == 1
    spec = fake.started[0]
    assert spec.ident == f"default.m1.{FP[:12]}"
    assert spec.target.address == "10.79.9.11"
    assert spec.attempt_dir.parent.name == spec.ident
    assert fake.batches[0].playbook == PLAYBOOKS / "update_machine.yml"


async def test_messages_name_queue_position_and_capability(settings: Settings, fake: FakeRunner) -> None:
    fake.gate = threading.Event()
    service = run_service(settings.model_copy(update={"max_parallel_runs": 1}))
    try:
        assert (await service.poll(req("m1"))).message == "queued: position 1 of 1"
        for name in ("m2", "m3"):
            await service.poll(req(name))
        # the batch has started every role and waits at the gate (its start alone came before its tasks:
        # a loaded whole run saw "running: ntp")
        assert wait_until(fake.at_gate.is_set, 5, 0.01)
        assert fake.count("m1") == 1
        assert (await service.poll(req("m1"))).message == "running: kubeadm_files"  # last role started
        assert (await service.poll(req("m2"))).message == "queued: position 1 of 2"
        assert (await service.poll(req("m3"))).message == "queued: position 2 of 2"
        fake.gate.set()
        for name in ("m1", "m2", "m3"):
            assert (await settle(service, req(name))).state is ProgressState.DONE
    finally:
        fake.gate.set()
        service.close()


async def test_task_failure_is_remembered_and_retry_annotation_recovers(
    svc: RunService, fake: FakeRunner
) -> None:
    fake.scripts["m1"] = [lambda spec: ("failed", 2, failed_events("ntp", "Restart {{ ntp_service }}"))]
    failed = await settle(svc, req())
    assert failed.state is ProgressState.FAILED
    assert failed.message == 'ntp: task "Restart" failed on host'
    for _ in range(3):
        assert await svc.poll(req()) == failed
    assert fake.count("m1") == 1
    retried = req(annotations={RETRY_ANNOTATION: "try-2"})
    assert (await settle(svc, retried)).state is ProgressState.DONE
    assert fake.count("m1") == 2
    # the same token again does not re-run a success, and a new fingerprint starts afresh
    assert (await svc.poll(retried)).state is ProgressState.DONE
    assert (await settle(svc, req(fp="cd" * 32))).state is ProgressState.DONE
    assert fake.count("m1") == 3


async def test_unreachable_is_retried_with_backoff(svc: RunService, fake: FakeRunner) -> None:
    fake.scripts["m1"] = [lambda spec: ("failed", 4, unreachable_events())]
    answer = await settle(svc, req())
    assert answer.state is ProgressState.IN_PROGRESS
    assert answer.message == "host unreachable, retrying (attempt 2)"
    assert answer.retry_after_seconds == 1
    assert fake.count("m1") == 1
    deadline = time.monotonic() + 5
    while (answer := await svc.poll(req())).state is not ProgressState.DONE:
        assert time.monotonic() < deadline
        await anyio.sleep(0.05)
    assert fake.count("m1") == 2


async def test_restart_answers_from_disk(settings: Settings, fake: FakeRunner) -> None:
    fake.scripts["m2"] = [lambda spec: ("failed", 2, failed_events("users", "Create users"))]
    first = run_service(settings)
    assert (await settle(first, req("m1"))).state is ProgressState.DONE
    assert (await settle(first, req("m2"))).state is ProgressState.FAILED
    first.close()
    second = run_service(settings)
    assert (await second.poll(req("m1"))).state is ProgressState.DONE
    assert (await second.poll(req("m2"))).message == 'users: task "Create users" failed on host'
    assert fake.count("m1") == fake.count("m2") == 1
    second.close()


async def test_interrupted_run_is_restarted_never_reported_done(settings: Settings, fake: FakeRunner) -> None:
    ident = req().ident
    killed = settings.runs_dir / ident / "attempt-0001"
    killed.mkdir(parents=True)  # a previous process died mid-run: no status, no outcome
    service = run_service(settings)
    try:
        answer = await service.poll(req())
        assert answer.state is ProgressState.IN_PROGRESS
        assert (await settle(service, req())).state is ProgressState.DONE
        assert fake.started[0].attempt_dir.name == "attempt-0002"
    finally:
        service.close()


async def test_close_waits_for_running_attempts_and_admits_no_more(
    settings: Settings, fake: FakeRunner
) -> None:
    fake.gate = threading.Event()
    service = run_service(settings.model_copy(update={"max_parallel_runs": 1}))
    await service.poll(req("m1"))
    await service.poll(req("m2"))
    assert wait_until(lambda: fake.count("m1") == 1, 5, 0.01)
    closer = threading.Thread(target=service.close)
    closer.start()
    closer.join(0.3)  # bounded: proves close() blocks while the run goes on
    assert closer.is_alive()  # waiting for m1's run, which is never killed
    fake.gate.set()
    closer.join(5)
    assert not closer.is_alive()
    assert "successful" in (fake.started[0].attempt_dir / "outcome.json").read_text()
    assert fake.count("m2") == 0  # the queue was dropped; a restarted service starts it on its poll


async def test_resolution_failures_are_clear(svc: RunService, fake: FakeRunner) -> None:
    outside = await svc.poll(req(annotations={ADDRESS_ANNOTATION: "10.80.0.1"}))
    assert (outside.state, outside.message) == (
        ProgressState.FAILED,
        "HostNotAllowed: the address from the annotation is outside --allowed-cidrs",
    )
    missing = await svc.poll(req("x1"))
    assert missing.state is ProgressState.FAILED
    assert missing.message.startswith("HostNotFound: ")
    assert fake.started == []


async def test_invalid_requests_are_refused(svc: RunService, fake: FakeRunner) -> None:
    bad = [
        RunRequest("default", "../etc", FP, (), {}),
        RunRequest("Default", "m1", FP, (), {}),
        RunRequest("default", "m1", "zz", (), {}),
        RunRequest("default", "m1", FP, ("ntp; rm -rf /",), {}),
        # a user-defined step's role must be a plain role name, for a capability of this run
        RunRequest("default", "m1", FP, ("os_image",), {}, roles={"os_image": "../../etc"}),
        RunRequest("default", "m1", FP, ("ntp",), {}, roles={"os_image": "os_image"}),
    ]
    for request in bad:
        answer = await svc.poll(request)
        assert answer.state is ProgressState.FAILED
        assert answer.message.startswith("InvalidRequest: ")
    assert fake.started == []


async def test_inventory_is_reloaded_when_it_changes(
    svc: RunService, settings: Settings, fake: FakeRunner
) -> None:
    assert settings.inventory is not None
    assert (await svc.poll(req("x1"))).message.startswith("HostNotFound")
    settings.inventory.write_text(INVENTORY.replace('"m*"', '"x*"'))
    stamp = settings.inventory.stat().st_mtime + 5
    os.utime(settings.inventory, (stamp, stamp))
    assert (await settle(svc, req("x1"))).state is ProgressState.DONE


def test_bad_configuration_stops_start_up(settings: Settings, tmp_path: Path) -> None:
    assert settings.inventory is not None
    settings.inventory.write_text("hosts: [{address: 1}]\n")
    with pytest.raises(InventoryError, match="line 1"):
        run_service(settings)
    with pytest.raises(RunConfigError, match="playbook"):
        run_service(settings.model_copy(update={"inventory": None, "playbooks_dir": tmp_path}))


async def test_a_poll_early_in_a_play_answers_at_once_one_near_its_end_waits_for_it(
    settings: Settings, fake: FakeRunner
) -> None:
    """The play's expected duration here is its steps' known cost (nothing learned yet): 2 s of start-up,
    1 s for ntp, 1 s for kubeadm_files; its end window the last 1 s. Early, a poll answers at once with
    retryAfterSeconds that lands the next poll as that window opens; in it, a poll waits for the end and
    answers done."""
    clock = Clock(1_000_000.0)
    fake.gate = threading.Event()
    service = run_service(settings.model_copy(update={"retry_after_seconds": 10}), clock=clock)
    try:
        assert known_cost(req().capabilities) == 4.0
        first = await service.poll(req())
        assert (first.message, first.retry_after_seconds, first.in_flight) == (
            "queued: position 1 of 1",
            3,
            True,
        )
        assert wait_until(lambda: fake.count("m1") == 1, 5, 0.01)
        # the fake reports its tasks (ntp, then kubeadm_files) just after it started: under load a poll can
        # come between the two (seen in a CI run), so poll until the last is reported; each answers at once
        deadline = time.monotonic() + 5
        while True:
            started = time.monotonic()
            early = await service.poll(req())  # 4 s expected, 0 s gone: no wait
            assert time.monotonic() - started < 0.5
            if early.message != "running: ntp" or time.monotonic() > deadline:
                break
            await anyio.sleep(0.01)
        assert (early.message, early.retry_after_seconds) == ("running: kubeadm_files", 3)
        clock.now += 3.2  # 0.8 s left: within the end window (1 s)
        threading.Timer(0.3, fake.gate.set).start()
        started = time.monotonic()
        done = await service.poll(req())
        assert (done.state, done.retry_after_seconds) == (ProgressState.DONE, 0)
        assert 0.2 < time.monotonic() - started < NEAR_END_SECONDS
    finally:
        fake.gate.set()
        service.close()


async def test_the_expected_end_is_learned_from_the_machines_last_play_and_an_overrun_waits(
    settings: Settings, fake: FakeRunner
) -> None:
    """A play that took 6.5 s (by the service's clock) sets the next play's expectation: its first answer
    asks again in 5 s (as its end window opens, a quarter of it before), not the known cost's. A play
    past its expected end is answered after a near-end wait with retryAfterSeconds 1."""
    clock = Clock(1_000_000.0)
    fake.gate = threading.Event()
    service = run_service(settings.model_copy(update={"retry_after_seconds": 10}), clock=clock)
    try:
        await service.poll(req())
        assert wait_until(lambda: fake.count("m1") == 1, 5, 0.01)
        clock.now += 6.5
        fake.gate.set()
        assert (await settle(service, req())).state is ProgressState.DONE  # read from the record: learned
        fake.gate = threading.Event()
        newer = req(fp="cd" * 32)
        assert (await service.poll(newer)).retry_after_seconds == 5  # ceil(6.5 - 6.5 / 4)
        assert wait_until(lambda: fake.count("m1") == 2, 5, 0.01)
        clock.now += 7  # past the expected end, and the play goes on
        started = time.monotonic()
        late = await service.poll(newer)
        assert time.monotonic() - started >= NEAR_END_SECONDS - 0.1  # waited for the end, which did not come
        assert (late.message, late.retry_after_seconds, late.in_flight) == ("running: kubeadm_files", 1, True)
    finally:
        fake.gate.set()
        service.close()


async def test_machines_polled_together_share_one_play(svc: RunService, fake: FakeRunner) -> None:
    for name in ("m1", "m2"):  # max_parallel_runs is 2 here
        await svc.poll(req(name))
    for name in ("m1", "m2"):
        assert (await settle(svc, req(name))).state is ProgressState.DONE
    assert [sorted(run.ident.split(".")[1] for run in batch.hosts) for batch in fake.batches] == [
        ["m1", "m2"]
    ]
    first, second = fake.batches[0].hosts
    assert first.attempt_dir.parent.name == first.ident != second.ident


async def test_a_run_that_cannot_start_is_retried_with_backoff(
    svc: RunService, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(spec: runner_mod.BatchSpec, on_task: runner_mod.TaskListener) -> runner_mod.RunHandle:
        raise runner_mod.RunStartError("ansible-runner could not start: ConfigurationError: nope")

    monkeypatch.setattr(runner_mod, "start", refuse)
    answer = await settle(svc, req())
    assert (answer.state, answer.message) == (
        ProgressState.IN_PROGRESS,
        "run interrupted, retrying (attempt 2)",
    )


def _sample(metrics: Metrics, name: str, labels: dict[str, str] | None = None) -> float:
    value = metrics.registry.get_sample_value(name, labels or {})
    return 0.0 if value is None else value


async def test_run_metrics_count_outcomes_and_track_slots(settings: Settings, fake: FakeRunner) -> None:
    metrics = Metrics()
    fake.gate = threading.Event()
    fake.scripts["m2"] = [lambda spec: ("failed", 2, failed_events("users", "Create users"))]
    service = run_service(settings.model_copy(update={"max_parallel_runs": 1}), metrics)
    try:
        for name in ("m1", "m2"):
            await service.poll(req(name))
        assert wait_until(lambda: fake.count("m1") == 1, 5, 0.01)
        # scraped while m1 holds the only slot and m2 waits
        assert _sample(metrics, "inplace_extension_runs_in_flight") == 1
        assert _sample(metrics, "inplace_extension_run_queue_length") == 1
        fake.gate.set()
        assert (await settle(service, req("m1"))).state is ProgressState.DONE
        assert (await settle(service, req("m2"))).state is ProgressState.FAILED
        runs = "inplace_extension_runs_total"
        assert _sample(metrics, runs, {"outcome": "successful"}) == 1
        assert _sample(metrics, runs, {"outcome": "task_failed"}) == 1
        assert _sample(metrics, "inplace_extension_run_duration_seconds_count") == 2
        assert _sample(metrics, "inplace_extension_runs_in_flight") == 0
        assert _sample(metrics, "inplace_extension_run_queue_length") == 0
    finally:
        fake.gate.set()
        service.close()


class Clock:
    """A wall clock the test moves (the service's ``clock``)."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


NIGHTS = Schedule((MaintenanceWindow("nights", "0 22 * * *", 3600),))


def utc(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


async def test_outside_its_window_an_update_waits_and_starts_when_it_opens(
    settings: Settings, fake: FakeRunner
) -> None:
    clock = Clock(utc("2026-12-01T21:58:20"))
    service = run_service(settings, windows=NIGHTS, clock=clock)
    try:
        for _ in range(2):
            answer = await service.poll(req())
            assert answer == Progress(
                ProgressState.IN_PROGRESS,
                'waiting for maintenance window "nights" (opens 2026-12-01T22:00Z)',
                100,
                waiting="window",
            )
        assert fake.count("m1") == 0
        assert not (settings.runs_dir / req().ident).exists()  # nothing started, nothing on disk
        clock.now = utc("2026-12-01T22:00:00")
        assert (await settle(service, req())).state is ProgressState.DONE
        assert fake.count("m1") == 1
        clock.now = utc("2026-12-02T12:00:00")  # done stays done outside the window
        assert (await service.poll(req())).state is ProgressState.DONE
    finally:
        service.close()


async def test_a_play_started_in_its_window_finishes_but_a_retry_waits_for_the_next_one(
    settings: Settings, fake: FakeRunner
) -> None:
    fake.scripts["m1"] = [lambda spec: ("failed", 4, unreachable_events())]
    clock = Clock(utc("2026-12-01T22:59:00"))
    service = run_service(settings, windows=NIGHTS, clock=clock)
    try:
        answer = await settle(service, req())
        assert answer.message == "host unreachable, retrying (attempt 2)"
        clock.now = utc("2026-12-01T23:30:00")  # the window closed; the backoff is over
        waiting = await service.poll(req())
        assert (waiting.message, waiting.waiting) == (
            'waiting for maintenance window "nights" (opens 2026-12-02T22:00Z)',
            "window",
        )
        assert fake.count("m1") == 1
        clock.now = utc("2026-12-02T22:00:00")
        assert (await settle(service, req())).state is ProgressState.DONE
        assert fake.count("m1") == 2
    finally:
        service.close()


async def test_windows_apply_by_machine_labels(settings: Settings, fake: FakeRunner) -> None:
    prod = Schedule((MaintenanceWindow("prod", "0 22 * * *", 3600, labels=(("env", "prod"),)),))
    service = run_service(settings, windows=prod, clock=Clock(utc("2026-12-01T12:00:00")))
    try:
        other = RunRequest(**{**req("m2").__dict__, "labels": {"env": "dev"}})
        assert (await settle(service, other)).state is ProgressState.DONE
        held = RunRequest(**{**req("m3").__dict__, "labels": {"env": "prod"}})
        assert (await service.poll(held)).waiting == "window"
        assert (fake.count("m2"), fake.count("m3")) == (1, 0)
    finally:
        service.close()


async def test_a_hold_the_request_carries_pauses_and_cancels_without_a_cluster_side(
    svc: RunService, fake: FakeRunner
) -> None:
    """The MCM agent reads the pause annotation with the desired state and hands it over in the request:
    the same answers as the CAPI side's (tests/runs/test_cluster_side.py), from the same table."""
    owner = "MachineDeployment machines/pool"
    paused = holds.hold_of(owner, {holds.PAUSE_ANNOTATION: "true"})
    cancelled = holds.hold_of(owner, {holds.PAUSE_ANNOTATION: holds.CANCEL})
    assert paused is not None and cancelled is not None
    held = RunRequest(**{**req("m1").__dict__, "hold": paused})
    answer = await svc.poll(held)
    assert answer == Progress(
        ProgressState.IN_PROGRESS,
        "paused by MachineDeployment machines/pool (annotation inplace-extension.io/pause)",
        30,
        waiting="pause",
    )
    stopped = RunRequest(**{**req("m2").__dict__, "hold": cancelled})
    assert await svc.poll(stopped) == Progress(
        ProgressState.FAILED,
        "cancelled by MachineDeployment machines/pool (annotation inplace-extension.io/pause=cancel)",
        cancelled=True,
    )
    assert (fake.count("m1"), fake.count("m2")) == (0, 0), "nothing started"
    # resumed (the annotation removed): the same updates start
    assert (await settle(svc, req("m1"))).state is ProgressState.DONE
    assert (await settle(svc, req("m2"))).state is ProgressState.DONE
    assert (fake.count("m1"), fake.count("m2")) == (1, 1)
    # an update that has run is answered from its attempts, whatever the hold says now
    assert (await svc.poll(RunRequest(**{**req("m2").__dict__, "hold": cancelled}))).state is (
        ProgressState.DONE
    )


async def test_the_retry_budget_blocks_and_the_retry_annotation_resets_it(
    settings: Settings, fake: FakeRunner
) -> None:
    metrics = Metrics()
    fake.scripts["m1"] = [lambda spec: ("failed", 4, unreachable_events())] * 2
    clock = Clock(time.time())
    service = run_service(settings.model_copy(update={"max_failed_attempts": 2}), metrics, clock=clock)
    try:
        assert (await settle(service, req())).message == "host unreachable, retrying (attempt 2)"
        clock.now += 60  # past the backoff
        blocked = await settle(service, req())
        assert blocked == Progress(
            ProgressState.FAILED, "blocked after 2 failed attempts: host unreachable", blocked=True
        )
        clock.now += 3600
        assert await service.poll(req()) == blocked
        assert fake.count("m1") == 2
        assert _sample(metrics, "inplace_extension_updates_blocked") == 1
        retried = req(annotations={RETRY_ANNOTATION: "now"})
        assert (await settle(service, retried)).state is ProgressState.DONE
        assert fake.count("m1") == 3
        assert _sample(metrics, "inplace_extension_updates_blocked") == 0
    finally:
        service.close()


async def test_update_status_metrics_count_waiting_failed_and_the_oldest_update(
    settings: Settings, fake: FakeRunner
) -> None:
    metrics = Metrics()
    fake.gate = threading.Event()
    fake.scripts["m2"] = [lambda spec: ("failed", 2, failed_events("users", "Create users"))]
    clock = Clock(utc("2026-12-01T21:00:00"))
    prod = Schedule((MaintenanceWindow("prod", "0 22 * * *", 3600, labels=(("env", "prod"),)),))
    service = run_service(settings, metrics, windows=prod, clock=clock)
    try:
        held = RunRequest(**{**req("m3").__dict__, "labels": {"env": "prod"}})
        assert (await service.poll(held)).waiting == "window"
        await service.poll(req("m1"))
        assert wait_until(lambda: fake.count("m1") == 1, 5, 0.01)
        clock.now += 600
        assert _sample(metrics, "inplace_extension_updates_waiting", {"reason": "window"}) == 1
        assert _sample(metrics, "inplace_extension_updates_waiting", {"reason": "health_check"}) == 0
        assert _sample(metrics, "inplace_extension_oldest_update_age_seconds") == 600
        fake.gate.set()
        assert (await settle(service, req("m1"))).state is ProgressState.DONE
        assert (await settle(service, req("m2"))).state is ProgressState.FAILED
        assert _sample(metrics, "inplace_extension_oldest_update_age_seconds") == 0
        assert _sample(metrics, "inplace_extension_updates_failed") == 1
        clock.now += 3600  # nobody asked about m2 and m3 for an hour: CAPI stopped asking
        assert _sample(metrics, "inplace_extension_updates_failed") == 0
        assert _sample(metrics, "inplace_extension_updates_waiting", {"reason": "window"}) == 0
    finally:
        fake.gate.set()
        service.close()


async def test_the_oldest_update_age_counts_from_the_first_attempts_start_not_the_wait_before_it(
    settings: Settings, fake: FakeRunner
) -> None:
    """docs/operator-controls.md: the age of the oldest update started and not done, from its first
    attempt; an update waiting for a health check before it starts has not started."""
    metrics = Metrics()
    fake.gate = threading.Event()
    clock = Clock(utc("2026-12-01T12:00:00"))
    health = Health(CEPH_DOWN)
    service = run_service(settings, metrics, clock=clock, object_health=health)
    try:
        assert (await service.poll(req())).waiting == "health_check"
        clock.now += 600  # ten minutes waiting for the check: not started
        assert (await service.poll(req())).waiting == "health_check"
        assert _sample(metrics, "inplace_extension_oldest_update_age_seconds") == 0
        assert _sample(metrics, "inplace_extension_updates_waiting", {"reason": "health_check"}) == 1
        health.failing = None
        await service.poll(req())  # it starts now
        assert wait_until(lambda: fake.count("m1") == 1, 5, 0.01)
        clock.now += 60
        assert _sample(metrics, "inplace_extension_oldest_update_age_seconds") == 60
        fake.gate.set()
        assert (await settle(service, req())).state is ProgressState.DONE
        assert _sample(metrics, "inplace_extension_oldest_update_age_seconds") == 0
    finally:
        fake.gate.set()
        service.close()


async def test_status_addresses_the_request_carries_place_the_host_with_the_capi_sides_failures(
    settings: Settings, fake: FakeRunner
) -> None:
    """The MCM agent's requests carry their Node's status.addresses: the same order and Failures as the
    live Machine's in the Kubernetes-aware mode (tests/runs/test_cluster_side.py), without a cluster side."""
    assert settings.inventory is not None
    settings.inventory.write_text(INVENTORY.replace("defaults: {", f'defaults: {{known_hosts: "{KEY}", '))
    service = run_service(settings)
    try:

        def node(name: str, *addresses: tuple[str, str]) -> RunRequest:
            return replace(req(name), addresses=addresses)

        missing = await service.poll(node("n1", ("Hostname", "n1"), ("InternalIP", "node-1.example")))
        assert missing.message == (
            "HostNotFound: no inventory entry matches this Machine and it has no "
            "inplace-extension.io/address annotation, nor an InternalIP/ExternalIP address in its status"
        )
        outside = await service.poll(node("n2", ("InternalIP", "10.80.0.1")))
        assert (
            outside.message
            == "HostNotAllowed: the address from the machine status is outside --allowed-cidrs"
        )
        found = node("n3", ("Hostname", "n3"), ("ExternalIP", "10.79.9.77"), ("InternalIP", "10.79.9.66"))
        assert (await settle(service, found)).state is ProgressState.DONE
        (run,) = fake.started
        assert (run.target.address, run.target.source, run.target.host_keys) == (
            "10.79.9.66",
            "machine status",
            (KEY,),
        )
        annotated = replace(
            node("n4", ("InternalIP", "10.79.9.66")), annotations={ADDRESS_ANNOTATION: "10.79.9.5"}
        )
        assert (await settle(service, annotated)).state is ProgressState.DONE
        assert fake.started[1].target.address == "10.79.9.5", "the annotation comes first"
        entry = node("m1", ("InternalIP", "10.79.9.66"))
        assert (await settle(service, entry)).state is ProgressState.DONE
        assert fake.started[2].target.address == "10.79.9.11", "then the inventory"
    finally:
        service.close()


CEPH_DOWN = Unhealthy(
    "ceph",
    'object.status.health == "HEALTH_OK"',
    "CephCluster rook-ceph/ceph",
    'object.status.health == "HEALTH_OK" is false on CephCluster rook-ceph/ceph',
)


class Health:
    """The checks of cluster objects as the test sets them (``failing``: the one that does not hold)."""

    def __init__(self, failing: Unhealthy | None = None) -> None:
        self.failing = failing

    def unhealthy(self, request: RunRequest) -> Unhealthy | None:
        return self.failing


async def test_an_update_starts_only_while_its_health_checks_hold(
    settings: Settings, fake: FakeRunner
) -> None:
    health = Health(CEPH_DOWN)
    service = run_service(settings, object_health=health)
    try:
        for _ in range(2):
            assert await service.poll(req()) == Progress(
                ProgressState.IN_PROGRESS,
                'waiting for health check "ceph" (object.status.health == "HEALTH_OK" is false on '
                "CephCluster rook-ceph/ceph)",
                1,
                waiting="health_check",
            )
        assert fake.count("m1") == 0
        assert not (settings.runs_dir / req().ident).exists()  # nothing started, nothing on disk
        health.failing = None
        assert (await settle(service, req())).state is ProgressState.DONE
        assert fake.count("m1") == 1
    finally:
        service.close()


async def test_after_the_play_the_health_gate_waits_for_the_checks_then_fails_naming_the_check(
    settings: Settings, fake: FakeRunner
) -> None:
    health, clock = Health(), Clock(utc("2026-12-01T12:00:00"))
    fake.gate = threading.Event()
    service = run_service(settings, clock=clock, object_health=health)
    try:
        await service.poll(req())
        assert wait_until(lambda: fake.count("m1") == 1, 5, 0.01)
        health.failing = CEPH_DOWN  # the update made the cluster unhealthy
        fake.gate.set()
        waiting = await settle(service, req())
        assert waiting == Progress(
            ProgressState.IN_PROGRESS, f"health gate: {CEPH_DOWN.waiting}", 1, waiting="health_check"
        )
        clock.now += settings.health_gate_timeout_seconds
        failed = await service.poll(req())
        assert (failed.state, failed.message) == (
            ProgressState.FAILED,
            f'health gate: health check "ceph" did not hold within {settings.health_gate_timeout_seconds}s '
            'after the update (object.status.health == "HEALTH_OK" on CephCluster rook-ceph/ceph)',
        )
        assert (await service.poll(req())).message == failed.message  # the same on every call
        health.failing = None
        assert (await service.poll(req())).state is ProgressState.DONE
        assert fake.count("m1") == 1
    finally:
        fake.gate.set()
        service.close()


async def test_what_the_service_and_its_local_backend_remember_per_update_is_bounded(
    settings: Settings, fake: FakeRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The wait last posted as an Event and the attempts read from disk are kept per update polled; past
    their bound (runs/memo.py) the oldest are forgotten, and a forgotten update answers as before (its
    attempts read from disk again)."""
    monkeypatch.setattr(memo, "DEFAULT_BOUND", 2)
    svc = run_service(settings)
    try:
        hold = holds.hold_of("MachineDeployment machines/pool", {holds.PAUSE_ANNOTATION: "true"})
        assert hold is not None
        for name in ("m1", "m2", "m3"):
            answer = await svc.poll(RunRequest(**{**req(name).__dict__, "hold": hold}))
            assert answer.waiting == "pause"
        assert len(svc._announced) == 2
        backend = svc._backend
        assert isinstance(backend, LocalBackend)
        assert len(backend._attempts) == 2
        assert (await settle(svc, req("m1"))).state is ProgressState.DONE
        assert (await settle(svc, req("m2"))).state is ProgressState.DONE
        assert (await settle(svc, req("m3"))).state is ProgressState.DONE
        assert backend.cached(req("m1").ident) == (), "m1's attempts were forgotten: m2 and m3 came later"
        assert (await svc.poll(req("m1"))).state is ProgressState.DONE, "read from disk again"
        assert len(backend.cached(req("m1").ident)) == 1
        assert fake.count("m1") == 1
    finally:
        svc.close()
