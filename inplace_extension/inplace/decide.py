"""CanUpdateMachine / CanUpdateMachineSet decisions: which changed fields are claimed, and the patches.

For every object of the request (Machine or MachineSet first, then the infrastructure object, then the
bootstrap config) the changed fields of the machine spec are found, each capability claim whose guard
passes copies desired over current at its pointer, and everything else stays unclaimed -- that is the
decline, after which CAPI rolls the machine out (docs/capi-hooks.md §7.2-§7.4). ExtensionConfig settings
(disableInPlaceUpdates, requireInPlace) are applied by the hook, not here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any, Final

from inplace_extension.inplace import infra_tags
from inplace_extension.inplace.capabilities import (
    CAPABILITIES,
    VERSION_CLAIM,
    Capability,
    Claim,
    capability_names,
)
from inplace_extension.inplace.custom import NO_CUSTOM, CustomTable, removal_problem
from inplace_extension.inplace.guards import Change
from inplace_extension.inplace.objects import (
    MACHINE_SET_SLOTS,
    MACHINE_SLOTS,
    ClaimKind,
    Role,
    Slot,
    claim_kind,
    comparable_machine_spec,
    kind_of,
    spec_of,
)
from inplace_extension.inplace.patches import SpecPatch
from inplace_extension.inplace.pointers import (
    MISSING,
    changed_pointers,
    get_in,
    is_object,
    is_under,
    json_equal,
    parse_pointer,
)


@dataclass(frozen=True)
class FieldVerdict:
    target: str  # response patch field it belongs to: "machinePatch", "bootstrapConfigTemplatePatch", ...
    kind: str  # kind of the object, e.g. "KubeadmConfigTemplate"
    pointer: str  # JSON pointer of the changed field, relative to the machine spec ("/version", "/files")
    in_place: bool  # claimed?
    capability: str | None
    reason: str  # deterministic, never contains field values (they may be secrets)


@dataclass(frozen=True)
class Decision:
    patches: Mapping[str, list[dict[str, Any]]]  # patch field -> RFC 6902 ops (only targets with ops)
    verdicts: tuple[FieldVerdict, ...]  # one per changed field, claimed or not
    # run order: the provider's infrastructure tags (no host work), the built-ins, then custom
    order: tuple[str, ...] = field(default=(infra_tags.CAPABILITY, *capability_names()))

    @property
    def fully_claimed(self) -> bool:
        """True when every change is claimed (also when nothing changed): CAPI will update in place."""
        return all(verdict.in_place for verdict in self.verdicts)

    @property
    def capabilities(self) -> tuple[str, ...]:
        """Capabilities with at least one claimed field, in run order (CAPABILITIES, then user-defined)."""
        used = {verdict.capability for verdict in self.verdicts if verdict.in_place}
        return tuple(name for name in self.order if name in used)

    @property
    def unclaimed(self) -> tuple[FieldVerdict, ...]:
        return tuple(verdict for verdict in self.verdicts if not verdict.in_place)

    def message(self) -> str:
        """Deterministic, secret-free summary for the response message."""
        if not self.verdicts:
            return "no changes"
        claimed = ", ".join(self.capabilities)
        if self.fully_claimed:
            return f"in place: {claimed}"
        rollout = "; ".join(f"{verdict.kind} {verdict.reason}" for verdict in self.unclaimed)
        return f"rollout needed: {rollout}" + (f"; in place alone: {claimed}" if claimed else "")


def _first_segment(pointer: str) -> str:
    """``"/clusterConfiguration/featureGates"`` -> ``"clusterConfiguration"`` (as escaped in the pointer)."""
    return pointer.split("/", 2)[1] if pointer else ""


# (capability, claim, first segment of the claim's pointer) per claim kind, in CAPABILITIES order
_CLAIMS_BY_KIND: Final[Mapping[ClaimKind, tuple[tuple[Capability, Claim, str], ...]]] = {
    kind: tuple(
        (capability, claim, _first_segment(claim.pointer))
        for capability in CAPABILITIES
        for claim in capability.claims_for(kind)
    )
    for kind in ClaimKind
}


def decide_can_update_machine(
    current: Mapping[str, Any],
    desired: Mapping[str, Any],
    custom: CustomTable = NO_CUSTOM,
    kube_aware: bool = False,
) -> Decision:
    """current/desired: {"machine", "infrastructureMachine", "bootstrapConfig" (optional)} JSON objects.

    ``custom``: the user-defined capabilities (inplace/custom.py), claimed after the built-ins.
    ``kube_aware``: the service can read the cluster, so it claims the infrastructure tags that the
    provider applies itself (inplace/infra_tags.py): UpdateMachine waits for the provider's record.
    """
    return _decide(current, desired, MACHINE_SLOTS, custom, kube_aware)


def decide_can_update_machine_set(
    current: Mapping[str, Any],
    desired: Mapping[str, Any],
    custom: CustomTable = NO_CUSTOM,
    kube_aware: bool = False,
) -> Decision:
    """current/desired: {"machineSet", "infrastructureMachineTemplate", "bootstrapConfigTemplate"?}."""
    return _decide(current, desired, MACHINE_SET_SLOTS, custom, kube_aware)


def _decide(
    current: Mapping[str, Any],
    desired: Mapping[str, Any],
    slots: tuple[Slot, ...],
    custom: CustomTable,
    kube_aware: bool,
) -> Decision:
    patches: dict[str, list[dict[str, Any]]] = {}
    verdicts: list[FieldVerdict] = []
    upgrade_claimed = False
    for slot in slots:
        slot_verdicts, ops = _decide_slot(
            slot, current.get(slot.key), desired.get(slot.key), upgrade_claimed, custom, kube_aware
        )
        if slot.role is Role.MACHINE:
            upgrade_claimed = any(v.in_place and v.pointer == VERSION_CLAIM.pointer for v in slot_verdicts)
        verdicts.extend(slot_verdicts)
        if ops:
            patches[slot.target] = ops
    if custom:
        return Decision(patches, tuple(verdicts), (infra_tags.CAPABILITY, *capability_names(), *custom.names))
    return Decision(patches, tuple(verdicts))


def _decide_slot(
    slot: Slot,
    current_obj: Any,
    desired_obj: Any,
    upgrade_claimed: bool,
    custom: CustomTable,
    kube_aware: bool,
) -> tuple[list[FieldVerdict], list[dict[str, Any]]]:
    if current_obj is None and desired_obj is None:
        return [], []
    if is_object(desired_obj):
        kind = kind_of(desired_obj)
    else:
        kind = kind_of(current_obj) if is_object(current_obj) else "object"
    if not is_object(current_obj) or not is_object(desired_obj):
        return [_unclaimed(slot, kind, "", f"{slot.key} is not present as an object on both sides")], []
    current_spec, desired_spec = spec_of(current_obj, slot), spec_of(desired_obj, slot)
    if current_spec is MISSING and desired_spec is MISSING:
        return [], []
    if not is_object(current_spec) or not is_object(desired_spec):
        return [_unclaimed(slot, kind, "", f"{slot.key}{_dotted(slot)} is not an object on both sides")], []
    comparable = comparable_machine_spec if slot.role is Role.MACHINE else _as_is
    current_compared, desired_compared = comparable(current_spec), comparable(desired_spec)
    changed = changed_pointers(current_compared, desired_compared)
    if not changed:
        return [], []
    # Patches are computed on the real specs (CAPI applies them to the real object); changes are judged on
    # what CAPI compares, so the Machine fields it ignores never need a claim (docs/capi-hooks.md §7.3).
    patch = SpecPatch(current_spec, desired_spec, slot.spec_pointer)
    verdicts: list[FieldVerdict] = []
    ckind = claim_kind(desired_obj)
    if ckind is not None and ckind is claim_kind(current_obj):
        verdicts = _claim(
            slot, kind, ckind, patch, current_compared, desired_compared, upgrade_claimed, changed
        )
    # User-defined claims match on the kind string alone (any API group and version: the user named the
    # kind, and their role decides what the value means); both sides must be that kind.
    if slot.role is Role.INFRASTRUCTURE and kind == kind_of(current_obj):
        verdicts.extend(_claim_infra_tags(slot, desired_obj, patch, current_spec, desired_spec, kube_aware))
    if custom and kind == kind_of(current_obj):
        verdicts.extend(_claim_custom(slot, kind, custom, patch, current_compared, desired_compared, changed))
    # Every changed field outside the claimed pointers is unclaimed. A claim's ops only ever touch its own
    # subtree (and the ancestors that exist only to hold it), so these are exactly the fields where the
    # patched spec still differs from desired.
    decided = [verdict.pointer for verdict in verdicts]
    for pointer in changed:
        if not any(is_under(pointer, claimed) for claimed in decided):
            declined = infra_tags.declined_reason(kind, pointer, slot.template)
            why = "no capability changes it in place" if declined is None else declined
            verdicts.append(_unclaimed(slot, kind, pointer, f"{pointer or '/'}: {why}"))
    verdicts.sort(key=_POINTER)
    return verdicts, patch.ops


_POINTER: Final = attrgetter("pointer")


def _claim(
    slot: Slot,
    kind: str,
    ckind: ClaimKind,
    patch: SpecPatch,
    current_spec: Mapping[str, Any],
    desired_spec: Mapping[str, Any],
    upgrade_claimed: bool,
    changed: list[str],
) -> list[FieldVerdict]:
    """Run every claim of this kind whose field changed: guard first, then copy desired over current."""
    # A claimed field whose value differs has a changed pointer inside it or above it, so both start with
    # the same segment: claims under any other first segment are unchanged and skipped without a look.
    segments = {_first_segment(pointer) for pointer in changed}
    everything = "" in segments  # (changed_pointers never reports the root of two objects; be safe anyway)
    verdicts = []
    for capability, claim, segment in _CLAIMS_BY_KIND[ckind]:
        if segment not in segments and not everything:
            continue
        old, new = get_in(current_spec, claim.tokens), get_in(desired_spec, claim.tokens)
        if _same(old, new):
            continue
        change = Change(claim.pointer, old, new, current_spec, desired_spec, upgrade_claimed)
        problem = claim.guard(change) or patch.claim(claim.tokens)
        verdicts.append(_verdict(slot, kind, claim.pointer, capability.name, problem))
    return verdicts


def _claim_infra_tags(
    slot: Slot,
    desired_obj: Mapping[str, Any],
    patch: SpecPatch,
    current_spec: Mapping[str, Any],
    desired_spec: Mapping[str, Any],
    kube_aware: bool,
) -> list[FieldVerdict]:
    """The provider's tags field of an infrastructure machine (template) of the table, when it changed:
    claimed in the Kubernetes-aware mode when the guard passes, else unclaimed with the reason."""
    provider = infra_tags.provider_of(desired_obj, slot.template)
    if provider is None:
        return []
    tokens = parse_pointer(provider.pointer)
    old, new = get_in(current_spec, tokens), get_in(desired_spec, tokens)
    if _same(old, new):
        return []
    problem = infra_tags.tags_problem(old, new)
    if problem is None and not kube_aware:
        problem = infra_tags.NOT_KUBE_AWARE
    problem = problem or patch.claim(tokens)
    return [_verdict(slot, kind_of(desired_obj), provider.pointer, infra_tags.CAPABILITY, problem)]


def _claim_custom(
    slot: Slot,
    kind: str,
    custom: CustomTable,
    patch: SpecPatch,
    current_spec: Mapping[str, Any],
    desired_spec: Mapping[str, Any],
    changed: list[str],
) -> list[FieldVerdict]:
    """The user-defined claims of this kind, after the built-ins (load-time checks keep them disjoint)."""
    segments = {_first_segment(pointer) for pointer in changed}
    verdicts = []
    for capability, claim in custom.claims_for(kind, slot.template):
        if _first_segment(claim.pointer) not in segments and "" not in segments:
            continue
        old, new = get_in(current_spec, claim.tokens), get_in(desired_spec, claim.tokens)
        if _same(old, new):
            continue
        problem = removal_problem(new, claim.kind)
        if problem is None and capability.rule is not None:
            problem = capability.rule.problem(new)  # shipped capabilities: e.g. no target version in it
        problem = problem or patch.claim(claim.tokens)
        verdicts.append(_verdict(slot, kind, claim.pointer, capability.name, problem))
    return verdicts


def _verdict(slot: Slot, kind: str, pointer: str, capability: str, problem: str | None) -> FieldVerdict:
    """A claimed field's verdict; ``problem`` (from a guard or the patch) means it stays unclaimed."""
    if problem is None:
        reason = f"{pointer}: {capability} changes it in place"
    else:
        reason = f"{pointer}: {capability} does not change it in place: {problem}"
    return FieldVerdict(slot.target, kind, pointer, problem is None, capability, reason)


def _same(old: Any, new: Any) -> bool:
    if old is MISSING or new is MISSING:
        return old is new
    return json_equal(old, new)


def _as_is(spec: Mapping[str, Any]) -> Mapping[str, Any]:
    return spec


def _unclaimed(slot: Slot, kind: str, pointer: str, reason: str) -> FieldVerdict:
    return FieldVerdict(slot.target, kind, pointer, False, None, reason)


def _dotted(slot: Slot) -> str:
    return "".join("." + part for part in slot.spec_path)
