"""Wire models: base64 patches as Go writes them, camelCase out, unknown fields ignored, objects verbatim."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from inplace_extension.api.common import Patch, PatchType, ResponseStatus
from inplace_extension.api.discovery import DiscoveryResponse, ExtensionHandler, GroupVersionHook
from inplace_extension.api.inplace import (
    CanUpdateMachineRequest,
    CanUpdateMachineResponse,
    CanUpdateMachineSetRequest,
    UpdateMachineRequest,
    UpdateMachineResponse,
)

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "capi"


def load(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / name).read_text())
    return data


# the table of docs/capi-hooks.md §3.3: decoded document -> exact wire string
@pytest.mark.parametrize(
    ("document", "patch_type", "wire"),
    [
        (
            [{"op": "replace", "path": "/spec/version", "value": "v1.31.0"}],
            PatchType.JSON_PATCH,
            "W3sib3AiOiJyZXBsYWNlIiwicGF0aCI6Ii9zcGVjL3ZlcnNpb24iLCJ2YWx1ZSI6InYxLjMxLjAifV0=",
        ),
        (
            {"spec": {"version": "v1.31.0"}},
            PatchType.JSON_MERGE_PATCH,
            "eyJzcGVjIjp7InZlcnNpb24iOiJ2MS4zMS4wIn19",
        ),
        ([], PatchType.JSON_PATCH, "W10="),
        ({}, PatchType.JSON_MERGE_PATCH, "e30="),
    ],
)
def test_patch_encodes_standard_padded_base64_when_serialized(
    document: Any, patch_type: PatchType, wire: str
) -> None:
    raw = json.dumps(document, separators=(",", ":")).encode()
    patch = Patch(patch_type=patch_type, patch=raw)
    assert json.loads(patch.to_wire()) == {"patchType": patch_type.value, "patch": wire}
    assert Patch.model_validate({"patchType": patch_type.value, "patch": wire}).document() == document


def test_patch_json_patch_matches_capi_example_when_built_from_operations() -> None:
    patch = Patch.json_patch([{"op": "replace", "path": "/spec/version", "value": "v1.31.0"}])
    assert (
        json.loads(patch.to_wire())["patch"]
        == load("can_update_machine/4A.response.json")["machinePatch"]["patch"]
    )


@pytest.mark.parametrize(
    "bad",
    [
        base64.urlsafe_b64encode(b'[{"op":"add","path":"/a","value":"??>"}]').decode(),  # '-'/'_' alphabet
        "W10",  # padding missing
        12,
        "not base64 at all!",
    ],
)
def test_patch_rejects_non_standard_base64_when_decoding(bad: object) -> None:
    with pytest.raises(ValidationError) as info:
        Patch.model_validate({"patchType": "JSONPatch", "patch": bad})
    assert info.value.errors()[0]["loc"] == ("patch",)


def test_update_machine_response_always_carries_retry_after_seconds() -> None:
    done = json.loads(UpdateMachineResponse(status=ResponseStatus.SUCCESS).to_wire())
    assert done == {
        "kind": "UpdateMachineResponse",
        "apiVersion": "hooks.runtime.cluster.x-k8s.io/v1alpha1",
        "status": "Success",
        "retryAfterSeconds": 0,
    }
    failed = json.loads(UpdateMachineResponse(status=ResponseStatus.FAILURE, message="m").to_wire())
    assert failed["retryAfterSeconds"] == 0
    assert failed["message"] == "m"


def test_responses_leave_out_absent_patches_and_use_camel_case() -> None:
    wire = json.loads(
        CanUpdateMachineResponse(
            status=ResponseStatus.SUCCESS, bootstrap_config_patch=Patch.json_patch([])
        ).to_wire()
    )
    assert set(wire) == {"kind", "apiVersion", "status", "bootstrapConfigPatch"}


def test_discovery_response_matches_capi_explicit_example_when_built_from_models() -> None:
    expected = load("discovery/response.explicit.json")
    handlers = [
        ExtensionHandler(
            name=h["name"],
            request_hook=GroupVersionHook(hook=h["requestHook"]["hook"]),
            timeout_seconds=h["timeoutSeconds"],
            failure_policy=h["failurePolicy"],
        )
        for h in expected["handlers"]
    ]
    assert (
        json.loads(DiscoveryResponse(status=ResponseStatus.SUCCESS, handlers=handlers).to_wire()) == expected
    )


@pytest.mark.parametrize(
    ("model", "fixture"),
    [
        (CanUpdateMachineRequest, "can_update_machine/4A.request.json"),
        (CanUpdateMachineRequest, "can_update_machine/4B.request.json"),
        (CanUpdateMachineSetRequest, "can_update_machine_set/5A.request.json"),
        (CanUpdateMachineSetRequest, "can_update_machine_set/5B.request.json"),
        (UpdateMachineRequest, "update_machine/6A.request.json"),
        (UpdateMachineRequest, "update_machine/6B.request.json"),
    ],
)
def test_request_objects_round_trip_verbatim_when_parsed(
    model: type[CanUpdateMachineRequest | CanUpdateMachineSetRequest | UpdateMachineRequest], fixture: str
) -> None:
    document = load(fixture)
    request = model.model_validate(document)
    assert request.desired.to_json() == document["desired"]
    if not isinstance(request, UpdateMachineRequest):
        assert request.current.to_json() == document["current"]


def test_request_ignores_unknown_fields_but_keeps_them_inside_objects() -> None:
    document = load("update_machine/6B.request.json")
    document["somethingNew"] = {"x": 1}
    document["desired"]["infrastructureMachine"]["status"] = {"ready": True, "nothing": None}
    request = UpdateMachineRequest.model_validate(document)
    assert request.desired.infrastructure_machine.to_json()["status"] == {"ready": True, "nothing": None}
    assert "somethingNew" not in request.model_dump(by_alias=True)


def test_machine_requires_name_and_namespace() -> None:
    document = load("update_machine/6A.request.json")
    del document["desired"]["machine"]["metadata"]["namespace"]
    with pytest.raises(ValidationError) as info:
        UpdateMachineRequest.model_validate(document)
    assert info.value.errors()[0]["loc"] == ("desired", "machine", "metadata", "namespace")
