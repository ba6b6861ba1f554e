"""``inplace-extension plan``: explain to people what the hooks would do with a request (no I/O, no executor).

CanUpdate*: field by field, what is done in place (by which capability) and what forces a rollout, and
the answer the hook would give. UpdateMachine: the plan steps, their input names, and the fingerprint.
Values are never printed: they may be secrets (password hashes, file contents, bootstrap tokens).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from inplace_extension.api.body import parse_json, parse_request
from inplace_extension.api.inplace import (
    CanUpdateMachineRequest,
    CanUpdateMachineSetRequest,
    UpdateMachineRequest,
)
from inplace_extension.errors import InvalidRequest
from inplace_extension.hooks.can_update import CanUpdateAnswer, answer_can_update
from inplace_extension.hooks.context import HookOptions
from inplace_extension.hooks.update_machine import plan_request, to_run_request
from inplace_extension.inplace.custom import NO_CUSTOM, CustomTable
from inplace_extension.inplace.decide import (
    Decision,
    decide_can_update_machine,
    decide_can_update_machine_set,
)
from inplace_extension.runs.windows import NO_WINDOWS, Schedule


def request_kind(document: Any) -> str:
    """The request kind from ``kind``, or from the shape when ``kind`` is missing."""
    if not isinstance(document, dict):
        raise InvalidRequest("(body)", "must be a JSON object")
    kind = document.get("kind")
    if kind in ("CanUpdateMachineRequest", "CanUpdateMachineSetRequest", "UpdateMachineRequest"):
        return str(kind)
    current = document.get("current")
    if isinstance(current, dict):
        return "CanUpdateMachineSetRequest" if "machineSet" in current else "CanUpdateMachineRequest"
    if "desired" in document:
        return "UpdateMachineRequest"
    raise InvalidRequest("kind", "not a CanUpdateMachine, CanUpdateMachineSet or UpdateMachine request")


def _describe(value: Any) -> str:
    if isinstance(value, list):
        return f"list[{len(value)}]"
    if isinstance(value, dict):
        return f"object[{len(value)}]"
    return type(value).__name__


def _explain_decision(title: str, decision: Decision, answer: CanUpdateAnswer) -> list[str]:
    lines = [title]
    if not decision.verdicts:
        lines.append("  no compared field differs")
    width = max((len(f"{v.kind} {v.pointer}") for v in decision.verdicts), default=0)
    for verdict in decision.verdicts:
        where = f"{verdict.kind} {verdict.pointer}".ljust(width)
        reason = verdict.reason.removeprefix(f"{verdict.pointer}: ")  # the pointer is already in its column
        lines.append(f"  {'in place' if verdict.in_place else 'ROLLOUT ':<8}  {where}  {reason}")
    rollouts = sum(1 for v in decision.verdicts if not v.in_place)
    outcome = (
        "in place" if decision.fully_claimed else f"rollout ({rollouts} of {len(decision.verdicts)} changes)"
    )
    lines.append(f"outcome: {outcome}")
    patches = ", ".join(sorted(answer.patches)) or "none"
    lines.append(f"answer:  {answer.status.value}, patches: {patches}")
    if answer.affects_availability is not None:
        lines.append(f"affectsAvailability: {str(answer.affects_availability).lower()}")
    if answer.message:
        lines.append(f"message: {answer.message}")
    return lines


def _explain_window(run_labels: Mapping[str, str], windows: Schedule, now: float) -> list[str]:
    """When this Machine's update may start (only when a maintenance window applies to it)."""
    if not windows.applies(run_labels):
        return []
    closed = windows.closed(run_labels, now)
    if closed is None:
        return ["maintenance window: open now (an update may start)"]
    return [f'maintenance window: closed; "{closed.window}" opens {closed.when}']


def _explain_update(
    request: UpdateMachineRequest, custom: CustomTable, windows: Schedule, now: float
) -> list[str]:
    plan = plan_request(request, custom)
    run = to_run_request(plan, request)
    lines = [
        f"UpdateMachine {request.desired.machine.key}",
        f"fingerprint: {plan.fingerprint}",
        f"run: {run.ident}",
    ]
    if not plan.steps:
        lines.append("steps: none (nothing to apply)")
    for number, step in enumerate(plan.steps, 1):
        inputs: Mapping[str, Any] = step.inputs
        names = ", ".join(f"{name} ({_describe(value)})" for name, value in inputs.items())
        role = f" (role {step.role})" if step.role is not None else ""
        lines.append(f"  {number}. {step.capability}{role}: {names}")
    return lines + _explain_window(run.labels, windows, now)


def explain_request(
    body: bytes, custom: CustomTable = NO_CUSTOM, windows: Schedule = NO_WINDOWS, now: float = 0.0
) -> tuple[list[str], bool]:
    """Lines for a person, and whether the request was valid. Never raises for bad input.

    ``custom``: the user-defined capabilities (``plan --capabilities-file``), judged as the service would;
    ``windows`` and ``now``: an UpdateMachine request also says when its maintenance window opens.
    """
    try:
        kind = request_kind(parse_json(body))
        if kind == "UpdateMachineRequest":
            return _explain_update(parse_request(UpdateMachineRequest, body), custom, windows, now), True
        if kind == "CanUpdateMachineSetRequest":
            ms = parse_request(CanUpdateMachineSetRequest, body)
            decision = decide_can_update_machine_set(ms.current.to_json(), ms.desired.to_json(), custom)
            answer = answer_can_update(HookOptions.from_settings(ms.settings), lambda: decision, custom)
            return _explain_decision(
                f"CanUpdateMachineSet {ms.current.machine_set.key}", decision, answer
            ), True
        m = parse_request(CanUpdateMachineRequest, body)
        decision = decide_can_update_machine(m.current.to_json(), m.desired.to_json(), custom)
        answer = answer_can_update(HookOptions.from_settings(m.settings), lambda: decision, custom)
        return _explain_decision(f"CanUpdateMachine {m.desired.machine.key}", decision, answer), True
    except InvalidRequest as exc:
        return [str(exc)], False
