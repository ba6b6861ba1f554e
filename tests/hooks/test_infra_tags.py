"""Provider-applied infrastructure tags (CAPA, CAPZ) through the real app: CanUpdateMachine/MachineSet
claim them only in the Kubernetes-aware mode, with no disruption; UpdateMachine waits for the
provider's record beside the host steps, and with no host step runs no play."""

from __future__ import annotations

import base64
import copy
import json
from typing import Any

import pytest

from inplace_extension.app import create_app
from inplace_extension.inplace.infra_tags import DesiredTags
from inplace_extension.runs.model import Progress, ProgressState, RunRequest, Runs
from inplace_extension.settings import Settings

from .conftest import CAN_UPDATE_MACHINE, CAN_UPDATE_MACHINE_SET, UPDATE_MACHINE, FakeRuns, load, post_to

pytestmark = pytest.mark.anyio

AWS = "infrastructure.cluster.x-k8s.io/v1beta2"


class FakeTagsWait:
    """Answers a fixed Progress and records what it was asked to wait for."""

    def __init__(self, progress: Progress, idle: bool = False) -> None:
        self.progress = progress
        self.idle = idle  # what host_idle answers (the Node reports the version already)
        self.asked: list[DesiredTags] = []
        self.idle_asked: list[RunRequest] = []

    async def poll(self, desired: DesiredTags, machine: str) -> Progress:
        self.asked.append(desired)
        return self.progress

    async def host_idle(self, run: RunRequest) -> bool:
        self.idle_asked.append(run)
        return self.idle


async def post(
    path: str,
    body: Any,
    kube: bool,
    runs: Runs | None = None,
    infra_tags: FakeTagsWait | None = None,
) -> dict[str, Any]:
    app = create_app(Settings(plain_http=True, kube=kube), runs, infra_tags=infra_tags)
    return await post_to(app, path, body)


def as_aws(
    obj: dict[str, Any], tags: dict[str, str] | None, template: bool, kind: str = "AWSMachine"
) -> None:
    """Make a request's DockerMachine(Template) an AWSMachine(Template) (or ``kind``) holding ``tags``."""
    obj["apiVersion"], obj["kind"] = AWS, kind + ("Template" if template else "")
    spec = {"instanceType": "m5.large", "ami": {"id": "ami-123"}}
    if tags is not None:
        spec["additionalTags"] = tags
    obj["spec"] = {"template": {"spec": spec}} if template else spec


def machine_request(
    old: dict[str, str] | None, new: dict[str, str] | None, kind: str = "AWSMachine"
) -> dict[str, Any]:
    """CanUpdateMachine where only the infrastructure machine's tags differ (``4A``'s desired both sides)."""
    request = load("can_update_machine/4A.request.json")
    request["current"] = copy.deepcopy(request["desired"])
    as_aws(request["current"]["infrastructureMachine"], old, False, kind)
    as_aws(request["desired"]["infrastructureMachine"], new, False, kind)
    return request


def machine_set_request(old: dict[str, str], new: dict[str, str]) -> dict[str, Any]:
    request = load("can_update_machine_set/5A.request.json")
    request["current"] = copy.deepcopy(request["desired"])
    as_aws(request["current"]["infrastructureMachineTemplate"], old, True)
    as_aws(request["desired"]["infrastructureMachineTemplate"], new, True)
    return request


async def test_a_tags_only_change_is_claimed_in_the_kube_aware_mode_without_disruption() -> None:
    answer = await post(CAN_UPDATE_MACHINE, machine_request({"a": "1"}, {"a": "2", "b": "3"}), kube=True)
    assert answer["status"] == "Success"
    assert answer["message"] == "in place: infrastructure_tags"
    assert answer["affectsAvailability"] is False
    ops = json.loads(base64.b64decode(answer["infrastructureMachinePatch"]["patch"]))
    assert ops == [{"op": "replace", "path": "/spec/additionalTags", "value": {"a": "2", "b": "3"}}]
    assert "machinePatch" not in answer and "bootstrapConfigPatch" not in answer


async def test_the_machine_set_template_shape_is_claimed_too() -> None:
    answer = await post(CAN_UPDATE_MACHINE_SET, machine_set_request({}, {"team": "blue"}), kube=True)
    assert answer["message"] == "in place: infrastructure_tags"
    assert answer["affectsAvailability"] is False
    ops = json.loads(base64.b64decode(answer["infrastructureMachineTemplatePatch"]["patch"]))
    assert ops == [{"op": "replace", "path": "/spec/template/spec/additionalTags", "value": {"team": "blue"}}]


async def test_without_cluster_access_the_change_rolls_out_and_the_message_says_why() -> None:
    answer = await post(CAN_UPDATE_MACHINE, machine_request({"a": "1"}, {"a": "2"}), kube=False)
    assert answer["status"] == "Success"
    assert "infrastructureMachinePatch" not in answer
    assert answer["message"] == (
        "rollout needed: AWSMachine /additionalTags: infrastructure_tags does not change it in place: the "
        "provider applies it in place, but only the Kubernetes-aware mode (--kube) can see when it has"
    )


async def test_a_removed_tag_rolls_out() -> None:
    answer = await post(CAN_UPDATE_MACHINE, machine_request({"a": "1", "b": "2"}, {"a": "1"}), kube=True)
    assert "infrastructureMachinePatch" not in answer
    assert "removes tags (b)" in answer["message"]


async def test_another_infrastructure_change_beside_the_tags_rolls_out() -> None:
    request = machine_request({"a": "1"}, {"a": "2"})
    request["desired"]["infrastructureMachine"]["spec"]["instanceType"] = "m5.xlarge"
    answer = await post(CAN_UPDATE_MACHINE, request, kube=True)
    assert answer["message"] == (
        "rollout needed: AWSMachine /instanceType: no capability changes it in place; "
        "in place alone: infrastructure_tags"
    )


async def test_with_a_host_change_both_are_claimed_and_the_host_step_sets_affects_availability() -> None:
    request = machine_request({"a": "1"}, {"a": "2"})
    request["desired"]["bootstrapConfig"]["spec"]["ntp"] = {"enabled": True, "servers": ["time.example"]}
    answer = await post(CAN_UPDATE_MACHINE, request, kube=True)
    assert answer["message"] == "in place: infrastructure_tags, ntp"
    assert answer["affectsAvailability"] is False  # ntp is of class none too
    request["desired"]["machine"]["spec"]["version"] = "v1.36.4"
    request["current"]["machine"]["spec"]["version"] = "v1.36.3"
    answer = await post(CAN_UPDATE_MACHINE, request, kube=True)
    assert answer["message"] == "in place: infrastructure_tags, ntp, kubernetes_version"
    assert answer["affectsAvailability"] is True


async def test_capg_labels_are_declined_with_the_reason() -> None:
    request = machine_request(None, None, kind="GCPMachine")
    request["current"]["infrastructureMachine"]["spec"]["additionalLabels"] = {"a": "1"}
    request["desired"]["infrastructureMachine"]["spec"]["additionalLabels"] = {"a": "2"}
    answer = await post(CAN_UPDATE_MACHINE, request, kube=True)
    assert "infrastructureMachinePatch" not in answer
    assert "GCPMachine /additionalLabels" in answer["message"]
    assert "never to a running one" in answer["message"]


def update_request(tags: dict[str, str], with_bootstrap: bool = True) -> dict[str, Any]:
    request = load("update_machine/6B.request.json")
    as_aws(request["desired"]["infrastructureMachine"], tags, False)
    if not with_bootstrap:
        del request["desired"]["bootstrapConfig"]
        request["desired"]["machine"]["spec"].pop("version", None)
    return request


async def test_update_machine_waits_for_the_tags_beside_the_host_steps() -> None:
    runs = FakeRuns(Progress(ProgressState.DONE, "update applied"))
    waiting = FakeTagsWait(Progress(ProgressState.IN_PROGRESS, "infrastructure: waiting for CAPA", 5))
    answer = await post(UPDATE_MACHINE, update_request({"team": "blue"}), True, runs, waiting)
    assert answer == {
        "apiVersion": answer["apiVersion"],
        "kind": "UpdateMachineResponse",
        "status": "Success",
        "message": "infrastructure: waiting for CAPA",
        "retryAfterSeconds": 5,
    }
    [asked] = waiting.asked
    assert (asked.provider.provider, asked.name, dict(asked.tags)) == ("CAPA", asked.name, {"team": "blue"})
    assert len(runs.requests) == 1  # the host steps run as for every update

    waiting.progress = Progress(ProgressState.DONE, "infrastructure: CAPA applied the tags")
    answer = await post(UPDATE_MACHINE, update_request({"team": "blue"}), True, runs, waiting)
    assert (answer["status"], answer["retryAfterSeconds"]) == ("Success", 0)
    assert answer["message"] == "update applied; infrastructure: CAPA applied the tags"

    waiting.progress = Progress(
        ProgressState.FAILED, "InfrastructureTagsNotApplied: CAPA did not apply tags team"
    )
    answer = await post(UPDATE_MACHINE, update_request({"team": "blue"}), True, runs, waiting)
    assert (answer["status"], answer["message"]) == (
        "Failure",
        "InfrastructureTagsNotApplied: CAPA did not apply tags team",
    )


async def test_a_host_failure_wins_over_waiting_tags() -> None:
    runs = FakeRuns(Progress(ProgressState.FAILED, "PlaybookFailed: role ntp"))
    waiting = FakeTagsWait(Progress(ProgressState.IN_PROGRESS, "infrastructure: waiting for CAPA", 5))
    answer = await post(UPDATE_MACHINE, update_request({"team": "blue"}), True, runs, waiting)
    assert (answer["status"], answer["message"]) == ("Failure", "PlaybookFailed: role ntp")


async def test_with_no_host_step_no_play_runs() -> None:
    runs = FakeRuns(Progress(ProgressState.DONE, "update applied"))
    waiting = FakeTagsWait(Progress(ProgressState.DONE, "infrastructure: CAPA applied the tags"))
    answer = await post(UPDATE_MACHINE, update_request({"team": "blue"}, False), True, runs, waiting)
    assert answer["message"] == "infrastructure: CAPA applied the tags"
    assert runs.requests == []  # no SSH, no play


async def test_without_cluster_access_update_machine_does_not_wait_for_tags() -> None:
    runs = FakeRuns(Progress(ProgressState.DONE, "update applied"))
    answer = await post(UPDATE_MACHINE, update_request({"team": "blue"}), False, runs)
    assert answer["message"] == "update applied"


def version_only_request(tags: dict[str, str]) -> dict[str, Any]:
    """UpdateMachine for a tags-only change under CAPI: the Machine carries its version (unchanged), the
    KubeadmConfig nothing the host converges."""
    request = update_request(tags)
    del request["desired"]["bootstrapConfig"]
    request["desired"]["machine"]["spec"]["version"] = "v1.31.0"
    return request


async def test_a_tags_only_change_runs_nothing_on_the_host_when_the_node_has_the_version() -> None:
    """Issue 39: the plan's only host step is the Kubernetes version the Machine carries; the Node
    reports it already (host_idle): no play, no SSH, no inventory entry needed."""
    runs = FakeRuns(Progress(ProgressState.DONE, "update applied"))
    waiting = FakeTagsWait(Progress(ProgressState.DONE, "infrastructure: CAPA applied the tags"), idle=True)
    answer = await post(UPDATE_MACHINE, version_only_request({"team": "blue"}), True, runs, waiting)
    assert (answer["status"], answer["retryAfterSeconds"]) == ("Success", 0)
    assert answer["message"] == "infrastructure: CAPA applied the tags"
    assert runs.requests == []  # no play
    [run] = waiting.idle_asked
    assert run.capabilities == ("kubernetes_version",)
    # the Node does not report the version (yet): the play converges it, as for every update
    waiting.idle = False
    answer = await post(UPDATE_MACHINE, version_only_request({"team": "blue"}), True, runs, waiting)
    assert answer["message"] == "update applied; infrastructure: CAPA applied the tags"
    assert len(runs.requests) == 1
