"""The preview of an update, judged by the service's own functions: CanUpdate* by the hooks' judge
(``hooks.can_update``), the steps by the UpdateMachine hook's plan (``hooks.update_machine``) or the MCM
agent's (``mcm.desired``), the drain point by ``inplace.capabilities.drain_point`` (what the
Kubernetes-aware mode asks), the host by ``runs.resolve.resolve_host`` and the window by the schedule of
the capabilities file. Nothing here decides anything itself: it asks and reports.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Final

from inplace_extension.api.body import parse_json, parse_request
from inplace_extension.api.inplace import (
    CanUpdateMachineRequest,
    CanUpdateMachineSetRequest,
    UpdateMachineRequest,
)
from inplace_extension.errors import InvalidRequest
from inplace_extension.hooks.can_update import CanUpdateAnswer, judge_machine, judge_machine_set
from inplace_extension.hooks.update_machine import plan_request, to_run_request
from inplace_extension.inplace.capabilities import CAPABILITIES, disruption_of, drain_point
from inplace_extension.inplace.custom import CustomTable
from inplace_extension.inplace.decide import Decision
from inplace_extension.inplace.infra_tags import CAPABILITY as INFRA_TAGS
from inplace_extension.inplace.infra_tags import DesiredTags, desired_tags
from inplace_extension.inplace.objects import ClaimKind
from inplace_extension.inplace.plan import Plan
from inplace_extension.inplace.pointers import changed_pointers, is_under
from inplace_extension.mcm.desired import SPEC_PATH, DesiredStateError, parse_spec, plan_for
from inplace_extension.preview.inputs import (
    Machine,
    Part,
    PlanInputError,
    Side,
    json_bytes,
    machine_request,
    machine_set_request,
    update_request,
)
from inplace_extension.preview.model import (
    Answer,
    Change,
    Drain,
    Host,
    MachinePreview,
    Preview,
    Step,
    Window,
)
from inplace_extension.runs.inventory import Inventory
from inplace_extension.runs.model import RunRequest, run_request
from inplace_extension.runs.resolve import (
    HostTarget,
    ResolveError,
    parse_cidrs,
    resolve_host,
    status_addresses,
)
from inplace_extension.runs.windows import Schedule
from inplace_extension.settings import Settings

VERSION_STEP: Final = "kubernetes_version"
IN_PLACE_UPDATE: Final = "/providerSpec/inPlaceUpdate"


@dataclass(frozen=True)
class Context:
    """What the service would judge with: its settings, the capabilities file, the inventory, the clock."""

    settings: Settings
    custom: CustomTable
    windows: Schedule
    inventory: Inventory | None  # None: no --inventory, hosts are not resolved
    now: float


# -- CAPI ------------------------------------------------------------------------------------------


def preview_templates(old: Side, new: Side, machines: tuple[Machine, ...], context: Context) -> Preview:
    """Old and new templates: what CanUpdateMachineSet answers, then UpdateMachine for each machine."""
    template = new.parts.get(Part.MACHINE_TEMPLATE) or next(iter(new.parts.values()))
    subject = f"{template.kind} {template.namespace}/{template.name}"
    try:
        request = _parse(CanUpdateMachineSetRequest, machine_set_request(old, new))
        return _preview_machine_set(request, subject, machines, context)
    except InvalidRequest as exc:  # a value of the wrong type for CAPI's Go type: the hook refuses it
        side = old if exc.where.startswith("current") else new
        return Preview(
            subject, "capi", "invalid", failure=f"{side.path}: the hook would answer Failure: {exc}"
        )


def preview_control_plane(old: Side, new: Side, machines: tuple[Machine, ...], context: Context) -> Preview:
    """Old and new KubeadmControlPlane: what CanUpdateMachine answers for its Machines, then UpdateMachine."""
    found = new.parts[Part.CONTROL_PLANE]
    subject = f"KubeadmControlPlane {found.namespace}/{found.name}"
    try:
        requests = [
            _parse(CanUpdateMachineRequest, machine_request(old, new, machine))
            for machine in (machines or (Machine(found.name),))
        ]
    except InvalidRequest as exc:  # a value of the wrong type for CAPI's Go type: the hook refuses it
        side = old if exc.where.startswith("current") else new
        return Preview(
            subject, "capi", "invalid", failure=f"{side.path}: the hook would answer Failure: {exc}"
        )
    return _preview_machines(subject, requests, bool(machines), context, machines)


def preview_request(document: Any, machines: tuple[Machine, ...], context: Context) -> Preview:
    """A saved CanUpdateMachineSet, CanUpdateMachine or UpdateMachine request; an invalid one is the
    Failure the hook answers (outcome ``invalid``)."""
    body = json_bytes(document)
    try:
        kind = request_kind(parse_json(body))
        if machines and kind != "CanUpdateMachineSetRequest":
            raise PlanInputError(f"--machine: a {kind} names its Machine itself")
        if kind == "CanUpdateMachineSetRequest":
            machine_set = parse_request(CanUpdateMachineSetRequest, body)
            subject = f"MachineSet {machine_set.current.machine_set.key}"
            return _preview_machine_set(machine_set, subject, machines, context)
        if kind == "CanUpdateMachineRequest":
            return _preview_machine(parse_request(CanUpdateMachineRequest, body), context)
        return _preview_update(parse_request(UpdateMachineRequest, body), context)
    except InvalidRequest as exc:
        return Preview("the request", "capi", "invalid", failure=str(exc))


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


def _preview_machine_set(
    request: CanUpdateMachineSetRequest, subject: str, machines: tuple[Machine, ...], context: Context
) -> Preview:
    settings = context.settings
    decision, answer = judge_machine_set(
        request, context.custom, settings.affects_availability, settings.kube_aware
    )
    current, desired = request.current.to_json(), request.desired.to_json()
    namespace = request.desired.machine_set.metadata.namespace
    idle = _idle(_version(current["machineSet"], True), _version(desired["machineSet"], True))
    template_machine = Machine(request.desired.machine_set.metadata.name)
    if not machines:
        labels = (desired["machineSet"]["spec"]["template"].get("metadata") or {}).get("labels") or {}
        template_machine = Machine(template_machine.name, labels)
    updates = [
        _parse(UpdateMachineRequest, update_request(desired, machine, namespace))
        for machine in (machines or (template_machine,))
    ]
    return _capi_preview(
        subject, decision, answer, "CanUpdateMachineSet", updates, bool(machines), idle, context, machines
    )


def _preview_machine(request: CanUpdateMachineRequest, context: Context) -> Preview:
    return _preview_machines(f"Machine {request.desired.machine.key}", [request], True, context)


def _preview_machines(
    subject: str,
    requests: Sequence[CanUpdateMachineRequest],
    named: bool,
    context: Context,
    given: Sequence[Machine] = (),
) -> Preview:
    """CanUpdateMachine for each Machine (the first one's answer is shown: the objects are the same but
    for the Machines' names, labels and annotations), then UpdateMachine of its desired objects."""
    settings = context.settings
    decision, answer = judge_machine(
        requests[0], context.custom, settings.affects_availability, settings.kube_aware
    )
    current, desired = requests[0].current.to_json(), requests[0].desired.to_json()
    idle = _idle(_version(current["machine"], False), _version(desired["machine"], False))
    updates = [
        _parse(UpdateMachineRequest, {"kind": "UpdateMachineRequest", "desired": request.desired.to_json()})
        for request in requests
    ]
    return _capi_preview(subject, decision, answer, "CanUpdateMachine", updates, named, idle, context, given)


def _preview_update(request: UpdateMachineRequest, context: Context) -> Preview:
    """UpdateMachine alone: no current state, so which steps change something is not known."""
    subject = f"Machine {request.desired.machine.key}"
    try:
        plan = plan_request(request, context.custom)
    except InvalidRequest as exc:
        return Preview(subject, "capi", "invalid", failure=str(exc))
    run = to_run_request(plan, request)
    drain = _service_drain(plan, frozenset(), context, known_version=False)
    steps = _steps(plan, None, drain, context.custom)
    machine = _machine_preview(run, _machine_of(request), context, in_place=True)
    tags = desired_tags(request.desired.to_json().get("infrastructureMachine"))
    infrastructure = _infrastructure(tags) if tags is not None and context.settings.kube_aware else None
    return Preview(
        subject,
        "capi",
        "in-place",
        None,
        (),
        steps,
        plan.fingerprint,
        drain,
        (machine,),
        infrastructure=infrastructure,
    )


def _infrastructure(tags: DesiredTags) -> str:
    """What ``plan`` says of provider-applied tags: no step of ours, the provider's work waited for."""
    row = tags.provider
    return (
        f"tags, no host work ({row.provider} applies {row.kind} {row.pointer}; "
        f"UpdateMachine waits for its annotation {row.annotation})"
    )


def _capi_preview(
    subject: str,
    decision: Decision,
    answer: CanUpdateAnswer,
    hook: str,
    updates: Sequence[UpdateMachineRequest],
    named: bool,
    idle: frozenset[str],
    context: Context,
    given: Sequence[Machine] = (),
) -> Preview:
    """``given``: the machines the updates are for, in their order (their ``status.addresses``, which
    an UpdateMachine request does not carry, resolve the host in the Kubernetes-aware mode)."""
    outcome = answer.decision  # in-place | rollout | no-change | disabled | refused
    shown = Answer(
        hook,
        answer.status.value,
        answer.message,
        tuple(sorted(answer.patches)),
        answer.affects_availability,
    )
    changes = tuple(
        Change(v.kind, v.pointer, v.in_place, v.capability, v.reason.removeprefix(f"{v.pointer}: "))
        for v in decision.verdicts
    )
    in_place = outcome == "in-place"
    try:
        plans = [plan_request(update, context.custom) for update in updates]
    except InvalidRequest as exc:
        failure = f"UpdateMachine would answer Failure: {exc}" if in_place else None
        return Preview(subject, "capi", "invalid" if in_place else outcome, shown, changes, failure=failure)
    runs = [(to_run_request(plan, update), update) for plan, update in zip(plans, updates, strict=True)]
    plan = plans[0]
    steps: tuple[Step, ...] = ()
    drain = None
    infrastructure = None
    tags = desired_tags(updates[0].desired.to_json().get("infrastructureMachine"))
    if in_place and INFRA_TAGS in decision.capabilities and tags is not None:
        infrastructure = _infrastructure(tags)
    if in_place:
        drain = _service_drain(plan, idle, context, known_version=True)
        steps = _steps(plan, frozenset(decision.capabilities), drain, context.custom)
    machines: tuple[MachinePreview, ...] = ()
    window = None
    if named:
        addresses = [machine.addresses for machine in given] + [()] * len(runs)
        machines = tuple(
            _machine_preview(run, replace(_machine_of(req), addresses=found), context, in_place)
            for (run, req), found in zip(runs, addresses, strict=False)
        )
    else:
        window = _window(runs[0][0].labels, context)
    return Preview(
        subject,
        "capi",
        outcome,
        shown,
        changes,
        steps,
        plan.fingerprint if in_place else None,
        drain,
        machines,
        window,
        infrastructure=infrastructure,
    )


def _service_drain(plan: Plan, idle: frozenset[str], context: Context, known_version: bool) -> Drain:
    """Where the service drains the Node: only in the Kubernetes-aware mode, as ``--drain`` says."""
    settings = context.settings
    if not settings.kube_aware:
        return Drain("none", None, "the service drains only in its Kubernetes-aware mode (--kube)")
    before = drain_point(plan.capabilities, settings.drain, context.custom, idle)
    why = f"--drain {settings.drain}"
    if settings.drain == "auto":
        if before is None:
            why += ": no step restarts the kubelet or reboots"
        else:
            why += f": right before {before}, the first step that restarts the kubelet or reboots"
        if VERSION_STEP in idle:
            why += f"; {VERSION_STEP} does not count: the kubelet already runs the target version"
        elif VERSION_STEP in plan.capabilities and not known_version:
            why += "; assuming the kubelet does not run the target version yet (the service asks the Node)"
    return Drain("service", before, why)


def _idle(old: str | None, new: str | None) -> frozenset[str]:
    """Steps that change nothing on a machine of the old template: the version step when the version
    stays (the service asks the Node which kubelet it runs; a machine of the old template runs ``old``)."""
    return frozenset({VERSION_STEP}) if new is not None and old == new else frozenset()


def _version(obj: Mapping[str, Any], template: bool) -> str | None:
    spec = obj.get("spec") or {}
    if template:
        spec = (spec.get("template") or {}).get("spec") or {}
    version = spec.get("version")
    return version if isinstance(version, str) else None


def _machine_of(request: UpdateMachineRequest) -> Machine:
    metadata = request.desired.machine.metadata
    return Machine(metadata.name, metadata.labels or {}, metadata.annotations or {})


# -- MCM -------------------------------------------------------------------------------------------


def preview_machine_classes(old: Side, new: Side, nodes: tuple[Machine, ...], context: Context) -> Preview:
    """Old and new MachineClass: what the MCM agent runs on each Node of an in-place rollout to ``new``
    (MCM drains the Node first); changed fields outside ``providerSpec.inPlaceUpdate`` are not applied."""
    new_found = new.parts[Part.MACHINE_CLASS]
    namespace, subject = new_found.namespace, f"MachineClass {new_found.namespace}/{new_found.name}"
    old_plan = _class_plan(old.parts[Part.MACHINE_CLASS].obj, namespace, new_found.name, context.custom)
    try:
        spec = parse_spec(new_found.obj)
        plans = [(node, plan_for(spec, namespace, node.name, context.custom)) for node in nodes]
        plan = plans[0][1] if plans else plan_for(spec, namespace, new_found.name, context.custom)
    except DesiredStateError as exc:
        failure = f"the agent answers update-result failed: {exc}"
        return Preview(subject, "mcm", "invalid", failure=failure)
    changed_steps = frozenset(
        step.capability
        for step in plan.steps
        if old_plan is None or old_plan.inputs.get(step.capability) != step.inputs
    )
    changes = _class_changes(old.parts[Part.MACHINE_CLASS].obj, new_found.obj, changed_steps, context.custom)
    first = plan.capabilities[0] if plan.capabilities else None
    why = "MCM cordons and drains the Node before it sets ReadyForUpdate: every step runs on a drained Node"
    drain = Drain("mcm", first, why)
    steps = _steps(plan, changed_steps, drain, context.custom)
    if not changes:
        outcome = "no-change"
    else:
        outcome = "in-place" if all(change.in_place for change in changes) else "partial"
    machines = tuple(
        _machine_preview(
            run_request(node_plan, node.annotations, node.labels, None, node.addresses), node, context, True
        )
        for node, node_plan in plans
    )
    window = None if plans else _window({}, context)
    return Preview(subject, "mcm", outcome, None, changes, steps, plan.fingerprint, drain, machines, window)


def _class_plan(
    machine_class: Mapping[str, Any], namespace: str, name: str, custom: CustomTable
) -> Plan | None:
    """The plan of the old MachineClass (None when it has no usable desired state: every step is new)."""
    try:
        return plan_for(parse_spec(machine_class), namespace, name, custom)
    except DesiredStateError:
        return None


def _class_changes(
    old: Mapping[str, Any], new: Mapping[str, Any], changed_steps: frozenset[str], custom: CustomTable
) -> tuple[Change, ...]:
    """Each changed field of the MachineClass: applied in place when the step that reads it changed."""
    ignored = ("apiVersion", "kind", "metadata", "status")
    before = {key: value for key, value in old.items() if key not in ignored}
    after = {key: value for key, value in new.items() if key not in ignored}
    changes = []
    for pointer in changed_pointers(before, after):
        if not is_under(pointer, IN_PLACE_UPDATE):
            reason = (
                f"outside {SPEC_PATH}: the Nodes updated in place keep the old value (new machines get it)"
            )
            changes.append(Change("MachineClass", pointer, False, None, reason))
            continue
        capability = _reader(pointer.removeprefix(IN_PLACE_UPDATE), new, custom)
        if capability is None:
            reason = "no capability reads it: not applied"
            changes.append(Change("MachineClass", pointer, False, None, reason))
        elif capability in changed_steps:
            changes.append(
                Change("MachineClass", pointer, True, capability, f"{capability} applies it in place")
            )
        else:
            reason = f"{capability} does not read it (its inputs are unchanged): not applied"
            changes.append(Change("MachineClass", pointer, False, capability, reason))
    return tuple(changes)


def _reader(pointer: str, machine_class: Mapping[str, Any], custom: CustomTable) -> str | None:
    """The capability whose claims cover a field of ``inPlaceUpdate`` (the one claims table, read with
    the MCM shape: ``kubernetesVersion`` is the Machine's ``/version``, ``kubeadmConfigSpec`` a
    KubeadmConfig's spec, ``infrastructure.spec`` the infrastructure object's)."""
    if pointer == "":
        return None
    roots: list[tuple[str, str, ClaimKind | None]] = [
        ("/kubernetesVersion", "/version", ClaimKind.MACHINE),
        ("/kubeadmConfigSpec", "", ClaimKind.KUBEADM_CONFIG),
    ]
    infrastructure = ((machine_class.get("providerSpec") or {}).get("inPlaceUpdate") or {}).get(
        "infrastructure"
    )
    kind = infrastructure.get("kind") if isinstance(infrastructure, Mapping) else None
    for root, prefix, claim_kind in roots:
        if not is_under(pointer, root):
            continue
        relative = prefix + pointer.removeprefix(root)
        for capability in CAPABILITIES:
            for claim in capability.claims_for(claim_kind) if claim_kind else ():
                if is_under(relative, claim.pointer) or is_under(claim.pointer, relative):
                    return capability.name
        custom_kind = claim_kind.value if claim_kind else ""
        for custom_capability, custom_claim in custom.claims_for(custom_kind, False):
            if is_under(relative, custom_claim.pointer) or is_under(custom_claim.pointer, relative):
                return custom_capability.name
    if isinstance(kind, str) and is_under(pointer, "/infrastructure/spec"):
        relative = pointer.removeprefix("/infrastructure/spec")
        for custom_capability, custom_claim in custom.claims_for(kind, False):
            if is_under(relative, custom_claim.pointer) or is_under(custom_claim.pointer, relative):
                return custom_capability.name
    return None


# -- shared ----------------------------------------------------------------------------------------


def _steps(plan: Plan, changed: frozenset[str] | None, drain: Drain, custom: CustomTable) -> tuple[Step, ...]:
    names = plan.capabilities
    drained_from = names.index(drain.before) if drain.before in names else len(names)
    fingerprints = plan.step_fingerprints
    return tuple(
        Step(
            step.capability,
            step.role or step.capability,
            disruption_of(step.capability, custom).label,
            None if changed is None else step.capability in changed,
            index >= drained_from,
            tuple(step.inputs),
            fingerprints[step.capability],
        )
        for index, step in enumerate(plan.steps)
    )


def _machine_preview(run: RunRequest, machine: Machine, context: Context, in_place: bool) -> MachinePreview:
    host, target = _host(run, machine, context)
    return MachinePreview(
        run.machine,
        run.ident if in_place else None,
        host,
        _window(run.labels, context),
        run if in_place else None,
        target if in_place else None,
    )


def _host(run: RunRequest, machine: Machine, context: Context) -> tuple[Host | None, HostTarget | None]:
    """The SSH target as the service resolves it. The ``status.addresses`` that come last: those the
    run carries (the MCM agent's Node), else in the Kubernetes-aware mode the Machine's (from a Machine
    object given in a file; the service reads the live one), else none."""
    if context.inventory is None:
        return None, None
    settings = context.settings
    live = (lambda: machine.addresses) if settings.kube_aware else None
    try:
        target = resolve_host(
            run.namespace,
            run.name,
            run.labels,
            run.annotations,
            context.inventory,
            parse_cidrs(settings.allowed_cidrs),
            status_addresses(run.addresses, live),
            settings.address_types,
        )
    except ResolveError as exc:
        return Host(reason=exc.reason, message=exc.message), None
    return Host(target.address, target.port, target.user, target.source), target


def _window(labels: Mapping[str, str], context: Context) -> Window | None:
    if not context.windows.applies(labels):
        return None
    closed = context.windows.closed(labels, context.now)
    return Window(True) if closed is None else Window(False, closed.window, closed.when)


def _parse(model: type[Any], body: Mapping[str, Any]) -> Any:
    """A request built from the files, through the hook's own parser (its errors name the field)."""
    return parse_request(model, json_bytes(body))
