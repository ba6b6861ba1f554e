"""CanUpdateMachine and CanUpdateMachineSet: one shared core over the pure decision in ``inplace.decide``.

A decline is ``Success`` with partial or no patches (CAPI then rolls the machine out, docs/capi-hooks.md
§7.4); ``Failure`` only in strict mode (``requireInPlace``), where it lists every unclaimed field and why.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from inplace_extension.api.common import Patch, ResponseStatus
from inplace_extension.api.inplace import (
    CanUpdateMachineRequest,
    CanUpdateMachineResponse,
    CanUpdateMachineSetRequest,
    CanUpdateMachineSetResponse,
)
from inplace_extension.hooks.context import HookContext, HookOptions
from inplace_extension.inplace.capabilities import max_disruption
from inplace_extension.inplace.custom import NO_CUSTOM, CustomTable, Disruption
from inplace_extension.inplace.decide import (
    Decision,
    decide_can_update_machine,
    decide_can_update_machine_set,
)

logger = logging.getLogger(__name__)

DISABLED_MESSAGE = "in-place updates are disabled by the ExtensionConfig setting disableInPlaceUpdates"


@dataclass(frozen=True)
class CanUpdateAnswer:
    status: ResponseStatus
    message: str | None
    decision: str  # log value: in-place | rollout | no-change | disabled | refused
    patches: Mapping[str, Patch] = field(default_factory=dict)  # wire patch field -> Patch
    # sent only with patches: whether the claimed changes disrupt the node (any class above none)
    affects_availability: bool | None = None


def strict_refusal(decision: Decision) -> str:
    """The strict-mode Failure message: every unclaimed field, with the core's (value-free) reason."""
    # a verdict's reason starts with its pointer ("/customImage: no capability changes it in place")
    unclaimed = [f"{v.kind} {v.reason}" for v in decision.verdicts if not v.in_place]
    return "requireInPlace: changes that cannot be applied in place: " + "; ".join(unclaimed)


def answer_can_update(
    options: HookOptions,
    decide: Callable[[], Decision],
    custom: CustomTable = NO_CUSTOM,
    send_affects_availability: bool = True,
) -> CanUpdateAnswer:
    """Apply the ExtensionConfig switches around the pure decision and encode its patches.

    ``affectsAvailability`` goes with every answer that claims something (unless turned off): false
    exactly when every claimed capability is of disruption class ``none``.
    """
    if options.disable_in_place_updates:
        return CanUpdateAnswer(ResponseStatus.SUCCESS, DISABLED_MESSAGE, "disabled")
    decision = decide()
    if options.require_in_place and not decision.fully_claimed:
        return CanUpdateAnswer(ResponseStatus.FAILURE, strict_refusal(decision), "refused")
    patches = {target: Patch.json_patch(ops) for target, ops in decision.patches.items() if ops}
    label = "in-place" if decision.fully_claimed else "rollout"
    if not decision.verdicts:
        label = "no-change"
    affects = None
    if patches and send_affects_availability:
        affects = max_disruption(decision.capabilities, custom) > Disruption.NONE
    return CanUpdateAnswer(ResponseStatus.SUCCESS, decision.message() or None, label, patches, affects)


def judge_machine(
    request: CanUpdateMachineRequest,
    custom: CustomTable = NO_CUSTOM,
    send_affects_availability: bool = True,
    kube_aware: bool = False,
) -> tuple[Decision, CanUpdateAnswer]:
    """The decision on a CanUpdateMachine request and the hook's answer (the hook and ``plan`` alike).
    ``kube_aware``: the infrastructure tags the provider applies are claimed (inplace/infra_tags.py)."""
    decision = decide_can_update_machine(
        request.current.to_json(), request.desired.to_json(), custom, kube_aware
    )
    options = HookOptions.from_settings(request.settings)
    return decision, answer_can_update(options, lambda: decision, custom, send_affects_availability)


def judge_machine_set(
    request: CanUpdateMachineSetRequest,
    custom: CustomTable = NO_CUSTOM,
    send_affects_availability: bool = True,
    kube_aware: bool = False,
) -> tuple[Decision, CanUpdateAnswer]:
    """The decision on a CanUpdateMachineSet request and the hook's answer (the hook and ``plan`` alike)."""
    decision = decide_can_update_machine_set(
        request.current.to_json(), request.desired.to_json(), custom, kube_aware
    )
    options = HookOptions.from_settings(request.settings)
    return decision, answer_can_update(options, lambda: decision, custom, send_affects_availability)


MACHINE_TARGETS = ("machinePatch", "infrastructureMachinePatch", "bootstrapConfigPatch")
MACHINE_SET_TARGETS = (
    "machineSetPatch",
    "infrastructureMachineTemplatePatch",
    "bootstrapConfigTemplatePatch",
)


def _patches_for(answer: CanUpdateAnswer, targets: tuple[str, ...]) -> list[Patch | None]:
    """The answer's patches in ``targets`` order; a patch for another target is a bug, not a silent drop."""
    stray = set(answer.patches) - set(targets)
    if stray:
        raise RuntimeError(f"decision produced patches for {sorted(stray)}, expected only {list(targets)}")
    return [answer.patches.get(target) for target in targets]


def _log(hook: str, machine: str, answer: CanUpdateAnswer) -> None:
    targets = ",".join(sorted(answer.patches)) or "-"
    affects = "-" if answer.affects_availability is None else str(answer.affects_availability).lower()
    logger.info(
        "hook=%s machine=%s decision=%s patches=%s affects_availability=%s",
        hook,
        machine,
        answer.decision,
        targets,
        affects,
    )


async def can_update_machine(
    request: CanUpdateMachineRequest, context: HookContext
) -> CanUpdateMachineResponse:
    settings = context.settings
    _, answer = judge_machine(request, context.custom, settings.affects_availability, settings.kube_aware)
    machine, infrastructure, bootstrap = _patches_for(answer, MACHINE_TARGETS)
    _log("CanUpdateMachine", request.desired.machine.key, answer)
    return CanUpdateMachineResponse(
        status=answer.status,
        message=answer.message,
        machine_patch=machine,
        infrastructure_machine_patch=infrastructure,
        bootstrap_config_patch=bootstrap,
        affects_availability=answer.affects_availability,
    )


async def can_update_machine_set(
    request: CanUpdateMachineSetRequest, context: HookContext
) -> CanUpdateMachineSetResponse:
    settings = context.settings
    _, answer = judge_machine_set(request, context.custom, settings.affects_availability, settings.kube_aware)
    # the old MachineSet is the object CAPI asks about (its Machines would move)
    machine_set, infrastructure, bootstrap = _patches_for(answer, MACHINE_SET_TARGETS)
    _log("CanUpdateMachineSet", request.current.machine_set.key, answer)
    return CanUpdateMachineSetResponse(
        status=answer.status,
        message=answer.message,
        machine_set_patch=machine_set,
        infrastructure_machine_template_patch=infrastructure,
        bootstrap_config_template_patch=bootstrap,
        affects_availability=answer.affects_availability,
    )
