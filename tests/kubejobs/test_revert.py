"""A revert (a Machine's desired state A -> B -> A) with the ``kubernetes`` executor against
tests/kubefake.py: the second A is a new episode with a Job of its own, never answered by a Job of A's
first episode, even while that Job still exists (its TTL); replicas racing to start it agree on one
episode and one Job."""

from __future__ import annotations

import threading

import anyio
import pytest
from kubefake import FakeJobs
from run_deps import run_service
from runs.test_service import Clock, utc

from inplace_extension.kube.port import Annotation, RecordRef
from inplace_extension.kubejobs.manifest import EPISODE_LABEL
from inplace_extension.kubejobs.record import RECORD_ANNOTATION, Record
from inplace_extension.runs.attempts import OutcomeKind
from inplace_extension.runs.model import Progress, ProgressState, RunRequest
from inplace_extension.runs.service import RunService
from inplace_extension.settings import Settings
from kubejobs.support import MACHINE, job_backend, machine_of, outcome

pytestmark = pytest.mark.anyio
A, B = "ab" * 32, "cd" * 32
STARTING = Progress(ProgressState.IN_PROGRESS, "running: starting", 1, in_flight=True)


@pytest.fixture
def clock() -> Clock:
    return Clock(utc("2026-12-01T12:00:00"))


def replica(settings: Settings, cluster: FakeJobs, clock: Clock, records: object = None) -> RunService:
    store = cluster if records is None else records
    return run_service(
        settings,
        clock=clock,
        backend=job_backend(cluster, store, machine_of, clock),  # type: ignore[arg-type]
    )


def req(fp: str) -> RunRequest:
    return RunRequest(
        namespace="default",
        name="m1",
        fingerprint=fp,
        capabilities=("ntp",),
        inputs={"ntp": {"ntp_servers": [fp[:2]]}},
    )


def record(cluster: FakeJobs, request: RunRequest) -> Record:
    return Record.decode(cluster.annotation(MACHINE, RECORD_ANNOTATION), request.ident)


def job_names(cluster: FakeJobs) -> list[str]:
    return [name for _, name in cluster.jobs]


async def applied(service: RunService, cluster: FakeJobs, clock: Clock, request: RunRequest) -> str:
    """Start ``request``'s update, end its Job successfully, see it done; its Job's name."""
    before = set(job_names(cluster))
    assert await service.poll(request) == STARTING
    (new,) = set(job_names(cluster)) - before
    cluster.finish(new, outcome(OutcomeKind.SUCCESSFUL, clock.now))
    assert (await service.poll(request)).state is ProgressState.DONE
    return new


async def test_a_reverted_desired_state_gets_a_job_of_its_own_while_the_old_one_still_exists(
    settings: Settings, cluster: FakeJobs, clock: Clock
) -> None:
    service = replica(settings, cluster, clock)
    first_a = await applied(service, cluster, clock, req(A))
    clock.now += 60
    await applied(service, cluster, clock, req(B))
    clock.now += 60
    assert await service.poll(req(A)) == STARTING, "A's first Job (still there: its TTL) answers nothing"
    assert len(cluster.jobs) == 3 and first_a in job_names(cluster)
    (second_a,) = set(job_names(cluster)) - {first_a, *job_names(cluster)[1:2]}
    assert await replica(settings, cluster, clock).poll(req(A)) == STARTING, "a fresh replica alike"
    assert [a.outcome for a in record(cluster, req(A)).attempts] == [None]
    cluster.finish(second_a, outcome(OutcomeKind.SUCCESSFUL, clock.now))
    assert (await service.poll(req(A))).state is ProgressState.DONE
    assert (await service.poll(req(A))).state is ProgressState.DONE, "the same episode, no new Job"
    assert len(cluster.jobs) == 3
    episodes = [job.manifest["metadata"]["labels"][EPISODE_LABEL] for job in cluster.jobs.values()]
    assert len(set(episodes)) == 3, "each desired state's episode labels its Jobs"
    assert record(cluster, req(A)).episode == episodes[2]


async def test_a_failure_of_an_earlier_episode_answers_nothing_of_a_later_one(
    settings: Settings, cluster: FakeJobs, clock: Clock
) -> None:
    service = replica(settings, cluster, clock)
    assert await service.poll(req(A)) == STARTING
    (first,) = job_names(cluster)
    cluster.finish(first, outcome(OutcomeKind.TASK_FAILED, clock.now, capability="ntp", task="Write"))
    assert (await service.poll(req(A))).state is ProgressState.FAILED
    await applied(service, cluster, clock, req(B))
    assert await service.poll(req(A)) == STARTING
    assert len(cluster.jobs) == 3


class RacingRecords:
    """The record store of one replica: its first write waits until the other replica's first write
    comes too, so both decided on the record as it was before either wrote (the race of two replicas
    polling at once); writes reach the fake one at a time, as the API server serialises them."""

    def __init__(self, cluster: FakeJobs, both: threading.Barrier, lock: threading.Lock) -> None:
        self._cluster, self._both, self._lock = cluster, both, lock
        self._raced = False

    def read(self, ref: RecordRef, key: str) -> Annotation | None:
        with self._lock:
            return self._cluster.read(ref, key)

    def write(self, ref: RecordRef, key: str, value: str | None, resource_version: str) -> None:
        if not self._raced:
            self._raced = True
            self._both.wait(10)
        with self._lock:
            self._cluster.write(ref, key, value, resource_version)


async def test_two_replicas_starting_a_revert_at_once_agree_on_one_episode_and_one_job(
    settings: Settings, cluster: FakeJobs, clock: Clock
) -> None:
    service = replica(settings, cluster, clock)
    await applied(service, cluster, clock, req(A))
    await applied(service, cluster, clock, req(B))
    both, lock = threading.Barrier(2), threading.Lock()
    one = replica(settings, cluster, clock, RacingRecords(cluster, both, lock))
    two = replica(settings, cluster, clock, RacingRecords(cluster, both, lock))
    answers: list[Progress] = []

    async def poll(service: RunService) -> None:
        answers.append(await service.poll(req(A)))

    async with anyio.create_task_group() as group:
        group.start_soon(poll, one)
        group.start_soon(poll, two)
    assert answers == [STARTING, STARTING]
    assert len(cluster.jobs) == 3, "one new Job for the revert"
    new = list(cluster.jobs.values())[2]
    current = record(cluster, req(A))
    assert [a.job for a in current.attempts] == [new.manifest["metadata"]["name"]]
    assert new.manifest["metadata"]["labels"][EPISODE_LABEL] == current.episode
    assert await one.poll(req(A)) == await two.poll(req(A)) == STARTING
