"""The CAPI emulator itself: it must agree with the documented fixture outcomes and be as strict as Go."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from capi_emulator import (
    EmulatorError,
    apply_json_patch,
    apply_merge_patch,
    emulate_can_update_machine,
    emulate_can_update_machine_set,
    json_equal,
)

from .support import bootstrap_spec, load, machine_spec, unchanged


def _patch(document: Any, patch_type: str = "JSONPatch") -> dict[str, str]:
    return {"patchType": patch_type, "patch": base64.b64encode(json.dumps(document).encode()).decode()}


def test_emulator_finds_in_place_when_fixture_4a_expected_response_applies() -> None:
    result = emulate_can_update_machine(
        load("capi/can_update_machine/4A.request.json"), load("capi/can_update_machine/4A.response.json")
    )
    assert result.outcome == "in-place"
    assert result.diff == ()
    assert result.patched["machine"]["spec"]["version"] == "v1.31.0"


def test_emulator_finds_in_place_when_fixture_5a_expected_response_applies() -> None:
    result = emulate_can_update_machine_set(
        load("capi/can_update_machine_set/5A.request.json"),
        load("capi/can_update_machine_set/5A.response.json"),
    )
    assert result.in_place


@pytest.mark.parametrize(
    ("request_file", "response_file", "obj"),
    [
        (
            "can_update_machine/4B.request.json",
            "can_update_machine/4B.response.json",
            "infrastructureMachine",
        ),
        (
            "can_update_machine_set/5B.request.json",
            "can_update_machine_set/5B.response.json",
            "infrastructureMachineTemplate",
        ),
    ],
)
def test_emulator_rolls_out_when_custom_image_is_not_patched(
    request_file: str, response_file: str, obj: str
) -> None:
    request = load("capi/" + request_file)
    emulate = (
        emulate_can_update_machine_set if "machineSet" in request["current"] else emulate_can_update_machine
    )
    result = emulate(request, load("capi/" + response_file))
    assert result.outcome == "rollout"
    assert [(d.obj, d.pointer) for d in result.diff] == [(obj, "/customImage")]


def test_emulator_rolls_out_when_the_answer_has_no_patches() -> None:
    result = emulate_can_update_machine(
        load("capi/can_update_machine/4A.request.json"),
        load("capi/can_update_machine/4C.response.decline.json"),
    )
    assert [str(d) for d in result.diff] == [
        "machine /version",
        "bootstrapConfig /clusterConfiguration/etcd/local/imageTag",
    ]


def test_emulator_raises_when_the_answer_is_a_failure() -> None:
    with pytest.raises(EmulatorError, match="Failure"):
        emulate_can_update_machine(
            load("capi/can_update_machine/4A.request.json"),
            load("capi/can_update_machine/4D.response.failure.json"),
        )


@pytest.mark.parametrize(
    "raw",
    [
        "W3sib3AiOiJyZXBsYWNlIiwicGF0aCI6Ii9zcGVjL3ZlcnNpb24iLCJ2YWx1ZSI6InYxLjMxLjAifV0",  # unpadded
        # URL-safe alphabet: "???" encodes to "Pz8/" in standard base64, "Pz8_" in URL-safe
        base64.urlsafe_b64encode(b'[{"op":"add","path":"/spec/x","value":"???"}]').decode(),
        "not base64 at all!",
    ],
)
def test_emulator_raises_when_patch_is_not_standard_padded_base64(raw: str) -> None:
    request = load("capi/can_update_machine/4A.request.json")
    with pytest.raises(EmulatorError, match="base64"):
        emulate_can_update_machine(
            request, {"status": "Success", "machinePatch": {"patchType": "JSONPatch", "patch": raw}}
        )


def test_emulator_raises_when_patch_is_raw_json_instead_of_base64() -> None:
    request = load("capi/can_update_machine/4A.request.json")
    response = {
        "status": "Success",
        "machinePatch": {"patchType": "JSONPatch", "patch": [{"op": "remove", "path": "/x"}]},
    }
    with pytest.raises(EmulatorError, match="base64 string"):
        emulate_can_update_machine(request, response)


@pytest.mark.parametrize(
    "ops",
    [
        [{"op": "replace", "path": "/spec/customImage", "value": "x"}],  # replace of a missing path
        [{"op": "remove", "path": "/spec/customImage"}],  # remove of a missing path
        [{"op": "add", "path": "/spec/nested/customImage", "value": "x"}],  # add under a missing parent
        [{"op": "test", "path": "/spec/bootstrapped", "value": False}],  # failing test
        [{"op": "add", "path": "/spec/extraMounts/5", "value": {}}],  # index past the end
        [{"op": "add", "path": "/spec/extraMounts/-1", "value": {}}],  # negative index (we never emit one)
    ],
)
def test_emulator_raises_when_json_patch_does_not_apply(ops: list[dict[str, Any]]) -> None:
    request = load("capi/can_update_machine/4A.request.json")
    with pytest.raises(EmulatorError, match="JSONPatch op 0"):
        emulate_can_update_machine(request, {"status": "Success", "infrastructureMachinePatch": _patch(ops)})


def test_emulator_raises_when_json_patch_type_has_no_document() -> None:
    request = load("capi/can_update_machine/4A.request.json")
    with pytest.raises(EmulatorError, match="empty JSONPatch"):
        emulate_can_update_machine(request, {"status": "Success", "machinePatch": {"patchType": "JSONPatch"}})


def test_emulator_skips_merge_patch_type_without_document() -> None:
    request = load("capi/can_update_machine/4A.request.json")
    result = emulate_can_update_machine(
        request, {"status": "Success", "machinePatch": {"patchType": "JSONMergePatch"}}
    )
    assert [d.pointer for d in result.diff] == ["/version", "/clusterConfiguration/etcd/local/imageTag"]


@pytest.mark.parametrize(
    ("patch", "match"),
    [
        ({"patch": "W10="}, "patchType is not set"),
        ({"patchType": "StrategicMerge", "patch": "W10="}, "unknown patchType"),
    ],
)
def test_emulator_raises_when_patch_type_is_missing_or_unknown(patch: dict[str, str], match: str) -> None:
    request = load("capi/can_update_machine/4A.request.json")
    with pytest.raises(EmulatorError, match=match):
        emulate_can_update_machine(request, {"status": "Success", "machinePatch": patch})


def test_emulator_keeps_only_spec_when_patch_touches_metadata() -> None:
    request = load("capi/can_update_machine/4A.request.json")
    ops = [
        {"op": "add", "path": "/metadata/labels/extra", "value": "x"},
        {"op": "replace", "path": "/spec/version", "value": "v1.31.0"},
    ]
    result = emulate_can_update_machine(request, {"status": "Success", "machinePatch": _patch(ops)})
    assert "extra" not in result.patched["machine"]["metadata"]["labels"]
    assert result.patched["machine"]["spec"]["version"] == "v1.31.0"


def test_emulator_ignores_machine_fields_capi_ignores() -> None:
    request = unchanged(load("capi/can_update_machine/4A.request.json"))
    spec = machine_spec(request, "desired")
    spec.update(
        providerID="other",
        clusterName="other",
        minReadySeconds=30,
        taints=[{"key": "k", "effect": "NoSchedule"}],
    )
    spec["readinessGates"] = []
    spec["deletion"] = {"nodeDrainTimeoutSeconds": 99}
    del spec["bootstrap"]
    assert emulate_can_update_machine(request, {"status": "Success"}).in_place


def test_emulator_rolls_out_when_failure_domain_changes() -> None:
    request = unchanged(load("capi/can_update_machine/4A.request.json"))
    machine_spec(request, "desired")["failureDomain"] = "fd2"
    result = emulate_can_update_machine(request, {"status": "Success"})
    assert [str(d) for d in result.diff] == ["machine /failureDomain"]


def test_emulator_treats_empty_list_and_absence_as_different() -> None:
    request = unchanged(load("capi/can_update_machine_set/5A.request.json"))
    bootstrap_spec(request, "desired")["files"] = []
    result = emulate_can_update_machine_set(request, {"status": "Success"})
    assert [str(d) for d in result.diff] == ["bootstrapConfigTemplate /files"]


def test_emulator_ignores_bootstrap_template_patch_when_request_has_none() -> None:
    request = unchanged(load("capi/can_update_machine_set/5A.request.json"))
    del request["current"]["bootstrapConfigTemplate"], request["desired"]["bootstrapConfigTemplate"]
    bogus = _patch([{"op": "remove", "path": "/does/not/exist"}])
    assert emulate_can_update_machine_set(
        request, {"status": "Success", "bootstrapConfigTemplatePatch": bogus}
    ).in_place


def test_json_patch_applier_supports_move_copy_and_array_append() -> None:
    doc = {"a": {"b": 1}, "list": [1, 2]}
    ops = [
        {"op": "copy", "from": "/a", "path": "/c"},
        {"op": "move", "from": "/a/b", "path": "/d"},
        {"op": "add", "path": "/list/-", "value": 3},
        {"op": "replace", "path": "/list/0", "value": 0},
    ]
    assert apply_json_patch(doc, ops) == {"a": {}, "c": {"b": 1}, "d": 1, "list": [0, 2, 3]}
    assert doc == {"a": {"b": 1}, "list": [1, 2]}


def test_merge_patch_deletes_with_null_and_replaces_lists() -> None:
    assert apply_merge_patch({"a": 1, "b": [1, 2], "c": {"d": 1}}, {"a": None, "b": [3], "c": {"e": 2}}) == {
        "b": [3],
        "c": {"d": 1, "e": 2},
    }


@pytest.mark.parametrize(("a", "b"), [(True, 1), ([], {}), (None, {}), ({"a": []}, {"a": None}), ("1", 1)])
def test_json_equal_distinguishes_json_types(a: Any, b: Any) -> None:
    assert not json_equal(a, b)
    assert json_equal(a, a)
