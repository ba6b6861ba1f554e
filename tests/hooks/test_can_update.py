"""CanUpdate* through the real app; the CAPI emulator (tests/capi_emulator.py) decides in place vs rollout."""

from __future__ import annotations

import copy
import json
import logging
from typing import Any

import pytest
from capi_emulator import emulate_can_update_machine, emulate_can_update_machine_set

from inplace_extension.hooks.can_update import DISABLED_MESSAGE

from .conftest import CAN_UPDATE_MACHINE, CAN_UPDATE_MACHINE_SET, TOKEN, load, post

pytestmark = pytest.mark.anyio

CASES = [
    ("can_update_machine/4A.request.json", CAN_UPDATE_MACHINE, "in-place"),
    ("can_update_machine/4B.request.json", CAN_UPDATE_MACHINE, "rollout"),
    ("can_update_machine_set/5A.request.json", CAN_UPDATE_MACHINE_SET, "in-place"),
    ("can_update_machine_set/5B.request.json", CAN_UPDATE_MACHINE_SET, "rollout"),
]


def emulate(path: str, request: dict[str, Any], answer: dict[str, Any]) -> Any:
    emulator = emulate_can_update_machine if path == CAN_UPDATE_MACHINE else emulate_can_update_machine_set
    return emulator(request, answer)


@pytest.mark.parametrize(("fixture", "path", "outcome"), CASES)
async def test_capi_fixtures_lead_to_the_expected_outcome(fixture: str, path: str, outcome: str) -> None:
    request = load(fixture)
    answer = await post(path, request)
    assert answer["status"] == "Success"
    assert emulate(path, request, answer).outcome == outcome
    # CAPI caches CanUpdateMachineSet for 24 h and warns against changing messages: same request, same bytes
    assert await post(path, request) == answer


async def test_a_partial_claim_leaves_exactly_the_unclaimed_field_for_capi() -> None:
    request = load("can_update_machine/4B.request.json")
    result = emulate(CAN_UPDATE_MACHINE, request, await post(CAN_UPDATE_MACHINE, request))
    assert [str(d) for d in result.diff] == ["infrastructureMachine /customImage"]


async def test_disable_in_place_updates_declines_with_success_and_no_patches() -> None:
    request = load("can_update_machine_set/5A.request.json")
    request["settings"]["disableInPlaceUpdates"] = "true"
    answer = await post(CAN_UPDATE_MACHINE_SET, request)
    assert {k: v for k, v in answer.items() if k != "message"} == load(
        "can_update_machine_set/5C.response.decline.json"
    )
    assert answer["message"] == DISABLED_MESSAGE
    assert emulate(CAN_UPDATE_MACHINE_SET, request, answer).outcome == "rollout"


async def test_require_in_place_fails_and_lists_every_unclaimed_field() -> None:
    request = load("can_update_machine_set/5B.request.json")
    request["settings"]["requireInPlace"] = "true"
    answer = await post(CAN_UPDATE_MACHINE_SET, request)
    assert answer["status"] == "Failure"
    assert answer["message"] == (
        "requireInPlace: changes that cannot be applied in place: "
        "DockerMachineTemplate /customImage: no capability changes it in place"
    )
    assert not any(key.endswith("Patch") for key in answer)


async def test_require_in_place_changes_nothing_when_everything_is_claimed() -> None:
    request = load("can_update_machine/4A.request.json")
    plain = await post(CAN_UPDATE_MACHINE, request)
    request["settings"]["requireInPlace"] = "true"
    assert await post(CAN_UPDATE_MACHINE, request) == plain


async def test_no_difference_is_success_without_patches() -> None:
    request = load("can_update_machine/4A.request.json")
    request["desired"] = copy.deepcopy(request["current"])
    answer = await post(CAN_UPDATE_MACHINE, request)
    assert answer["status"] == "Success"
    assert not any(key.endswith("Patch") for key in answer)
    assert emulate(CAN_UPDATE_MACHINE, request, answer).outcome == "in-place"


async def test_bootstrap_tokens_never_reach_answers_or_logs(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    request = load("can_update_machine/4B.request.json")
    for side, token in (("current", TOKEN), ("desired", TOKEN.replace("abcdef.", "zyxwvu."))):
        request[side]["bootstrapConfig"]["spec"]["joinConfiguration"]["discovery"] = {
            "bootstrapToken": {"apiServerEndpoint": "172.18.0.3:6443", "token": token}
        }
    answer = await post(CAN_UPDATE_MACHINE, request)
    assert answer["status"] == "Success"
    assert emulate(CAN_UPDATE_MACHINE, request, answer).outcome == "rollout"  # discovery is never claimed
    text = json.dumps(answer) + caplog.text
    for patch_field in ("machinePatch", "bootstrapConfigPatch"):
        text += json.dumps(answer.get(patch_field, {}))
    assert TOKEN not in text
    assert "zyxwvu." not in text


async def test_one_log_line_per_decision(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="inplace_extension")
    await post(CAN_UPDATE_MACHINE, load("can_update_machine/4B.request.json"))
    lines = [r.getMessage() for r in caplog.records if r.name == "inplace_extension.hooks.can_update"]
    assert lines == [
        "hook=CanUpdateMachine machine=default/my-cluster-cp-7xk2p decision=rollout "
        "patches=bootstrapConfigPatch,machinePatch affects_availability=true"
    ]


async def test_a_patch_for_a_foreign_target_is_a_bug_not_a_silent_drop(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from inplace_extension.hooks import can_update
    from inplace_extension.inplace.decide import Decision

    stray = Decision(patches={"machineSetPatch": [{"op": "add", "path": "/x", "value": 1}]}, verdicts=())
    monkeypatch.setattr(can_update, "decide_can_update_machine", lambda *args: stray)
    answer = await post(CAN_UPDATE_MACHINE, load("can_update_machine/4A.request.json"))
    assert (answer["status"], answer["message"]) == ("Failure", "InternalError: see extension logs")
    assert "machineSetPatch" in caplog.text


@pytest.mark.parametrize(
    ("fixture", "path"),
    [("can_update_machine/4A", CAN_UPDATE_MACHINE), ("can_update_machine_set/5A", CAN_UPDATE_MACHINE_SET)],
)
async def test_full_claims_answer_exactly_the_capi_example_patches(fixture: str, path: str) -> None:
    answer = await post(path, load(f"{fixture}.request.json"))
    expected = load(f"{fixture}.response.json")
    # the examples predate CAPI v1.15's affectsAvailability; a version upgrade restarts the kubelet
    assert answer.pop("affectsAvailability") is True
    assert {k: v for k, v in answer.items() if k != "message"} == expected  # same base64, byte for byte
