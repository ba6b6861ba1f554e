"""Strict input types: a body for another hook, a JSON type CAPI's Go types would not produce, a bad owner.

Each is ``Failure`` ``InvalidRequest: <field path>: <problem>`` (never the value), not a decision; a bad
file owner fails UpdateMachine before the executor (and so any host) is reached.
"""

from __future__ import annotations

import base64
import copy
import json
from typing import Any

import pytest

from .conftest import (
    CAN_UPDATE_MACHINE,
    CAN_UPDATE_MACHINE_SET,
    UPDATE_MACHINE,
    FakeRuns,
    load,
    post,
)

pytestmark = pytest.mark.anyio

FIXTURES = {
    CAN_UPDATE_MACHINE: "can_update_machine/4A.request.json",
    CAN_UPDATE_MACHINE_SET: "can_update_machine_set/5A.request.json",
    UPDATE_MACHINE: "update_machine/6B.request.json",
}


def _set(obj: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, last = dotted.split(".")
    for part in parents:
        obj = obj[int(part)] if isinstance(obj, list) else obj[part]
    if isinstance(obj, list):
        obj[int(last)] = value
    else:
        obj[last] = value


@pytest.mark.parametrize("path", list(FIXTURES))
@pytest.mark.parametrize(
    ("field", "value", "problem"),
    [
        ("kind", "DiscoveryRequest", "kind: must be"),
        ("apiVersion", "hooks.runtime.cluster.x-k8s.io/v1alpha2", "apiVersion: must be"),
    ],
)
async def test_a_request_for_another_hook_or_version_is_invalid(
    path: str, field: str, value: str, problem: str
) -> None:
    request = load(FIXTURES[path])
    request[field] = value
    answer = await post(path, request, FakeRuns())
    assert answer["status"] == "Failure"
    assert answer["message"].startswith(f"InvalidRequest: {problem}")
    assert value not in answer["message"]


@pytest.mark.parametrize("path", [CAN_UPDATE_MACHINE, UPDATE_MACHINE])
async def test_another_hooks_kind_is_refused_even_with_a_fitting_shape(path: str) -> None:
    # an UpdateMachineRequest body has the CanUpdateMachine shape minus current: kind alone tells them apart
    other = CAN_UPDATE_MACHINE if path == UPDATE_MACHINE else UPDATE_MACHINE
    request = load(FIXTURES[path])
    request["kind"] = {CAN_UPDATE_MACHINE: "CanUpdateMachineRequest", UPDATE_MACHINE: "UpdateMachineRequest"}[
        other
    ]
    answer = await post(path, request, FakeRuns())
    assert answer["status"] == "Failure"
    # the answer names the hook the body was written for and where to post it
    assert answer["message"].startswith("InvalidRequest: kind: this is a")
    assert answer["message"].endswith(other)


async def test_absent_kind_and_api_version_are_accepted() -> None:
    request = load(FIXTURES[CAN_UPDATE_MACHINE])
    del request["kind"], request["apiVersion"]
    assert (await post(CAN_UPDATE_MACHINE, request))["status"] == "Success"


@pytest.mark.parametrize(
    ("path", "field", "value", "problem"),
    [
        (CAN_UPDATE_MACHINE, "desired.machine.spec.version", 131, "must be a string"),
        (CAN_UPDATE_MACHINE, "current.machine.spec.version", True, "must be a string"),
        (CAN_UPDATE_MACHINE, "desired.machine.spec.minReadySeconds", "10", "must be a 32-bit integer"),
        (CAN_UPDATE_MACHINE, "desired.machine.spec.minReadySeconds", 2**31, "must be a 32-bit integer"),
        (CAN_UPDATE_MACHINE, "desired.machine.spec.minReadySeconds", 1.5, "must be a 32-bit integer"),
        (
            CAN_UPDATE_MACHINE,
            "desired.bootstrapConfig.spec.clusterConfiguration.etcd.local.imageTag",
            3,
            "must be a string",
        ),
        (CAN_UPDATE_MACHINE_SET, "desired.machineSet.spec.template.spec.version", 131, "must be a string"),
        (CAN_UPDATE_MACHINE_SET, "desired.machineSet.spec.replicas", "3", "must be a 32-bit integer"),
        (
            CAN_UPDATE_MACHINE_SET,
            "desired.bootstrapConfigTemplate.spec.template.spec.joinConfiguration.nodeRegistration"
            ".kubeletExtraArgs.0.value",
            110,
            "must be a string",
        ),
        (UPDATE_MACHINE, "desired.machine.spec.version", 131, "must be a string"),
        (UPDATE_MACHINE, "desired.bootstrapConfig.spec.files.0.append", "yes", "must be a boolean"),
        (UPDATE_MACHINE, "desired.bootstrapConfig.spec.files.0.content", ["a"], "must be a string"),
        (UPDATE_MACHINE, "desired.bootstrapConfig.spec.files", {"path": "/x"}, "must be a JSON array"),
    ],
)
async def test_a_value_of_another_go_type_is_invalid_naming_the_field(
    path: str, field: str, value: Any, problem: str
) -> None:
    request = load(FIXTURES[path])
    _set(request, field, value)
    executor = FakeRuns()
    answer = await post(path, request, executor)
    expected = field.replace(".0.", "[0].").replace(".0", "[0]") if ".0" in field else field
    assert answer == {**answer, "status": "Failure"}
    assert answer["message"].startswith(f"InvalidRequest: {expected}: {problem}")
    assert executor.requests == []


async def test_null_is_accepted_where_go_accepts_it_and_provider_objects_are_free_form() -> None:
    request = load(FIXTURES[CAN_UPDATE_MACHINE])
    request["desired"]["machine"]["spec"]["failureDomain"] = None
    request["desired"]["infrastructureMachine"]["spec"]["anything"] = {"version": 131, "files": "x"}
    answer = await post(CAN_UPDATE_MACHINE, request)
    assert answer["status"] == "Success"


async def test_feature_gates_are_a_map_of_booleans() -> None:
    request = load(FIXTURES[CAN_UPDATE_MACHINE])
    cluster = request["desired"]["bootstrapConfig"]["spec"].setdefault("clusterConfiguration", {})
    cluster["featureGates"] = {"SomeGate": "true"}
    answer = await post(CAN_UPDATE_MACHINE, request)
    expected = "InvalidRequest: desired.bootstrapConfig.spec.clusterConfiguration.featureGates.SomeGate"
    assert answer["message"].startswith(f"{expected}: must be a boolean")


@pytest.mark.parametrize("owner", ["root;id", "root:root:root", "Root", "", "root:", "a b", "${USER}"])
async def test_a_bad_file_owner_fails_update_machine_before_any_host_is_contacted(owner: str) -> None:
    request = load(FIXTURES[UPDATE_MACHINE])
    request["desired"]["bootstrapConfig"]["spec"]["files"][0]["owner"] = owner
    executor = FakeRuns()
    answer = await post(UPDATE_MACHINE, request, executor)
    assert answer["status"] == "Failure"
    assert answer["message"].startswith("InvalidRequest: desired.bootstrapConfig.spec.files[0].owner: must")
    assert executor.requests == []  # never handed to the executor: no host was resolved or contacted


@pytest.mark.parametrize("owner", ["root", "root:root", "1000:1000", "_apt:nogroup", "www-data:adm"])
async def test_good_file_owners_are_planned(owner: str) -> None:
    request = load(FIXTURES[UPDATE_MACHINE])
    request["desired"]["bootstrapConfig"]["spec"]["files"][0]["owner"] = owner
    executor = FakeRuns()
    answer = await post(UPDATE_MACHINE, request, executor)
    assert answer["status"] == "Success"
    [run] = executor.requests
    assert run.inputs["kubeadm_files"]["kubeadm_files_files"][0]["owner"] == owner


async def test_a_bad_owner_in_a_changed_file_is_declined_by_can_update() -> None:
    request = load(FIXTURES[CAN_UPDATE_MACHINE])
    desired = copy.deepcopy(request["desired"])
    desired["bootstrapConfig"]["spec"]["files"] = [{"path": "/etc/x", "content": "x", "owner": "root;id"}]
    request["desired"] = desired
    answer = await post(CAN_UPDATE_MACHINE, request)
    assert answer["status"] == "Success"
    ops = json.loads(base64.b64decode(answer["bootstrapConfigPatch"]["patch"]))
    assert [op["path"] for op in ops if "files" in op["path"]] == []  # the version still rides along
    assert (
        "KubeadmConfig /files: kubeadm_files does not change it in place: entry 0 owner must"
        in answer["message"]
    )
