"""A revert (a machine's desired state A -> B -> A) with the ``local`` executor: the second A is a new
episode of A, so it plays again, and no outcome of A's first episode answers it (FakeRunner: no host)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import anyio
import pytest
from run_deps import run_service

from inplace_extension.runs.model import Progress, ProgressState, RunRequest
from inplace_extension.runs.service import RunService
from inplace_extension.settings import Settings

from .fakes import FakeRunner, failed_events
from .test_service import CEPH_DOWN, Health, settle
from .test_service import req as _req
from .test_service import settings as settings  # the same service settings: a fixture

pytestmark = pytest.mark.anyio
A, B = "ab" * 32, "cd" * 32


def req(name: str = "m1", fp: str = A) -> RunRequest:
    return _req(name, fp)


@pytest.fixture
def svc(settings: Settings, fake: FakeRunner) -> Iterator[RunService]:
    service = run_service(settings)
    yield service
    if fake.gate is not None:
        fake.gate.set()
    service.close()


async def test_a_reverted_desired_state_plays_again_and_answers_done_only_after_its_own_play(
    svc: RunService, fake: FakeRunner
) -> None:
    assert (await settle(svc, req(fp=A))).state is ProgressState.DONE
    assert (await settle(svc, req(fp=B))).state is ProgressState.DONE
    assert fake.count("m1") == 2
    fake.gate = threading.Event()  # A's second play holds until the test lets it end
    first = await svc.poll(req(fp=A))
    assert first.state is ProgressState.IN_PROGRESS and first.in_flight, first
    deadline = time.monotonic() + 5
    while fake.count("m1") < 3:
        assert time.monotonic() < deadline, "A's second play never started"
        await anyio.sleep(0.01)
    during = await svc.poll(req(fp=A))
    assert during.state is ProgressState.IN_PROGRESS, "A's first success answers nothing of its revert"
    fake.gate.set()
    assert (await settle(svc, req(fp=A))).state is ProgressState.DONE
    assert [run.fingerprint for run in fake.started] == [A, B, A]
    third = fake.started[2]
    assert third.attempt_dir.name == "attempt-0002", "A's first attempt is kept (its artifacts)"
    assert (third.attempt_dir.parent / "attempt-0001" / "outcome.json").exists()


async def test_a_poll_of_the_same_episode_after_its_success_plays_nothing(
    svc: RunService, fake: FakeRunner
) -> None:
    assert (await settle(svc, req(fp=A))).state is ProgressState.DONE
    assert (await svc.poll(req(fp=A))).state is ProgressState.DONE
    assert (await svc.poll(req(fp=A))).state is ProgressState.DONE
    assert fake.count("m1") == 1


async def test_a_restarted_service_answers_the_revert_from_disk(settings: Settings, fake: FakeRunner) -> None:
    first = run_service(settings)
    try:
        assert (await settle(first, req(fp=A))).state is ProgressState.DONE
        assert (await settle(first, req(fp=B))).state is ProgressState.DONE
    finally:
        first.close()
    second = run_service(settings)  # nothing in memory: the runs dir says B is the current state
    try:
        assert (await settle(second, req(fp=A))).state is ProgressState.DONE
        assert fake.count("m1") == 3
        third = run_service(settings)
        try:
            assert (await third.poll(req(fp=A))).state is ProgressState.DONE, "the revert's own success"
            assert fake.count("m1") == 3
        finally:
            third.close()
    finally:
        second.close()


async def test_a_failure_of_an_earlier_episode_answers_nothing_of_a_later_one(
    svc: RunService, fake: FakeRunner
) -> None:
    fake.scripts["m1"] = [lambda run: ("failed", 2, failed_events("ntp", "Write config"))]
    failed = await settle(svc, req(fp=A))
    assert failed == Progress(ProgressState.FAILED, 'ntp: task "Write config" failed on host')
    assert (await settle(svc, req(fp=B))).state is ProgressState.DONE
    assert (await settle(svc, req(fp=A))).state is ProgressState.DONE, "A is tried again, and succeeds"
    assert fake.count("m1") == 3


async def test_other_machines_keep_their_episodes(svc: RunService, fake: FakeRunner) -> None:
    assert (await settle(svc, req("m1", fp=A))).state is ProgressState.DONE
    assert (await settle(svc, req("m2", fp=B))).state is ProgressState.DONE
    assert (await svc.poll(req("m1", fp=A))).state is ProgressState.DONE
    assert (await svc.poll(req("m2", fp=B))).state is ProgressState.DONE
    assert fake.count("m1") == fake.count("m2") == 1


async def test_the_health_gate_judges_a_revert_again(settings: Settings, fake: FakeRunner) -> None:
    health = Health()
    service = run_service(settings, object_health=health)
    try:
        assert (await settle(service, req(fp=A))).state is ProgressState.DONE  # its gate passed
        assert (await settle(service, req(fp=B))).state is ProgressState.DONE
        fake.gate = threading.Event()
        await service.poll(req(fp=A))
        deadline = time.monotonic() + 5
        while fake.count("m1") < 3:
            assert time.monotonic() < deadline, "A's second play never started"
            await anyio.sleep(0.01)
        health.failing = CEPH_DOWN  # the revert made the cluster unhealthy
        fake.gate.set()
        answer = await settle(service, req(fp=A))
        assert answer == Progress(
            ProgressState.IN_PROGRESS, f"health gate: {CEPH_DOWN.waiting}", 1, waiting="health_check"
        ), "A's first gate answers nothing of its revert"
        health.failing = None
        assert (await service.poll(req(fp=A))).state is ProgressState.DONE
    finally:
        if fake.gate is not None:
            fake.gate.set()
        service.close()
