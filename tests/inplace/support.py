"""Helpers for the inplace tests: load bodies, turn a Decision into a CAPI response, ask the emulator."""

from __future__ import annotations

import base64
import copy
import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from capi_emulator import EmulatorResult, emulate_can_update_machine, emulate_can_update_machine_set

from inplace_extension.inplace.decide import (
    Decision,
    decide_can_update_machine,
    decide_can_update_machine_set,
)

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


def load(relative: str) -> dict[str, Any]:
    """A request/response body from tests/fixtures (``capi/...`` or ``requests/...``), as a fresh dict."""
    data: dict[str, Any] = json.loads((FIXTURES / relative).read_text())
    return data


def response_for(decision: Decision) -> dict[str, Any]:
    """The CanUpdate* response the hook sends for a decision: JSONPatch, standard padded base64."""
    response: dict[str, Any] = {"status": "Success", "message": decision.message()}
    for target, ops in decision.patches.items():
        encoded = base64.b64encode(json.dumps(ops, separators=(",", ":")).encode()).decode()
        response[target] = {"patchType": "JSONPatch", "patch": encoded}
    return response


def decide_and_emulate(request: Mapping[str, Any]) -> tuple[Decision, EmulatorResult]:
    """Decide a CanUpdateMachine[Set] request with the real core and judge the answer like CAPI does."""
    decide: Callable[[Mapping[str, Any], Mapping[str, Any]], Decision]
    emulate: Callable[[Mapping[str, Any], Mapping[str, Any]], EmulatorResult]
    if request["kind"] == "CanUpdateMachineSetRequest":
        decide, emulate = decide_can_update_machine_set, emulate_can_update_machine_set
    else:
        decide, emulate = decide_can_update_machine, emulate_can_update_machine
    before = copy.deepcopy(request)
    decision = decide(request["current"], request["desired"])
    assert request == before, "the decision must not modify the request"
    return decision, emulate(request, response_for(decision))


def bootstrap_spec(request: dict[str, Any], side: str) -> dict[str, Any]:
    """The machine spec of the bootstrap config (template) on one side of a CanUpdate* request."""
    objects = request[side]
    if "bootstrapConfigTemplate" in objects:
        spec: dict[str, Any] = objects["bootstrapConfigTemplate"]["spec"]["template"]["spec"]
    else:
        spec = objects["bootstrapConfig"]["spec"]
    return spec


def machine_spec(request: dict[str, Any], side: str) -> dict[str, Any]:
    objects = request[side]
    if "machineSet" in objects:
        spec: dict[str, Any] = objects["machineSet"]["spec"]["template"]["spec"]
    else:
        spec = objects["machine"]["spec"]
    return spec


def unchanged(request: dict[str, Any]) -> dict[str, Any]:
    """A copy of a CanUpdate* request whose desired objects equal its current ones."""
    result = copy.deepcopy(request)
    result["desired"] = copy.deepcopy(result["current"])
    return result
