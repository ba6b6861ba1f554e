"""UpdateMachine's wait for the provider's last-applied tags (kubeaware/infra_tags.py), over the
in-memory management cluster: done once the annotation holds every desired tag, in progress until then
(also while the cluster cannot be read), past the timeout one stable Failure naming provider and tags."""

from __future__ import annotations

import json

import pytest
from kubefake import FakeManagement

from inplace_extension.inplace.infra_tags import PROVIDER_TAGS, DesiredTags
from inplace_extension.inplace.plan import plan_update
from inplace_extension.kube.errors import Unreachable
from inplace_extension.kubeaware.infra_tags import InfraTagsWait
from inplace_extension.runs.model import ProgressState, RunRequest, run_request

pytestmark = pytest.mark.anyio

CAPA = PROVIDER_TAGS[0]
WANTED = DesiredTags(
    CAPA, "infrastructure.cluster.x-k8s.io/v1beta2", "ns", "m-1", {"team": "blue", "env": "prod"}
)


def no_node(run: RunRequest) -> str | None:
    return None


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def live(management: FakeManagement, applied: dict[str, str] | None) -> None:
    """The live AWSMachine, with CAPA's annotation holding ``applied`` (None: no annotation yet)."""
    annotations = {} if applied is None else {CAPA.annotation: json.dumps(applied)}
    management.objects_by_name[("AWSMachine", "ns", "m-1")] = {
        "metadata": {"namespace": "ns", "name": "m-1", "annotations": annotations},
        "spec": {"additionalTags": dict(WANTED.tags)},
    }


async def test_done_once_the_annotation_holds_every_desired_tag() -> None:
    management, clock = FakeManagement(), Clock()
    wait = InfraTagsWait(management, no_node, timeout_seconds=60, clock=clock)
    live(management, None)
    progress = await wait.poll(WANTED)
    assert progress.state is ProgressState.IN_PROGRESS and progress.retry_after_seconds > 0
    assert progress.message == "infrastructure: waiting for CAPA to apply tags env, team to AWSMachine ns/m-1"
    live(management, {"team": "blue", "env": "dev"})
    progress = await wait.poll(WANTED)
    assert progress.message.endswith("apply tags env to AWSMachine ns/m-1")
    live(management, {"team": "blue", "env": "prod", "from-the-cluster": "x"})
    progress = await wait.poll(WANTED)
    assert (progress.state, progress.message) == (ProgressState.DONE, "infrastructure: CAPA applied the tags")


async def test_past_the_timeout_one_stable_failure_names_the_provider_and_the_missing_tags() -> None:
    management, clock = FakeManagement(), Clock()
    wait = InfraTagsWait(management, no_node, timeout_seconds=60, clock=clock)
    live(management, {"team": "blue"})
    assert (await wait.poll(WANTED)).state is ProgressState.IN_PROGRESS
    clock.now += 59
    assert (await wait.poll(WANTED)).state is ProgressState.IN_PROGRESS
    clock.now += 2
    failed = await wait.poll(WANTED)
    assert failed.state is ProgressState.FAILED
    assert failed.message == (
        "InfrastructureTagsNotApplied: CAPA did not apply tags env to AWSMachine ns/m-1 within 60s "
        "(its annotation sigs.k8s.io/cluster-api-provider-aws-last-applied-tags lacks them)"
    )
    live(management, {"team": "blue", "env": "prod"})  # too late: the answer stays the same
    assert await wait.poll(WANTED) == failed


async def test_an_unreadable_cluster_is_waited_out() -> None:
    management, clock = FakeManagement(), Clock()
    wait = InfraTagsWait(management, no_node, timeout_seconds=60, clock=clock)
    management.objects_error = Unreachable("connection refused")
    progress = await wait.poll(WANTED)
    assert progress.state is ProgressState.IN_PROGRESS
    assert progress.message.endswith("(cannot read it: KubeError: connection refused)")
    management.objects_error = None
    live(management, dict(WANTED.tags))
    assert (await wait.poll(WANTED)).state is ProgressState.DONE


async def test_a_missing_infrastructure_machine_is_waited_for() -> None:
    management, clock = FakeManagement(), Clock()
    wait = InfraTagsWait(management, no_node, timeout_seconds=60, clock=clock)
    assert (await wait.poll(WANTED)).state is ProgressState.IN_PROGRESS
    clock.now += 61
    assert (await wait.poll(WANTED)).state is ProgressState.FAILED


def run_of(bootstrap: bool) -> RunRequest:
    """The run of an UpdateMachine request whose Machine carries v1.31.0 (``bootstrap``: and NTP servers
    in its KubeadmConfig, a second host step)."""
    desired: dict[str, object] = {
        "machine": {
            "apiVersion": "cluster.x-k8s.io/v1beta2",
            "kind": "Machine",
            "metadata": {"name": "m-1", "namespace": "ns"},
            "spec": {"version": "v1.31.0"},
        }
    }
    if bootstrap:
        desired["bootstrapConfig"] = {
            "apiVersion": "bootstrap.cluster.x-k8s.io/v1beta2",
            "kind": "KubeadmConfig",
            "metadata": {"name": "m-1", "namespace": "ns"},
            "spec": {"ntp": {"enabled": True, "servers": ["time.example.com"]}},
        }
    return run_request(plan_update(desired), {}, {})


async def test_the_host_is_idle_when_its_only_step_is_the_version_the_node_reports() -> None:
    """Issue 39: a tags-only change under CAPI plans ``kubernetes_version`` (the Machine carries its
    version); when the Node reports it already, nothing runs on the host."""
    reported: dict[str, str | None] = {"m-1": "v1.31.0"}
    asked: list[str] = []

    def version(run: RunRequest) -> str | None:
        asked.append(run.name)
        return reported[run.name]

    wait = InfraTagsWait(FakeManagement(), version)
    assert run_of(False).capabilities == ("kubernetes_version",)
    assert await wait.host_idle(run_of(False))
    reported["m-1"] = "v1.30.9"  # not yet at the version: the play upgrades it
    assert not await wait.host_idle(run_of(False))
    reported["m-1"] = None  # no Node (yet): not known, the play runs
    assert not await wait.host_idle(run_of(False))
    reported["m-1"] = "v1.31.0"
    asked.clear()
    assert not await wait.host_idle(run_of(True))  # another host step: the play runs
    assert asked == []

    def unreadable(run: RunRequest) -> str | None:
        raise Unreachable("connection refused")

    assert not await InfraTagsWait(FakeManagement(), unreadable).host_idle(run_of(False))
