"""The ``kubernetes`` executor against the in-memory fake of the ``kube`` ports (tests/kubefake.py): two
replicas that share nothing but the (fake) cluster answer every poll alike, one Job per attempt, each
outcome recorded once on the Machine, and a replica that never saw a run (empty disk, empty memory)
answers as the one that started it: attempts, retry budget, retry token, health-wait clock, lock
takeover. The real API server's part (Jobs, Pods, termination messages) is for the lab."""

from __future__ import annotations

import base64
import json
import threading
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from kubefake import FakeJobs, ReplicaKilled
from run_deps import run_service
from runs.test_service import CEPH_DOWN, INVENTORY, Clock, Health, utc

from inplace_extension.kube.errors import Unreachable
from inplace_extension.kubejobs.backend import JOB_APPEARS_SECONDS, JOB_LOOK_SECONDS, JobBackend
from inplace_extension.kubejobs.manifest import (
    ATTEMPT_KEY_FILE,
    SSH_KEY,
    WORKLOAD_KUBECONFIG,
    WORKLOAD_KUBECONFIG_FILE,
    job_name,
)
from inplace_extension.kubejobs.record import RECORD_ANNOTATION, Record
from inplace_extension.kubejobs.spec import AttemptSpec
from inplace_extension.runs import progress
from inplace_extension.runs.attempts import Outcome, OutcomeKind
from inplace_extension.runs.model import (
    NO_OBJECT_HEALTH,
    Hold,
    NoClusterSide,
    ObjectHealth,
    Progress,
    ProgressState,
    RunRequest,
)
from inplace_extension.runs.play_time import known_cost
from inplace_extension.runs.policy import RETRY_ANNOTATION
from inplace_extension.runs.resolve import ResolveError
from inplace_extension.runs.service import RunService
from inplace_extension.settings import Settings
from kubejobs.support import (
    CONFIG,
    MACHINE,
    PRIVATE_KEY,
    START_SECONDS,
    job_backend,
    machine_of,
    outcome,
)

pytestmark = pytest.mark.anyio
FP = "ab" * 32
STARTING = Progress(ProgressState.IN_PROGRESS, "running: starting", 1, in_flight=True)


@pytest.fixture
def clock() -> Clock:
    return Clock(utc("2026-12-01T12:00:00"))


def machine_backend(cluster: FakeJobs, clock: Clock) -> JobBackend:
    """A replica's backend, each request's record on its Machine."""
    return job_backend(cluster, cluster, machine_of, clock)


def replica(
    settings: Settings, cluster: FakeJobs, clock: Clock, health: ObjectHealth = NO_OBJECT_HEALTH
) -> RunService:
    """A fresh replica: its own (empty) memory, the cluster shared."""
    return run_service(settings, object_health=health, clock=clock, backend=machine_backend(cluster, clock))


def req(fp: str = FP, annotations: dict[str, str] | None = None) -> RunRequest:
    return RunRequest(
        namespace="default",
        name="m1",
        fingerprint=fp,
        capabilities=("ntp",),
        inputs={"ntp": {"ntp_servers": ["a"]}},
        annotations=annotations or {},
    )


def record(cluster: FakeJobs, request: RunRequest | None = None) -> Record:
    return Record.decode(cluster.annotation(MACHINE, RECORD_ANNOTATION), (request or req()).ident)


def job_of(cluster: FakeJobs, attempt: int) -> str:
    """The name of attempt ``attempt``'s Job, as the record says (it carries the record's episode)."""
    return next(a.job for a in record(cluster).attempts if a.number == attempt)


def spec_of(cluster: FakeJobs, attempt: int) -> AttemptSpec:
    secret = cluster.secrets[(CONFIG.namespace, job_of(cluster, attempt))]
    return AttemptSpec.decode(secret["stringData"]["attempt.json"])


async def test_two_replicas_start_one_job_and_answer_its_phase_and_outcome_alike(
    settings: Settings, cluster: FakeJobs, clock: Clock
) -> None:
    a, b = replica(settings, cluster, clock), replica(settings, cluster, clock)
    assert await a.poll(req()) == STARTING
    assert await b.poll(req()) == STARTING
    job = cluster.only_job()
    assert job.manifest["metadata"]["name"] == job_of(cluster, 1)
    assert cluster.calls.count["create_job"] == 1, "the second replica found the attempt in flight"
    assert job.manifest["spec"]["template"]["spec"]["affinity"], "kept off the Machine's Node"
    (attempt,) = record(cluster).attempts
    assert (attempt.number, attempt.outcome, attempt.address) == (1, None, "10.79.9.11")
    assert spec_of(cluster, 1).lock_token == attempt.lock_token

    job.phase = "ntp"  # the Job's Pod published it on itself
    running = Progress(ProgressState.IN_PROGRESS, "running: ntp", 1, in_flight=True)
    assert await a.poll(req()) == running
    assert await b.poll(req()) == running

    cluster.finish(job.manifest["metadata"]["name"], outcome(OutcomeKind.SUCCESSFUL, clock.now))
    writes = cluster.calls.count["write"]
    done = Progress(ProgressState.DONE, "update applied")
    assert await b.poll(req()) == done
    assert await a.poll(req()) == done
    assert await replica(settings, cluster, clock).poll(req()) == done
    assert cluster.calls.count["write"] == writes + 1, "the outcome is recorded once"
    assert record(cluster).attempts[0].outcome == Outcome(OutcomeKind.SUCCESSFUL, finished=clock.now)
    assert len(cluster.jobs) == 1


async def test_each_job_gets_its_targets_private_key_alone_in_its_own_secret(
    settings: Settings, cluster: FakeJobs, clock: Clock
) -> None:
    assert await replica(settings, cluster, clock).poll(req()) == STARTING
    secret = cluster.secrets[(CONFIG.namespace, job_of(cluster, 1))]
    # the one key the inventory names for this host, copied by the service; the play reads the copy
    assert base64.b64decode(secret["data"][SSH_KEY]) == PRIVATE_KEY
    assert set(secret["data"]) == {SSH_KEY} and set(secret["stringData"]) == {"attempt.json"}
    target = spec_of(cluster, 1).target
    assert target.private_key_file == Path(ATTEMPT_KEY_FILE)
    assert target.host_keys, "the known_hosts entry of this host travels with it"
    # the Job mounts its own Secret and no other (never the SSH Secret with every host's key)
    pod = cluster.only_job().manifest["spec"]["template"]["spec"]
    mounted = [v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v]
    assert mounted == [job_of(cluster, 1)]


@pytest.mark.parametrize("source", ["secret", "file", "management"])
async def test_a_kube_aware_job_gets_its_clusters_kubeconfig_copied_and_reads_no_secret_itself(
    settings: Settings, cluster: FakeJobs, clock: Clock, tmp_path: Path, source: str
) -> None:
    kubeconfig = b"apiVersion: v1\nkind: Config\n# the workload cluster's admin credentials\n"
    cluster.other_secrets[("default", "c1-kubeconfig")] = {"value": kubeconfig}
    (tmp_path / "workload.kubeconfig").write_bytes(kubeconfig)
    where = {"secret": "secret", "file": str(tmp_path / "workload.kubeconfig"), "management": "management"}
    settings_of_jobs = {"kube": True, "workload_kubeconfig": where[source]}
    backend = job_backend(cluster, cluster, machine_of, clock, job_settings=settings_of_jobs)
    service = run_service(settings, clock=clock, backend=backend)
    labelled = replace(req(), labels={"cluster.x-k8s.io/cluster-name": "c1"})
    assert await service.poll(labelled) == STARTING
    (job,) = [name for (_, name) in cluster.secrets]
    secret = cluster.secrets[(CONFIG.namespace, job)]
    spec = AttemptSpec.decode(secret["stringData"]["attempt.json"])
    if source == "management":  # the Nodes are in the Job's own cluster: its account drains
        assert WORKLOAD_KUBECONFIG not in secret["data"]
        assert spec.settings["workload_kubeconfig"] == "management"
    else:
        assert base64.b64decode(secret["data"][WORKLOAD_KUBECONFIG]) == kubeconfig
        assert spec.settings["workload_kubeconfig"] == WORKLOAD_KUBECONFIG_FILE  # read from its own mount
    assert cluster.calls.count["secret_value"] == (source == "secret")


async def test_a_key_the_service_cannot_read_fails_before_anything_is_recorded(
    settings: Settings, cluster: FakeJobs, clock: Clock
) -> None:
    assert settings.inventory is not None
    settings.inventory.write_text(INVENTORY.replace("/keys/id", "/nonexistent/id"))
    with pytest.raises(ResolveError) as caught:
        await replica(settings, cluster, clock).poll(req())
    assert caught.value.reason == "PrivateKeyUnreadable"
    assert "/nonexistent/id" in caught.value.message
    assert cluster.jobs == {} and cluster.secrets == {}
    assert cluster.annotation(MACHINE, RECORD_ANNOTATION) is None, "no attempt without its Job's key"


async def test_a_job_that_exists_already_is_the_attempt_in_flight(
    settings: Settings, cluster: FakeJobs, clock: Clock
) -> None:
    cluster.conflict_next_write = 1  # another replica wrote the Machine meanwhile: read again, decide again
    episode = "0123456789abcdef"  # the record's episode, as that replica left it
    cluster.objects[("Machine", "default", "m1")]["annotations"][RECORD_ANNOTATION] = Record(
        req().ident, episode=episode
    ).encode()
    service = replica(settings, cluster, clock)
    name = job_name(req().ident, 1, episode=episode)
    cluster.create_job(
        {"metadata": {"namespace": CONFIG.namespace, "name": name}}, {"metadata": {"name": name}}
    )
    assert await service.poll(req()) == STARTING
    assert list(cluster.jobs) == [(CONFIG.namespace, name)]
    assert cluster.calls.count["create_job"] == 2  # ours answered "it existed": one Job all the same
    assert [a.number for a in record(cluster).attempts] == [1]


async def test_a_job_ended_without_an_outcome_counts_once_and_the_next_takes_its_lock_over(
    settings: Settings, cluster: FakeJobs, clock: Clock
) -> None:
    a, b = replica(settings, cluster, clock), replica(settings, cluster, clock)
    await a.poll(req())
    first = job_of(cluster, 1)
    cluster.finish(first, None)  # its Pod was deleted mid-play: no termination message
    retrying = await a.poll(req())
    assert retrying.retrying and retrying.message == "run interrupted, retrying (attempt 2)"
    assert await b.poll(req()) == retrying
    (attempt,) = record(cluster).attempts
    assert attempt.outcome is not None and attempt.outcome.kind is OutcomeKind.INTERRUPTED
    clock.now += 2  # past the backoff
    assert await b.poll(req()) == STARTING
    assert [n for _, n in sorted(cluster.jobs)] == sorted([first, job_of(cluster, 2)])
    second = spec_of(cluster, 2)
    assert second.number == 2
    assert second.takeover_tokens == (attempt.lock_token,), "the lock left by the gone Job is taken at once"
    assert second.lock_token != attempt.lock_token
    assert [a.number for a in record(cluster).attempts] == [1, 2]


async def test_the_retry_budget_and_token_hold_for_a_replica_that_never_saw_the_run(
    settings: Settings, cluster: FakeJobs, clock: Clock
) -> None:
    settings = settings.model_copy(update={"max_failed_attempts": 1})
    await replica(settings, cluster, clock).poll(req())
    cluster.finish(job_of(cluster, 1), None)
    blocked = Progress(ProgressState.FAILED, "blocked after 1 failed attempts: run interrupted", blocked=True)
    assert await replica(settings, cluster, clock).poll(req()) == blocked
    assert await replica(settings, cluster, clock).poll(req()) == blocked
    assert len(cluster.jobs) == 1
    retried = req(annotations={RETRY_ANNOTATION: "1"})
    assert await replica(settings, cluster, clock).poll(retried) == STARTING
    assert len(cluster.jobs) == 2


async def test_a_task_failure_is_remembered_for_every_replica(
    settings: Settings, cluster: FakeJobs, clock: Clock
) -> None:
    await replica(settings, cluster, clock).poll(req())
    message = outcome(OutcomeKind.TASK_FAILED, clock.now, capability="ntp", task="Write config")
    cluster.finish(job_of(cluster, 1), message)
    failed = Progress(ProgressState.FAILED, 'ntp: task "Write config" failed on host')
    assert await replica(settings, cluster, clock).poll(req()) == failed
    assert await replica(settings, cluster, clock).poll(req()) == failed
    assert len(cluster.jobs) == 1


async def test_a_job_that_never_appears_or_is_gone_is_interrupted_after_a_grace(
    settings: Settings, cluster: FakeJobs, clock: Clock
) -> None:
    service = replica(settings, cluster, clock)
    await service.poll(req())
    cluster.expire_job(job_of(cluster, 1))
    assert cluster.secrets == {}, "the Secret goes with the Job that owns it"
    clock.now += 10  # another replica may have recorded the attempt and not created its Job yet
    assert await service.poll(req()) == STARTING
    clock.now += JOB_APPEARS_SECONDS
    answer = await replica(settings, cluster, clock).poll(req())
    assert answer.retrying
    assert record(cluster).attempts[0].outcome is not None


async def test_the_health_wait_clock_is_the_clusters(
    settings: Settings, cluster: FakeJobs, clock: Clock
) -> None:
    health = Health(replace(CEPH_DOWN, start_timeout_seconds=120))
    began = clock.now
    waiting = await replica(settings, cluster, clock, health).poll(req())
    assert waiting.waiting == "health_check"
    wait = record(cluster).wait
    assert wait is not None and wait.since == began and wait.check == "ceph"
    clock.now += 121
    failed = await replica(settings, cluster, clock, health).poll(req())
    assert failed.state is ProgressState.FAILED and failed.transient
    assert "did not hold within 2m" in failed.message
    health.failing = None
    assert await replica(settings, cluster, clock, health).poll(req()) == STARTING
    assert record(cluster).wait is None, "a started update waits no more"


async def test_a_new_desired_state_starts_afresh_on_the_same_machine(
    settings: Settings, cluster: FakeJobs, clock: Clock
) -> None:
    service = replica(settings, cluster, clock)
    await service.poll(req())
    cluster.finish(job_of(cluster, 1), outcome(OutcomeKind.SUCCESSFUL, clock.now))
    assert (await service.poll(req())).state is ProgressState.DONE
    newer = req(fp="cd" * 32)
    assert await service.poll(newer) == STARTING
    assert [a.number for a in record(cluster, newer).attempts] == [1]
    assert json.loads(cluster.annotation(MACHINE, RECORD_ANNOTATION) or "{}")["ident"] == newer.ident


async def test_while_the_record_cannot_be_read_nothing_starts_and_the_poll_says_why(
    settings: Settings, cluster: FakeJobs, clock: Clock
) -> None:
    cluster.calls.failing.add("read")
    answer = await replica(settings, cluster, clock).poll(req())
    assert answer == Progress(
        ProgressState.IN_PROGRESS,
        "cluster API unavailable: the API server is unreachable (ConnectError)",
        1,
        unavailable=True,
    )
    assert progress.pattern(("ntp",), cluster_steps=True).fullmatch(answer.message)
    assert cluster.jobs == {}
    cluster.calls.failing.clear()
    assert await replica(settings, cluster, clock).poll(req()) == STARTING


async def test_a_new_desired_state_waits_for_the_job_of_the_earlier_one(
    settings: Settings, cluster: FakeJobs, clock: Clock
) -> None:
    service = replica(settings, cluster, clock)
    await service.poll(req())
    newer = req(fp="cd" * 32)
    queued = Progress(ProgressState.IN_PROGRESS, "queued: position 1 of 1", 1, in_flight=True)
    assert await replica(settings, cluster, clock).poll(newer) == queued
    assert len(cluster.jobs) == 1, "one Machine never has two plays at once"
    cluster.finish(job_of(cluster, 1), None)
    assert await replica(settings, cluster, clock).poll(newer) == STARTING
    assert json.loads(cluster.annotation(MACHINE, RECORD_ANNOTATION) or "{}")["ident"] == newer.ident


async def test_a_poll_reads_the_record_once(settings: Settings, cluster: FakeJobs, clock: Clock) -> None:
    """in_flight reads the record; the load of the same poll answers from that read, not from another
    GET of the Machine (each poll of each replica is one read, whatever it answers)."""
    service = replica(settings, cluster, clock)
    reads = cluster.calls.count["read"]
    assert await service.poll(req()) == STARTING  # nothing recorded: read, decide, launch
    # launching reads again, under its own precondition (the write's), and once for the Node
    launched = cluster.calls.count["read"] - reads
    job = cluster.only_job()
    reads = cluster.calls.count["read"]
    assert await service.poll(req()) == STARTING  # in flight: the load is not called
    assert cluster.calls.count["read"] == reads + 1
    cluster.finish(job.manifest["metadata"]["name"], outcome(OutcomeKind.SUCCESSFUL, clock.now))
    reads, writes = cluster.calls.count["read"], cluster.calls.count["write"]
    assert await service.poll(req()) == Progress(ProgressState.DONE, "update applied")
    # the outcome copied into the record: one read to find it, one (under the write's precondition) to
    # write it; the poll's load then answers from what in_flight read
    assert cluster.calls.count["write"] == writes + 1
    assert cluster.calls.count["read"] == reads + 2
    reads = cluster.calls.count["read"]
    assert await service.poll(req()) == Progress(ProgressState.DONE, "update applied")
    assert cluster.calls.count["read"] == reads + 1, "done: one read of the record"
    assert launched == 3


async def test_what_in_flight_read_is_the_next_loads_only(
    settings: Settings, cluster: FakeJobs, clock: Clock
) -> None:
    """The record in_flight kept is taken by the load that follows it, once: a later load (without an
    in_flight before it) reads the object again and sees what changed meanwhile."""
    backend = machine_backend(cluster, clock)
    assert await backend.reconcile(req()) is None
    assert await backend.attempts(req()) == []
    other = replica(settings, cluster, clock)
    assert await other.poll(req()) == STARTING  # another replica launched meanwhile
    reads = cluster.calls.count["read"]
    assert [a.number for a in await backend.attempts(req())] == [1]
    assert cluster.calls.count["read"] == reads + 1


async def test_a_poll_near_the_jobs_expected_end_waits_for_it_and_answers_done(
    settings: Settings, cluster: FakeJobs, clock: Clock
) -> None:
    """The Job's attempt began (the record's ``started``) long enough ago that its play is near its
    expected end: the poll looks at the Job until it finishes, copies its outcome and answers done."""
    service = replica(settings, cluster, clock)
    assert await service.poll(req()) == STARTING
    early = time.monotonic()
    assert await service.poll(req()) == STARTING  # its expected end is seconds away: no wait
    assert time.monotonic() - early < 0.5
    clock.now += known_cost(req().capabilities) - 1.0
    name = job_of(cluster, 1)
    threading.Timer(0.5, cluster.finish, (name, outcome(OutcomeKind.SUCCESSFUL, clock.now))).start()
    started = time.monotonic()
    done = await service.poll(req())
    assert (done.state, done.message) == (ProgressState.DONE, "update applied")
    assert 0.4 < time.monotonic() - started < 0.5 + 2 * JOB_LOOK_SECONDS + 0.5
    assert record(cluster).attempts[0].outcome is not None  # the outcome copied into the record


async def test_wait_end_of_a_job_that_goes_on_gives_up_at_its_deadline(
    settings: Settings, cluster: FakeJobs, clock: Clock
) -> None:
    service = replica(settings, cluster, clock)
    await service.poll(req())
    started = time.monotonic()
    assert not await service.wait_end(req(), 0.5)
    assert 0.5 <= time.monotonic() - started < 1.0
    cluster.finish(job_of(cluster, 1), outcome(OutcomeKind.SUCCESSFUL, clock.now))
    assert await service.wait_end(req(), 5.0)
    assert await service.wait_end(req(), 5.0)  # none in flight: at once


async def test_a_near_end_wait_reads_the_job_alone_once_a_second(
    settings: Settings, cluster: FakeJobs, clock: Clock
) -> None:
    """Issue #26/#31: the wait after in_flight found the Job running reads that Job alone (one GET each
    JOB_LOOK_SECONDS), not the record, the Job and its Pods every 0.2 s (22 calls for 2 s before)."""
    assert await replica(settings, cluster, clock).poll(req()) == STARTING  # the Job launched
    backend = machine_backend(cluster, clock)
    assert await backend.reconcile(req()) is not None
    before = cluster.calls.count.copy()
    started = time.monotonic()
    assert not await backend.wait_end(req(), 2.0)
    assert 2.0 <= time.monotonic() - started < 3.5  # gives up at its deadline (slack: a loaded CI machine)
    assert cluster.calls.count - before == Counter({"job_finished": 2})  # at t=1 s and t=2 s

    cluster.calls.failing.add("job_finished")  # the API server away: still in flight, no error
    assert await backend.reconcile(req()) is not None
    assert not await backend.wait_end(req(), 1.0)
    cluster.calls.failing.clear()

    # the Job finishes during the wait: one more read of the Job, then one full look copies its outcome
    assert await backend.reconcile(req()) is not None
    before = cluster.calls.count.copy()
    threading.Timer(0.3, cluster.finish, (job_of(cluster, 1), outcome(OutcomeKind.SUCCESSFUL, 1.0))).start()
    started = time.monotonic()
    assert await backend.wait_end(req(), 2.0)
    assert 0.9 <= time.monotonic() - started < 2.5  # seen at the look after it finished
    made = cluster.calls.count - before
    assert (made["job_finished"], made["job_state"], made["write"]) == (1, 1, 1)
    assert record(cluster).attempts[0].outcome is not None
    reads = cluster.calls.count["read"]
    assert [a.number for a in await backend.attempts(req())] == [1]
    assert cluster.calls.count["read"] == reads, "load answers from the wait's look"


async def test_a_whole_poll_in_the_end_window_makes_few_calls(
    settings: Settings, cluster: FakeJobs, clock: Clock
) -> None:
    """The UpdateMachine call near the play's expected end while the Job goes on: the look before the wait,
    three reads of the Job in the 3 s wait, the look after it (the fake's job_state is the adapter's GET of
    the Job and LIST of its Pods: 9 API requests in all; 24 before the looks were the Job's alone, with
    the 2 s wait)."""
    service = replica(settings, cluster, clock)
    assert await service.poll(req()) == STARTING
    clock.now += known_cost(req().capabilities) - 1.0
    before = cluster.calls.count.copy()
    answer = await service.poll(req())
    assert answer.state is ProgressState.IN_PROGRESS
    assert cluster.calls.count - before == Counter({"read": 2, "job_state": 2, "job_finished": 3})


class Posted(NoClusterSide):
    """A cluster side that keeps the Events it is asked to post (the real one names each after its
    object, occurrence and message, so one posted twice is one Event: here every call counts)."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []

    def state(self, request: RunRequest, reason: str, message: str, warning: bool = False) -> None:
        self.events.append((reason, message))


def posting_replica(settings: Settings, cluster: FakeJobs, clock: Clock, posted: Posted) -> RunService:
    backend = job_backend(cluster, cluster, machine_of, clock, cluster=posted)
    return run_service(settings, clock=clock, cluster=posted, backend=backend)


async def test_a_replica_killed_between_the_secret_and_the_job_is_recovered_by_the_next_poll(
    settings: Settings, cluster: FakeJobs, clock: Clock
) -> None:
    """Never a Job without its Secret (its Pod would wait in ContainerCreating until the deadline), and
    an attempt left with its Secret alone gets its Job on the next poll, not an hour later."""
    cluster.killed_after_secret = True
    with pytest.raises(ReplicaKilled):
        await replica(settings, cluster, clock).poll(req())
    name = job_of(cluster, 1)
    assert cluster.jobs == {} and list(cluster.secrets) == [(CONFIG.namespace, name)]
    clock.now += 1
    assert await replica(settings, cluster, clock).poll(req()) == STARTING
    job = cluster.only_job()
    assert job.manifest["metadata"]["name"] == name
    owners = cluster.secrets[(CONFIG.namespace, name)]["metadata"]["ownerReferences"]
    assert [owner["uid"] for owner in owners] == [job.uid], "the Secret goes with its Job"
    (attempt,) = record(cluster).attempts
    assert attempt.outcome is None and spec_of(cluster, 1).lock_token == attempt.lock_token
    cluster.finish(name, outcome(OutcomeKind.SUCCESSFUL, clock.now))
    assert (await replica(settings, cluster, clock).poll(req())).state is ProgressState.DONE


UNSCHEDULABLE = (
    "0/3 nodes are available: 1 node(s) didn't match pod anti-affinity rules, 2 node(s) were unschedulable."
)
PULL = 'failed to pull and unpack image "registry.invalid/inplace-extension:0": not found'


def pending_pod(reason: str | None, message: str) -> dict[str, Any]:
    if reason is None:
        condition = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}
        return {"phase": "Pending", "conditions": [condition]}
    waiting = {"reason": reason, "message": message}
    return {"phase": "Pending", "containerStatuses": [{"name": "attempt", "state": {"waiting": waiting}}]}


@pytest.mark.parametrize(
    ("status", "named"),
    [
        (pending_pod(None, UNSCHEDULABLE), f"Pod cannot be scheduled: {UNSCHEDULABLE}"),
        (pending_pod("ErrImagePull", PULL), f"Pod cannot start: ErrImagePull: {PULL}"),
        (
            pending_pod("ImagePullBackOff", "Back-off pulling image"),
            "Pod cannot start: ImagePullBackOff: Back-off pulling image",
        ),
        (
            pending_pod("CreateContainerConfigError", 'secret "inplace-extension-ssh" not found'),
            'Pod cannot start: CreateContainerConfigError: secret "inplace-extension-ssh" not found',
        ),
    ],
)
async def test_a_pod_that_cannot_start_is_named_at_once_and_given_up_after_the_start_timeout(
    settings: Settings, cluster: FakeJobs, clock: Clock, status: dict[str, Any], named: str
) -> None:
    posted = Posted()
    a, b = (
        posting_replica(settings, cluster, clock, posted),
        posting_replica(settings, cluster, clock, posted),
    )
    assert await a.poll(req()) == STARTING
    job = cluster.only_job()
    name = job.manifest["metadata"]["name"]
    job.pod_status = status
    clock.now += 20  # well within a minute
    for service in (a, b):
        answer = await service.poll(req())
        assert (answer.state, answer.message) == (ProgressState.IN_PROGRESS, f"Job {name}: {named}")
        assert progress.pattern(("ntp",), cluster_steps=True).fullmatch(answer.message)
    assert record(cluster).attempts[0].outcome is None and cluster.deleted == []
    assert [reason for reason, _ in posted.events] == ["Queued"]

    clock.now += START_SECONDS  # --job-start-timeout-seconds after the attempt began
    retrying = await b.poll(req())
    assert retrying.retrying and retrying.message == "run interrupted, retrying (attempt 2)"
    assert await a.poll(req()) == retrying
    assert cluster.deleted == [name] and cluster.jobs == {} and cluster.secrets == {}
    (attempt,) = record(cluster).attempts
    given_up = f"Job {name} did not start within {START_SECONDS:.0f}s: {named}"
    assert attempt.outcome is not None and attempt.outcome.kind is OutcomeKind.INTERRUPTED
    assert attempt.outcome.detail == given_up
    assert posted.events[1:] == [("JobNotStarted", given_up)], "one Event, by the replica that recorded it"

    budget = settings.model_copy(update={"max_failed_attempts": 1})
    blocked = Progress(ProgressState.FAILED, "blocked after 1 failed attempts: run interrupted", blocked=True)
    assert await replica(budget, cluster, clock).poll(req()) == blocked, "charged once to the retry budget"


def busy(status: int) -> Unreachable:
    return Unreachable(f"patch Machine default/m1: the API server answered {status}", status)


OUTAGES = {
    "429": busy(429),
    "500": busy(500),
    "503": busy(503),
    "timeout": Unreachable("the API server is unreachable (ReadTimeout)"),
    "refused": Unreachable("the API server is unreachable (ConnectError)"),
}


@pytest.mark.parametrize("outage", sorted(OUTAGES))
@pytest.mark.parametrize(
    "call",
    [
        "read",
        "write",
        "create_job",
        "create_secret",
        "create_job_object",
        "job_state",
        "outcome",
        "delete_job",
    ],
)
async def test_the_api_server_busy_or_away_is_in_progress_charging_and_posting_nothing(
    settings: Settings, cluster: FakeJobs, clock: Clock, outage: str, call: str
) -> None:
    """At each read and write of a poll: the record, the Secret and the Job, the Job's state, the
    outcome's write, the deletion of a Job that did not start."""
    posted = Posted()
    service = posting_replica(settings, cluster, clock, posted)
    if call in ("job_state", "outcome", "delete_job"):
        assert await service.poll(req()) == STARTING
        posted.events.clear()
        if call == "outcome":
            # ended without an outcome: an interrupted attempt to record
            cluster.finish(job_of(cluster, 1), None)
        if call == "delete_job":
            cluster.only_job().pod_status = pending_pod(None, UNSCHEDULABLE)
            clock.now += START_SECONDS
    error = OUTAGES[outage]
    cluster.calls.errors["write" if call == "outcome" else call] = error
    before = cluster.annotation(MACHINE, RECORD_ANNOTATION)
    answer = await service.poll(req())
    assert answer == Progress(
        ProgressState.IN_PROGRESS, f"cluster API unavailable: {error.message}", 1, unavailable=True
    )
    assert progress.pattern(("ntp",), cluster_steps=True).fullmatch(answer.message)
    assert posted.events == []
    assert all(a.outcome is None for a in record(cluster).attempts), "nothing charged"
    if call not in ("job_state", "outcome", "delete_job"):
        assert cluster.jobs == {} and cluster.secrets == {} and record(cluster).attempts == ()
    else:
        assert cluster.annotation(MACHINE, RECORD_ANNOTATION) == before
    cluster.calls.errors.clear()
    after = await service.poll(req())
    assert after.state is ProgressState.IN_PROGRESS and not after.unavailable
    assert [a.number for a in record(cluster).attempts] == [1]


PAUSED = Hold("paused by MachineDeployment default/md-0 (annotation inplace-extension.io/pause)")
CANCELLED = Hold(
    "cancelled by MachineDeployment default/md-0 (annotation inplace-extension.io/pause=cancel)", cancel=True
)


async def test_a_hold_takes_back_an_attempt_whose_pod_has_not_started(
    settings: Settings, cluster: FakeJobs, clock: Clock
) -> None:
    """A pause, then a cancel, come while the attempt's Pod waits to start (scheduling, pulling its
    image): each deletes the Job before it plays, answers the hold's message and charges nothing; once
    the hold is gone the next attempt starts at once."""
    svc = replica(settings.model_copy(update={"max_failed_attempts": 1}), cluster, clock)
    for attempt, hold in ((1, PAUSED), (2, CANCELLED)):
        assert await svc.poll(req()) == STARTING
        cluster.only_job().pending = True
        assert cluster.only_job().manifest["metadata"]["name"] == job_of(cluster, attempt)
        answer = await svc.poll(replace(req(), hold=hold))
        if hold.cancel:
            assert answer == Progress(ProgressState.FAILED, CANCELLED.message, cancelled=True)
        else:
            assert (answer.message, answer.waiting, answer.in_flight) == (PAUSED.message, "pause", False)
        assert not cluster.jobs, "the Job was deleted before its Pod started"
        taken_back = record(cluster).attempts[-1].outcome
        assert taken_back is not None and taken_back.kind is OutcomeKind.WITHDRAWN
        assert (await svc.poll(replace(req(), hold=hold))).message == hold.message
    # neither counts against the budget (1) nor waits out a backoff: the third starts at once
    assert await svc.poll(req()) == STARTING
    assert [a.number for a in record(cluster).attempts] == [1, 2, 3]


async def test_a_hold_lets_an_attempt_whose_pod_started_play_on(
    settings: Settings, cluster: FakeJobs, clock: Clock
) -> None:
    svc = replica(settings, cluster, clock)
    assert await svc.poll(req()) == STARTING
    assert await svc.poll(replace(req(), hold=CANCELLED)) == STARTING  # its Pod runs: it finishes
    assert len(cluster.jobs) == 1 and cluster.calls.count["delete_job"] == 0
    cluster.finish(job_of(cluster, 1), outcome(OutcomeKind.SUCCESSFUL, clock.now))
    assert await svc.poll(replace(req(), hold=CANCELLED)) == Progress(ProgressState.DONE, "update applied")
