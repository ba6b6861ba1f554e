"""The timeout of a ``kubernetes`` health check before an update starts (docs/operator-controls.md): the
wait counted on disk under the runs dir (a restarted service keeps the clock), reset by the retry
annotation, a stable Failure with one Event past it, and the update started once the check holds."""

from __future__ import annotations

import json
import stat
from dataclasses import replace
from pathlib import Path

import pytest
from run_deps import run_service

from inplace_extension.local import health_wait
from inplace_extension.metrics import Metrics
from inplace_extension.plays.artifacts import attempt_dirs, write_json
from inplace_extension.runs.model import Hold, Progress, ProgressState
from inplace_extension.runs.policy import RETRY_ANNOTATION, retry_token
from inplace_extension.runs.service import RunService
from inplace_extension.settings import Settings

from .fakes import FakeRunner
from .test_cluster_side import FakeClusterSide
from .test_service import CEPH_DOWN, Clock, Health, _sample, req, settings, settle, utc

__all__ = ["settings"]  # the fixture of test_service.py, used here
pytestmark = pytest.mark.anyio

CEPH_SLOW = replace(CEPH_DOWN, start_timeout_seconds=120)
TIMED_OUT = (
    'health check "ceph" did not hold within 2m before the update '
    '(object.status.health == "HEALTH_OK" on CephCluster rook-ceph/ceph)'
)
WAITING = Progress(ProgressState.IN_PROGRESS, CEPH_DOWN.waiting, 1, waiting="health_check")


def marker(settings: Settings) -> Path:
    return settings.runs_dir / req().ident / health_wait.WAIT_FILE


async def test_past_its_timeout_the_check_fails_the_update_and_it_starts_once_the_check_holds(
    settings: Settings, fake: FakeRunner
) -> None:
    health, clock, side = Health(CEPH_SLOW), Clock(utc("2026-12-01T12:00:00")), FakeClusterSide()
    began = clock.now

    def service(metrics: Metrics | None = None) -> RunService:
        return run_service(settings, metrics, cluster=side, clock=clock, object_health=health)

    first = service()
    try:
        assert await first.poll(req()) == WAITING
        recorded = json.loads(marker(settings).read_text())
        assert recorded == {"check": "ceph", "retry_token": "", "since": began}
        assert stat.S_IMODE(marker(settings).stat().st_mode) == 0o600
        assert stat.S_IMODE(marker(settings).parent.stat().st_mode) == 0o700
        assert list(attempt_dirs(marker(settings).parent)) == [], "the marker is no attempt"
        clock.now += 119
        assert await first.poll(req()) == WAITING
    finally:
        first.close()

    metrics = Metrics()
    restarted = service(metrics)  # the clock is on disk: a new service instance keeps it
    try:
        clock.now += 1
        failed = Progress(ProgressState.FAILED, TIMED_OUT, transient=True)
        assert await restarted.poll(req()) == failed
        health.failing = replace(CEPH_SLOW, detail="no CephCluster rook-ceph/ceph")  # another reason
        assert await restarted.poll(req()) == failed, "the same message on every call"
        assert side.calls.count(f"state Failed: {TIMED_OUT}") == 1, "one Failed Event"
        assert _sample(metrics, "inplace_extension_updates_failed") == 1
        assert fake.count("m1") == 0, "nothing runs before the check holds"

        # the retry annotation changed: the wait begins afresh, a new timeout later a new Failure
        retried = req(annotations={RETRY_ANNOTATION: "1"})
        assert (await restarted.poll(retried)).message == health.failing.waiting
        assert json.loads(marker(settings).read_text()) == {
            "check": "ceph",
            "retry_token": retry_token("1"),
            "since": clock.now,
        }
        clock.now += 119
        assert (await restarted.poll(retried)).state is ProgressState.IN_PROGRESS
        clock.now += 1
        assert await restarted.poll(retried) == failed
        assert side.calls.count(f"state Failed: {TIMED_OUT}") == 2, "once per wait"

        health.failing = None  # the check holds: not remembered, the next call starts the update
        assert (await settle(restarted, retried)).state is ProgressState.DONE
        assert fake.count("m1") == 1
        assert not marker(settings).exists(), "the wait is over"
        assert _sample(metrics, "inplace_extension_updates_failed") == 0
    finally:
        restarted.close()


async def test_another_check_a_pause_or_a_check_without_timeout_begins_the_wait_afresh(
    settings: Settings, fake: FakeRunner
) -> None:
    db = replace(CEPH_SLOW, check="db", detail="no StatefulSet with app=db in db")
    health, clock = Health(CEPH_SLOW), Clock(utc("2026-12-01T12:00:00"))
    service = run_service(settings, clock=clock, object_health=health)
    try:
        assert await service.poll(req()) == WAITING
        clock.now += 100
        health.failing = db  # ceph holds now, db does not: its own clock
        assert (await service.poll(req())).state is ProgressState.IN_PROGRESS
        assert json.loads(marker(settings).read_text())["since"] == clock.now
        clock.now += 100
        assert (await service.poll(req())).state is ProgressState.IN_PROGRESS
        clock.now += 20
        assert (await service.poll(req())).message == TIMED_OUT.replace('"ceph"', '"db"')

        paused = replace(req(), hold=Hold("paused by MachineDeployment default/md (annotation x)"))
        assert (await service.poll(paused)).waiting == "pause"
        assert not marker(settings).exists(), "a pause ends the wait"
        assert (await service.poll(req())).state is ProgressState.IN_PROGRESS, "a new wait"

        health.failing = CEPH_DOWN  # no timeout: as long as it takes, nothing on disk
        assert await service.poll(req()) == WAITING
        assert not marker(settings).exists()
        clock.now += 7 * 24 * 3600
        assert await service.poll(req()) == WAITING
        assert fake.count("m1") == 0
    finally:
        service.close()


def test_a_marker_that_cannot_be_read_begins_the_wait_afresh(tmp_path: Path) -> None:
    ident_dir = tmp_path / "runs" / "default.m1.abc"
    ident_dir.mkdir(parents=True)
    write_json(ident_dir / health_wait.WAIT_FILE, {"check": "ceph", "retry_token": "", "since": "soon"})
    assert health_wait.began(ident_dir, "ceph", "", 100.0) == 100.0
    assert health_wait.began(ident_dir, "ceph", "", 200.0) == 100.0
    (ident_dir / health_wait.WAIT_FILE).write_text("{not json")
    assert health_wait.began(ident_dir, "ceph", "", 300.0) == 300.0
