"""Which object of a CanUpdate*/UpdateMachine request plays which role, where its spec lives, its kind.

One capability declaration serves four shapes because every claim is relative to the machine spec:
Machine ``/spec``, MachineSet ``/spec/template/spec``, KubeadmConfig ``/spec`` and KubeadmConfigTemplate
``/spec/template/spec`` (docs/capabilities.md).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from inplace_extension.inplace.pointers import get_in, is_object


class ClaimKind(enum.Enum):
    """The kinds capabilities claim fields of; templates and MachineSets map onto these."""

    MACHINE = "Machine"
    KUBEADM_CONFIG = "KubeadmConfig"


class Role(enum.Enum):
    MACHINE = "machine"
    INFRASTRUCTURE = "infrastructure"
    BOOTSTRAP = "bootstrap"


@dataclass(frozen=True)
class Slot:
    """One object of a request: key in ``current``/``desired``, response patch field, spec root."""

    key: str
    target: str
    role: Role
    spec_path: tuple[str, ...]

    @property
    def template(self) -> bool:
        """Does this slot hold a template (MachineSet, *Template) rather than the machine's own object?"""
        return self.spec_path == _TEMPLATE_SPEC

    @property
    def spec_pointer(self) -> str:
        return "".join("/" + part for part in self.spec_path)


_SPEC: Final = ("spec",)
_TEMPLATE_SPEC: Final = ("spec", "template", "spec")

# In processing order: the Machine first, because KubeadmConfig claims depend on the version verdict.
MACHINE_SLOTS: Final = (
    Slot("machine", "machinePatch", Role.MACHINE, _SPEC),
    Slot("infrastructureMachine", "infrastructureMachinePatch", Role.INFRASTRUCTURE, _SPEC),
    Slot("bootstrapConfig", "bootstrapConfigPatch", Role.BOOTSTRAP, _SPEC),
)
MACHINE_SET_SLOTS: Final = (
    Slot("machineSet", "machineSetPatch", Role.MACHINE, _TEMPLATE_SPEC),
    Slot(
        "infrastructureMachineTemplate",
        "infrastructureMachineTemplatePatch",
        Role.INFRASTRUCTURE,
        _TEMPLATE_SPEC,
    ),
    Slot("bootstrapConfigTemplate", "bootstrapConfigTemplatePatch", Role.BOOTSTRAP, _TEMPLATE_SPEC),
)

# (API group, kind) -> claim kind. Only v1beta2 is understood: the field shapes claims rely on
# (e.g. kubeletExtraArgs as a list of {name, value}) are those of v1beta2, the version CAPI v1.12+ sends.
_CLAIMABLE: Final[Mapping[tuple[str, str], ClaimKind]] = {
    ("cluster.x-k8s.io", "Machine"): ClaimKind.MACHINE,
    ("cluster.x-k8s.io", "MachineSet"): ClaimKind.MACHINE,
    ("bootstrap.cluster.x-k8s.io", "KubeadmConfig"): ClaimKind.KUBEADM_CONFIG,
    ("bootstrap.cluster.x-k8s.io", "KubeadmConfigTemplate"): ClaimKind.KUBEADM_CONFIG,
}
_SUPPORTED_VERSIONS: Final = frozenset({"v1beta2"})

# Fields CleanupMachineSpecForDiff zeroes before CAPI compares Machine specs (docs/capi-hooks.md §7.3).
_IGNORED_MACHINE_FIELDS: Final = frozenset(
    {
        "clusterName",
        "bootstrap",
        "infrastructureRef",
        "providerID",
        "minReadySeconds",
        "readinessGates",
        "taints",
    }
)
_IGNORED_DELETION_FIELDS: Final = frozenset(
    {"nodeDrainTimeoutSeconds", "nodeVolumeDetachTimeoutSeconds", "nodeDeletionTimeoutSeconds"}
)

CONTROL_PLANE_LABEL: Final = "cluster.x-k8s.io/control-plane"


def kind_of(obj: Mapping[str, Any]) -> str:
    kind = obj.get("kind")
    return kind if isinstance(kind, str) and kind else "object"


def claim_kind(obj: Mapping[str, Any]) -> ClaimKind | None:
    """The claim kind of an object, or None when no capability claims anything of it."""
    api_version = obj.get("apiVersion")
    kind = obj.get("kind")
    if not isinstance(api_version, str) or not isinstance(kind, str):
        return None
    group, _, version = api_version.rpartition("/")
    if version not in _SUPPORTED_VERSIONS:
        return None
    return _CLAIMABLE.get((group, kind))


def spec_of(obj: Mapping[str, Any], slot: Slot) -> Any:
    """The machine spec of an object (a Mapping when well formed), or ``MISSING``."""
    return get_in(obj, slot.spec_path)


def comparable_machine_spec(spec: Mapping[str, Any]) -> dict[str, Any]:
    """A Machine spec as CAPI compares it: ignored fields dropped, typed zero values ("", null) absent."""
    cleaned: dict[str, Any] = {}
    for key, value in spec.items():
        if key in _IGNORED_MACHINE_FIELDS or value is None or value == "":
            continue
        if key == "deletion" and is_object(value):
            value = {k: v for k, v in value.items() if k not in _IGNORED_DELETION_FIELDS}
            if not value:
                continue
        cleaned[key] = value
    return cleaned


def is_control_plane(machine: Mapping[str, Any]) -> bool:
    labels = get_in(machine, ("metadata", "labels"))
    return is_object(labels) and CONTROL_PLANE_LABEL in labels
