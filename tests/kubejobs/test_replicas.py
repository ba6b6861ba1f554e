"""Two replicas are one service (issue 38, item 4), for the ``kubernetes`` executor over the in-memory
fake (tests/kubefake.py): what a poll answers never depends on which replica answers it or on what a
replica remembers, and an attempt's outcome outlives its Job."""

from __future__ import annotations

from pathlib import Path

import pytest
from kubefake import FakeJobs, FakeManagement
from run_deps import run_service
from runs.test_service import Clock, utc

from inplace_extension.inplace.custom import NO_CUSTOM
from inplace_extension.kubeaware.cluster_side import KubeClusterSide
from inplace_extension.kubejobs.manifest import JOB_TTL_BACKSTOP_SECONDS, MACHINE_LABEL
from inplace_extension.kubejobs.record import RECORD_ANNOTATION, Record
from inplace_extension.runs.attempts import OutcomeKind
from inplace_extension.runs.holds import PAUSE_ANNOTATION
from inplace_extension.runs.model import Progress, ProgressState, RunRequest
from inplace_extension.runs.play_time import known_cost
from inplace_extension.runs.service import RunService
from inplace_extension.settings import Settings
from kubejobs.support import CONFIG, MACHINE, job_backend, kube_settings, machine_of, outcome
from kubejobs.test_backend import STARTING, machine_backend

pytestmark = pytest.mark.anyio
FP = "cd" * 32
APPLIED = Progress(ProgressState.DONE, "update applied")


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return kube_settings(tmp_path, retry_after_seconds=30, job_ttl_seconds=3600)


@pytest.fixture
def clock() -> Clock:
    return Clock(utc("2026-12-01T12:00:00"))


def replica(settings: Settings, cluster: FakeJobs, clock: Clock) -> RunService:
    return run_service(settings, clock=clock, backend=machine_backend(cluster, clock))


def req(capabilities: tuple[str, ...] = ("ntp",)) -> RunRequest:
    return RunRequest(
        namespace="default",
        name="m1",
        fingerprint=FP,
        capabilities=capabilities,
        inputs={c: {"x": [c]} for c in capabilities},
    )


def job_of(jobs: FakeJobs, machine: str) -> str:
    """The name of the one Job of ``machine``'s current attempt (named with its episode: the record's)."""
    (name,) = [
        name
        for (_, name), job in jobs.jobs.items()
        if job.manifest["metadata"]["labels"][MACHINE_LABEL] == machine and not job.finished
    ]
    return name


def record(cluster: FakeJobs) -> Record:
    return Record.decode(cluster.annotation(MACHINE, RECORD_ANNOTATION), req().ident)


async def test_a_jobs_outcome_outlives_its_ttl_while_no_replica_polls(
    settings: Settings, cluster: FakeJobs, clock: Clock
) -> None:
    """The Job ends, and no replica polls for longer than --job-ttl-seconds: the Job (and its
    termination message) is still there, so the next poll records its outcome: no second play. Once
    the outcome is in the record the Job is kept for --job-ttl-seconds more (its logs), then goes."""
    assert (await replica(settings, cluster, clock).poll(req())).message == STARTING.message
    name = job_of(cluster, "m1")
    (job,) = cluster.jobs.values()
    assert job.manifest["spec"]["ttlSecondsAfterFinished"] == JOB_TTL_BACKSTOP_SECONDS
    cluster.finish(name, outcome(OutcomeKind.SUCCESSFUL, clock.now + 5), at=clock.now + 5)
    clock.now += 5 + settings.job_ttl_seconds + 60  # no replica polled meanwhile
    cluster.ttl_controller(clock.now)
    assert (CONFIG.namespace, name) in cluster.jobs, "the outcome is not recorded yet: the Job stays"
    assert await replica(settings, cluster, clock).poll(req()) == APPLIED
    assert len(cluster.jobs) == 1 and cluster.calls.count["create_job"] == 1, "no second play"
    (attempt,) = record(cluster).attempts
    assert attempt.outcome is not None and attempt.outcome.kind is OutcomeKind.SUCCESSFUL
    assert job.manifest["spec"]["ttlSecondsAfterFinished"] == settings.job_ttl_seconds
    cluster.ttl_controller(clock.now)
    assert cluster.jobs == {}, "recorded: the Job goes --job-ttl-seconds after it finished"
    assert await replica(settings, cluster, clock).poll(req()) == APPLIED


async def test_the_expected_end_of_a_play_is_the_records(
    settings: Settings, cluster: FakeJobs, clock: Clock
) -> None:
    """A replica that saw plays of these steps end expects the next one to end sooner than the steps'
    known costs say; a fresh replica polling that play answers with the same retryAfterSeconds (the
    expected end is recorded with the attempt, not kept by the replica that launched it)."""
    steps = ("kubernetes_version",)  # known cost 22 s
    experienced = replica(settings, cluster, clock)
    assert (await experienced.poll(req(steps))).in_flight
    cluster.finish(job_of(cluster, "m1"), outcome(OutcomeKind.SUCCESSFUL, clock.now + 8), at=clock.now + 8)
    clock.now += 8
    assert await experienced.poll(req(steps)) == APPLIED  # it learns: this play takes 8 s
    # the next desired state of the same Machine, launched by the replica that learned
    second = RunRequest(
        namespace="default", name="m1", fingerprint="ef" * 32, capabilities=steps, inputs={"x": {"y": 1}}
    )
    launched = await experienced.poll(second)
    assert launched.in_flight
    assert launched.retry_after_seconds < known_cost(steps) - 8, "the learned 8 s, not the known 22 s"
    clock.now += 1
    answers = [await experienced.poll(second), await replica(settings, cluster, clock).poll(second)]
    assert answers[0] == answers[1], "a fresh replica expects the recorded end"


async def test_a_rollout_answers_alike_from_either_replica_one_replaced_half_way_each_event_once(
    settings: Settings, clock: Clock
) -> None:
    """A MachineDeployment of two Machines updated one after the other, paused at first; CAPI's polls
    go to two replicas in turn, and after the first Machine one replica is replaced by a fresh one. Each
    poll is asked of both replicas at the same moment: the answers are equal (also the in-flight
    retryAfterSeconds of the second Machine's play, which one replica expects from the first Machine's
    and the fresh one could not), and every Event on the Machines is there once."""
    management = FakeManagement()
    for name, node in (("m1", "node-1"), ("m2", "node-2")):
        management.add_machine("default", name, node)
    management.owners[("MachineDeployment", "default", "md-0")] = {PAUSE_ANNOTATION: ""}
    jobs = FakeJobs()

    def fresh() -> RunService:
        side = KubeClusterSide(management, settings, NO_CUSTOM)
        backend = job_backend(jobs, management, machine_of, clock)
        return run_service(settings, cluster=side, clock=clock, backend=backend)

    replicas = [fresh(), fresh()]
    turn = 0

    async def poll(request: RunRequest) -> Progress:
        nonlocal turn
        first, second = replicas[turn % 2], replicas[(turn + 1) % 2]
        turn += 1
        answer = await first.poll(request)
        assert await second.poll(request) == answer, f"poll {turn} of {request.name}"
        return answer

    steps = ("ntp", "kubelet_args")  # known costs: 6 s
    m1, m2 = (
        RunRequest(
            namespace="default",
            name=name,
            fingerprint=FP,
            capabilities=steps,
            inputs={c: {"x": [c]} for c in steps},
            labels={"cluster.x-k8s.io/deployment-name": "md-0"},
        )
        for name in ("m1", "m2")
    )
    paused = await poll(m1)
    assert paused.waiting == "pause" and await poll(m1) == paused
    del management.owners[("MachineDeployment", "default", "md-0")]
    assert (await poll(m1)).in_flight
    clock.now += 1
    jobs.only_job().phase = "running: ntp"
    assert (await poll(m1)).message == "running: ntp"
    began = clock.now - 1
    jobs.finish(job_of(jobs, "m1"), outcome(OutcomeKind.SUCCESSFUL, began + 20), at=began + 20)
    clock.now = began + 20  # the play took 20 s: the replicas that saw it end expect as much next time
    assert await poll(m1) == APPLIED
    replicas[turn % 2] = fresh()  # half-way: the next poll's first replica is a fresh one
    launched = await poll(m2)
    assert launched.in_flight
    for _ in range(3):
        clock.now += 1
        assert (await poll(m2)).in_flight
    jobs.finish(job_of(jobs, "m2"), outcome(OutcomeKind.SUCCESSFUL, clock.now), at=clock.now)
    assert await poll(m2) == APPLIED
    assert await poll(m2) == APPLIED
    posted = [(event.about.name, event.reason) for event in management.events]
    assert posted == [("m1", "Waiting"), ("m1", "Queued"), ("m1", "Done"), ("m2", "Queued"), ("m2", "Done")]


async def test_a_passed_health_gate_is_the_records(settings: Settings, clock: Clock) -> None:
    """The health gate passed for one replica (done, its Event posted); the Node goes NotReady later
    (a kubelet restart by someone else): a fresh replica answers done too, as the one that saw it pass."""
    management = FakeManagement()
    management.add_machine("default", "m1", "node-1")
    jobs = FakeJobs()

    def fresh() -> RunService:
        side = KubeClusterSide(management, settings, NO_CUSTOM)
        return run_service(
            settings, cluster=side, clock=clock, backend=job_backend(jobs, management, machine_of, clock)
        )

    seen = fresh()
    assert (await seen.poll(req())).in_flight
    jobs.finish(job_of(jobs, "m1"), outcome(OutcomeKind.SUCCESSFUL, clock.now + 1), at=clock.now + 1)
    clock.now += 1
    assert await seen.poll(req()) == APPLIED
    management.cluster.nodes["node-1"].ready = False
    assert await seen.poll(req()) == APPLIED
    assert await fresh().poll(req()) == APPLIED
    assert management.reasons() == ["Queued", "Done"]


async def test_one_update_polled_by_replicas_in_turn_one_replaced_mid_play_answers_alike_each_event_once(
    settings: Settings, clock: Clock
) -> None:
    """One Machine's update from its start to done, every poll asked of two replicas back to back
    (nothing changes in between; which one is asked first alternates), one replica replaced by a fresh
    one while the first attempt's Job runs. That Job ends without an outcome (its Pod killed): the
    attempt is interrupted, and retried after the backoff. Each pair of answers is equal, and each
    (reason, message) is one Event on the Machine, however many replicas answered that state."""
    management = FakeManagement()
    management.add_machine("default", "m1", "node-1")
    jobs = FakeJobs()

    def fresh() -> RunService:
        side = KubeClusterSide(management, settings, NO_CUSTOM)
        backend = job_backend(jobs, management, machine_of, clock)
        return run_service(settings, cluster=side, clock=clock, backend=backend)

    replicas = [fresh(), fresh()]
    answered: list[Progress] = []
    # a play of known cost 22 s: the polls below are not in its end window (where a poll waits for the
    # Job in real time)
    request = req(("kubernetes_version",))

    async def poll() -> Progress:
        first, second = replicas[len(answered) % 2], replicas[(len(answered) + 1) % 2]
        answer = await first.poll(request)
        assert await second.poll(request) == answer, f"poll {len(answered) + 1}: {answered}"
        answered.append(answer)
        return answer

    assert (await poll()).in_flight
    clock.now += 1
    jobs.only_job().phase = "running: kubernetes_version"
    assert (await poll()).message == "running: kubernetes_version"
    replicas[len(answered) % 2] = fresh()  # mid-play: the next poll's first replica is a fresh one
    clock.now += 1
    assert (await poll()).message == "running: kubernetes_version"
    jobs.finish(job_of(jobs, "m1"), None, at=clock.now)  # no outcome: its Pod was killed
    clock.now += 1
    interrupted = await poll()
    assert interrupted.message == "run interrupted, retrying (attempt 2)", interrupted
    deadline = clock.now + 600  # the retry backoff, polled as CAPI does
    while not (await poll()).in_flight or len(jobs.jobs) < 2:
        assert clock.now < deadline, answered
        clock.now += answered[-1].retry_after_seconds
    jobs.finish(job_of(jobs, "m1"), outcome(OutcomeKind.SUCCESSFUL, clock.now + 5), at=clock.now + 5)
    clock.now += 5
    assert await poll() == APPLIED
    assert await poll() == APPLIED

    annotations = management.machines[("default", "m1")].annotations
    first, second = Record.decode(annotations[RECORD_ANNOTATION], request.ident).attempts
    assert first.outcome is not None and first.outcome.kind is OutcomeKind.INTERRUPTED
    assert second.outcome is not None and second.outcome.kind is OutcomeKind.SUCCESSFUL
    assert jobs.calls.count["create_job"] == 2, "one Job per attempt"
    posted = [(event.about.name, event.reason, event.message) for event in management.events]
    assert posted == [("m1", "Queued", "queued"), ("m1", "Done", "update applied")]
