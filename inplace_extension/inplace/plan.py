"""The plan of an update: the capabilities that apply to a machine's desired state, their role inputs,
the fingerprint. :func:`plan_update` reads an UpdateMachine request's desired objects; the MCM agent
states its desired state directly (:func:`plan_capabilities` with its own paths for error messages).

UpdateMachine sends no ``current`` (docs/capi-hooks.md §6.4), so every capability whose fields are present in
the desired objects becomes a step with its full desired inputs; the roles converge declaratively and
the host's stamp makes an already-applied fingerprint a no-op. Each step has a fingerprint of its own
(:func:`step_fingerprints`): the stamp keeps them too, so a step whose inputs the host's last complete
run applied is skipped without touching the host (docs/playbooks.md). Only claimed fields are
read: ``joinConfiguration.discovery`` (bootstrap tokens) never reaches a step. User-defined capabilities
(inplace_extension/inplace/custom.py) follow the built-ins in file order, each with ``<name>_values``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from inplace_extension.inplace.capabilities import CAPABILITIES
from inplace_extension.inplace.custom import NO_CUSTOM, CustomTable, CustomValueError, extract_values
from inplace_extension.inplace.inputs import DesiredObjects, PlanError
from inplace_extension.inplace.objects import MACHINE_SLOTS, ClaimKind, claim_kind, is_control_plane, kind_of

__all__ = [
    "DesiredObjects",
    "Plan",
    "PlanError",
    "PlanStep",
    "fingerprint",
    "plan_capabilities",
    "plan_update",
    "step_fingerprints",
]


@dataclass(frozen=True)
class PlanStep:
    capability: str  # = role name = Ansible tag (built-ins); a user-defined capability names its role
    inputs: Mapping[str, Any]  # role variables, named <capability>_<input>
    role: str | None = None  # user-defined capabilities only: the user's role (the playbook includes it)


@dataclass(frozen=True)
class Plan:
    namespace: str
    name: str
    steps: tuple[PlanStep, ...]  # in CAPABILITIES order, then user-defined ones in file order
    fingerprint: str  # sha256 hex of canonical JSON {capability: inputs}

    @property
    def capabilities(self) -> tuple[str, ...]:
        return tuple(step.capability for step in self.steps)

    @property
    def inputs(self) -> dict[str, Mapping[str, Any]]:
        """{capability: inputs}: the document the fingerprint is computed over (and the playbook reads)."""
        return {step.capability: step.inputs for step in self.steps}

    @property
    def step_fingerprints(self) -> dict[str, str]:
        """{capability: fingerprint of that step's inputs}, in run order (:func:`step_fingerprints`)."""
        return step_fingerprints(self.inputs)


def plan_update(desired: Mapping[str, Any], custom: CustomTable = NO_CUSTOM) -> Plan:
    """desired = the UpdateMachine request's ``desired`` objects. Raises PlanError for invalid values.

    ``custom``: user-defined capabilities, planned after the built-ins from the desired objects only.
    """
    machine = desired.get("machine")
    if not isinstance(machine, Mapping):
        raise PlanError("desired.machine", "must be an object")
    namespace = _name(machine, "namespace")
    name = _name(machine, "name")
    spec = machine.get("spec")
    if not isinstance(spec, Mapping):
        raise PlanError("desired.machine.spec", "must be an object")
    bootstrap = desired.get("bootstrapConfig")  # absent when the Machine has no bootstrap config
    if bootstrap is not None and not isinstance(bootstrap, Mapping):
        raise PlanError("desired.bootstrapConfig", "must be an object")
    bootstrap_spec = None
    if bootstrap is not None and claim_kind(bootstrap) is ClaimKind.KUBEADM_CONFIG:
        bootstrap_spec = bootstrap.get("spec")
        if not isinstance(bootstrap_spec, Mapping):
            raise PlanError("desired.bootstrapConfig.spec", "must be an object")
    objects = DesiredObjects(spec, is_control_plane(machine), bootstrap_spec)
    metadata = machine.get("metadata")
    annotations = metadata.get("annotations") if isinstance(metadata, Mapping) else None
    return plan_capabilities(
        namespace,
        name,
        objects,
        custom,
        _specs_by_kind(desired) if custom else {},
        annotations if isinstance(annotations, Mapping) else None,
    )


def plan_capabilities(
    namespace: str,
    name: str,
    objects: DesiredObjects,
    custom: CustomTable = NO_CUSTOM,
    specs: Mapping[str, Mapping[str, Any]] | None = None,
    annotations: Mapping[str, Any] | None = None,
) -> Plan:
    """The plan for one machine's desired state, whoever states it: the built-in capabilities read
    ``objects``; user-defined ones read ``specs`` (kind -> spec of each machine-level object) and the
    machine's ``annotations``. Raises PlanError naming the path ``objects`` gives."""
    steps = []
    for capability in CAPABILITIES:
        inputs = capability.extract(objects)
        if inputs is not None:
            steps.append(PlanStep(capability.name, inputs))
    for extra in custom.capabilities:
        try:
            values = extract_values(extra, specs or {}, annotations)
        except CustomValueError as exc:
            raise PlanError(exc.where, exc.problem) from None
        if values is not None:
            steps.append(PlanStep(extra.name, values, extra.role))
    return Plan(namespace, name, tuple(steps), fingerprint({step.capability: step.inputs for step in steps}))


def fingerprint(inputs: Mapping[str, Mapping[str, Any]]) -> str:
    """sha256 hex of canonical JSON (sorted keys, compact separators, UTF-8) of {capability: inputs}."""
    canonical = json.dumps(inputs, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def step_fingerprints(inputs: Mapping[str, Mapping[str, Any]]) -> dict[str, str]:
    """{capability: fingerprint of ``{capability: inputs}``} per step, in the order of ``inputs``.

    The whole plan's fingerprint says whether a host already has the update; a step's says whether the
    host's last complete run applied that step with the same inputs, in which case the play skips it.
    The capability's name is hashed with its inputs, so two capabilities with equal inputs differ.
    """
    return {capability: fingerprint({capability: values}) for capability, values in inputs.items()}


def _specs_by_kind(desired: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    """Kind -> spec of each desired object (UpdateMachine carries the machine-level shapes only)."""
    specs: dict[str, Mapping[str, Any]] = {}
    for slot in MACHINE_SLOTS:
        obj = desired.get(slot.key)
        if isinstance(obj, Mapping):
            spec = obj.get("spec")
            if isinstance(spec, Mapping):
                specs.setdefault(kind_of(obj), spec)
    return specs


def _name(machine: Mapping[str, Any], key: str) -> str:
    metadata = machine.get("metadata")
    value = metadata.get(key) if isinstance(metadata, Mapping) else None
    if not isinstance(value, str) or not value:
        raise PlanError(f"desired.machine.metadata.{key}", "must be a non-empty string")
    return value
