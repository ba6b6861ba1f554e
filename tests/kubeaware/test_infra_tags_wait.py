"""UpdateMachine's wait for the provider's last-applied tags (kubeaware/infra_tags.py), over the
in-memory management cluster: done once the annotation holds every desired tag, in progress until then
(also while the cluster cannot be read), past the timeout one stable Failure naming provider and tags."""

from __future__ import annotations

import json

import pytest
from kubefake import FakeManagement

from inplace_extension.inplace.infra_tags import PROVIDER_TAGS, DesiredTags
from inplace_extension.kube.errors import Unreachable
from inplace_extension.kubeaware.infra_tags import InfraTagsWait
from inplace_extension.runs.model import ProgressState, RunRequest

pytestmark = pytest.mark.anyio

CAPA = PROVIDER_TAGS[0]
WANTED = DesiredTags(
    CAPA, "infrastructure.cluster.x-k8s.io/v1beta2", "ns", "m-1", {"team": "blue", "env": "prod"}
)


def no_node(run: RunRequest) -> str | None:
    return None


MACHINE = "m-1"  # the Machine whose infrastructure machine is m-1 (it keeps the wait's clock)


def management_cluster() -> FakeManagement:
    management = FakeManagement()
    management.add_machine("ns", MACHINE, "node-1")
    return management


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def live(management: FakeManagement, applied: dict[str, str] | None, generation: int = 2) -> None:
    """The live AWSMachine, with CAPA's annotation holding ``applied`` (None: no annotation yet), at
    ``generation`` (CAPI's apply of the desired tags onto it made a new one)."""
    annotations = {} if applied is None else {CAPA.annotation: json.dumps(applied)}
    management.objects_by_name[("AWSMachine", "ns", "m-1")] = {
        "metadata": {"namespace": "ns", "name": "m-1", "annotations": annotations, "generation": generation},
        "spec": {"additionalTags": dict(WANTED.tags)},
    }


async def test_done_once_the_annotation_holds_every_desired_tag() -> None:
    management, clock = management_cluster(), Clock()
    wait = InfraTagsWait(management, no_node, timeout_seconds=60, clock=clock)
    live(management, None)
    progress = await wait.poll(WANTED, MACHINE)
    assert progress.state is ProgressState.IN_PROGRESS and progress.retry_after_seconds > 0
    assert progress.message == "infrastructure: waiting for CAPA to apply tags env, team to AWSMachine ns/m-1"
    live(management, {"team": "blue", "env": "dev"})
    progress = await wait.poll(WANTED, MACHINE)
    assert progress.message.endswith("apply tags env to AWSMachine ns/m-1")
    live(management, {"team": "blue", "env": "prod", "from-the-cluster": "x"})
    progress = await wait.poll(WANTED, MACHINE)
    assert (progress.state, progress.message) == (ProgressState.DONE, "infrastructure: CAPA applied the tags")


async def test_past_the_timeout_one_stable_failure_names_the_provider_and_the_missing_tags() -> None:
    management, clock = management_cluster(), Clock()
    wait = InfraTagsWait(management, no_node, timeout_seconds=60, clock=clock)
    live(management, {"team": "blue"})
    assert (await wait.poll(WANTED, MACHINE)).state is ProgressState.IN_PROGRESS
    clock.now += 59
    assert (await wait.poll(WANTED, MACHINE)).state is ProgressState.IN_PROGRESS
    clock.now += 2
    failed = await wait.poll(WANTED, MACHINE)
    assert failed.state is ProgressState.FAILED
    assert failed.message == (
        "InfrastructureTagsNotApplied: CAPA did not apply tags env to AWSMachine ns/m-1 within 60s "
        "(its annotation sigs.k8s.io/cluster-api-provider-aws-last-applied-tags lacks them)"
    )
    live(management, {"team": "blue", "env": "prod"})  # too late: the answer stays the same
    assert await wait.poll(WANTED, MACHINE) == failed


async def test_an_unreadable_cluster_is_waited_out() -> None:
    management, clock = management_cluster(), Clock()
    wait = InfraTagsWait(management, no_node, timeout_seconds=60, clock=clock)
    management.objects_error = Unreachable("connection refused")
    progress = await wait.poll(WANTED, MACHINE)
    assert progress.state is ProgressState.IN_PROGRESS
    assert progress.message.endswith("(cannot read it: KubeError: connection refused)")
    management.objects_error = None
    live(management, dict(WANTED.tags))
    assert (await wait.poll(WANTED, MACHINE)).state is ProgressState.DONE


async def test_a_missing_infrastructure_machine_is_waited_for() -> None:
    management, clock = management_cluster(), Clock()
    wait = InfraTagsWait(management, no_node, timeout_seconds=60, clock=clock)
    assert (await wait.poll(WANTED, MACHINE)).state is ProgressState.IN_PROGRESS
    clock.now += 61
    assert (await wait.poll(WANTED, MACHINE)).state is ProgressState.FAILED


async def test_the_clock_is_the_machines_so_a_fresh_replica_answers_alike() -> None:
    """Two replicas, and a third started late: the wait began when the first replica first waited
    (recorded on the Machine), so each answers the same in-progress message and, past the timeout, the
    same Failure; a later desired state of the tags (a new generation of the infrastructure machine,
    also the same tags again after a revert) waits afresh."""
    management, clock = management_cluster(), Clock()
    a, b = (InfraTagsWait(management, no_node, timeout_seconds=60, clock=clock) for _ in range(2))
    live(management, {"team": "blue"})
    waiting = await a.poll(WANTED, MACHINE)
    assert waiting.state is ProgressState.IN_PROGRESS
    clock.now += 30
    assert await b.poll(WANTED, MACHINE) == waiting
    clock.now += 31
    failed = await InfraTagsWait(management, no_node, timeout_seconds=60, clock=clock).poll(WANTED, MACHINE)
    assert failed.state is ProgressState.FAILED, "60 s after the first replica began, not the fresh one"
    assert await a.poll(WANTED, MACHINE) == failed
    live(management, dict(WANTED.tags))  # applied too late: every replica keeps the answer
    assert (
        await InfraTagsWait(management, no_node, timeout_seconds=60, clock=clock).poll(WANTED, MACHINE)
        == failed
    )
    live(management, {"team": "blue"}, generation=4)  # the tags changed and came back: a new wait
    assert (await b.poll(WANTED, MACHINE)).state is ProgressState.IN_PROGRESS
    clock.now += 59
    assert (await a.poll(WANTED, MACHINE)).state is ProgressState.IN_PROGRESS
    live(management, dict(WANTED.tags), generation=4)
    done = await InfraTagsWait(management, no_node, timeout_seconds=60, clock=clock).poll(WANTED, MACHINE)
    assert done.state is ProgressState.DONE
    assert management.machines[("ns", MACHINE)].annotations == {}, "nothing of the wait is left on it"
