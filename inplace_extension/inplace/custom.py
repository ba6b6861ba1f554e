"""User-defined capabilities (docs/capabilities.md): claims of kind + pointer carried out by a user's role.

They are data: the start-up loader (``inplace_extension/capabilities_file.py``) reads them from the
``--capabilities-file`` YAML and hands a :class:`CustomTable` to the decision and plan functions, so this
module stays pure (no file, no globals). A custom claim is guarded by nothing but presence: the user's
role says it can set the value, so a changed value is claimed; a removed one is not (a role is given
values, it cannot know what "unset" means on the host), and that change is declined to a rollout.

Kinds and templates: a claim names the machine-level kind (``Metal3Machine``, ``KubeadmConfig``,
``Machine``) and its pointer is relative to that object's ``/spec``; the same claim applies to the
template shape (``Metal3MachineTemplate``, ``KubeadmConfigTemplate``, and ``MachineSet`` for ``Machine``)
at ``/spec/template/spec``, exactly like the built-in claims. Role inputs: one variable
``<name>_values`` = ``{pointer: desired value}`` with the claimed pointers present in the desired objects.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

from inplace_extension.errors import LocatedError
from inplace_extension.inplace.cel import Expression
from inplace_extension.inplace.entries import TEMPLATE_PROBLEM, holds_template
from inplace_extension.inplace.pointers import MISSING, get_in, is_under, parse_pointer


class Disruption(enum.IntEnum):
    """What carrying out a capability does to the node, in rising order (compare with ``>=``).

    Declared per capability in the capabilities table (``inplace/capabilities.py``) and, for
    user-defined ones, in the capabilities file. Defined here, beside the user-defined table, so both
    tables share it without an import cycle.
    """

    NONE = 0  # workloads keep running untouched (users, ntp, most files)
    RESTART_KUBELET = 1  # the kubelet restarts (flags, upgrade): the node is drained first
    REBOOT = 2  # the node goes down (declared by user roles)

    @property
    def label(self) -> str:
        """The spelling in the capabilities file, logs and docs: ``none``, ``restart-kubelet``, ``reboot``."""
        return self.name.lower().replace("_", "-")

    @classmethod
    def parse(cls, label: str) -> Disruption:
        for member in cls:
            if member.label == label:
                return member
        raise ValueError(f"unknown disruption class {label!r}; known: {', '.join(m.label for m in cls)}")


# The one kind whose template shape is not "<kind>Template" (CAPI's MachineSet carries a Machine template).
_TEMPLATE_OF: Final = {"Machine": "MachineSet"}


def template_kind(kind: str) -> str:
    """The template shape of a machine-level kind: ``Metal3Machine`` -> ``Metal3MachineTemplate``."""
    return _TEMPLATE_OF.get(kind, kind + "Template")


@dataclass(frozen=True)
class CustomClaim:
    kind: str  # machine-level kind; the template kind is template_kind(kind)
    pointer: str  # relative to the object's spec (template: /spec/template/spec), e.g. "/image/url"
    # or a Machine annotation: read by the UpdateMachine plan only (CAPI never compares annotations, so
    # no CanUpdate call sees it); its key in <name>_values is /metadata/annotations/<escaped name>
    annotation: str | None = None
    tokens: tuple[str, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "tokens", parse_pointer(self.pointer) if self.annotation is None else ())

    @property
    def key(self) -> str:
        """The claim's key in ``<name>_values``."""
        if self.annotation is None:
            return self.pointer
        return "/metadata/annotations/" + self.annotation.replace("~", "~0").replace("/", "~1")


class ValueRule(Protocol):
    """What a shipped capability (os_update, kubelet_credentials) adds to a custom one: a guard on the
    claimed value and settings for its role, both from the capabilities file."""

    def problem(self, value: Any) -> str | None:
        """Why this value cannot be carried out (value-free message), or None."""

    def settings(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """``<name>_settings`` for the role, from the checked ``<name>_values``."""


@dataclass(frozen=True)
class CustomCapability:
    name: str  # capability name: run order label, plan step, inputs-file key, prefix of its variable
    role: str  # the user's Ansible role
    roles_path: str  # absolute directory holding the role (goes into ANSIBLE_ROLES_PATH)
    claims: tuple[CustomClaim, ...]
    # the file's ``disruption``; unknown roles may reboot, so the file's default is the safe ``reboot``
    disruption: Disruption = Disruption.REBOOT
    rule: ValueRule | None = None  # shipped capabilities only

    @property
    def input_name(self) -> str:
        return f"{self.name}_values"


@dataclass(frozen=True)
class ObjectCheck:
    """What a ``kubernetes`` health check reads and what must hold of it: the object ``name`` (or every
    object carrying the ``selector`` labels) of ``api_version``/``kind``, in ``namespace`` (None: a
    cluster-scoped kind), and a CEL expression over each (``object``); how long an update not started
    yet waits for it before it fails (``start_timeout_seconds``; None: as long as it takes)."""

    api_version: str  # "ceph.rook.io/v1", "apps/v1", "v1"
    kind: str
    namespace: str | None
    name: str | None  # None: every object matching ``selector``
    selector: tuple[tuple[str, str], ...]  # label key, value: all must match
    expression: Expression
    resource: str | None = None  # the kind's plural resource name when the adapter cannot derive it
    start_timeout_seconds: int | None = None  # the file's ``timeout``

    @property
    def target(self) -> str:
        """The objects in words, for messages: ``CephCluster rook-ceph/ceph``, ``StatefulSet with app=db
        in db``."""
        if self.name is not None:
            return (
                f"{self.kind} {self.namespace}/{self.name}" if self.namespace else f"{self.kind} {self.name}"
            )
        labels = ",".join(f"{key}={value}" for key, value in self.selector)
        where = f" in {self.namespace}" if self.namespace else ""
        return f"{self.kind} with {labels}{where}"


@dataclass(frozen=True)
class HealthCheck:
    """A user-defined check of the health gate: an HTTP GET that must answer ``status`` (``url``;
    Kubernetes-aware mode; ``{address}`` is the Machine's host address, the one SSH used), a command
    run on the host by the play before the stamp that must exit 0 (``command``, an argv; every mode), or
    a CEL expression that must hold of cluster objects before an update starts and after it ends
    (``kubernetes``; Kubernetes-aware mode and the MCM agent)."""

    name: str
    url: str = ""  # "" for a command or kubernetes check
    status: int = 200
    timeout_seconds: float = 5.0  # per request / per try
    command: tuple[str, ...] = ()  # argv, no shell; () for an HTTP or kubernetes check
    kubernetes: ObjectCheck | None = None


@dataclass(frozen=True)
class CustomTable:
    """The user-defined capabilities in file (= run) order, indexed by the kind strings they claim."""

    capabilities: tuple[CustomCapability, ...] = ()
    health_checks: tuple[HealthCheck, ...] = ()  # the health gate's user-defined checks, in file order
    _by_kind: Mapping[tuple[str, bool], tuple[tuple[CustomCapability, CustomClaim], ...]] = field(
        init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        by_kind: dict[tuple[str, bool], list[tuple[CustomCapability, CustomClaim]]] = {}
        for capability in self.capabilities:
            for claim in capability.claims:
                if claim.annotation is not None:
                    continue  # read by the plan only
                by_kind.setdefault((claim.kind, False), []).append((capability, claim))
                by_kind.setdefault((template_kind(claim.kind), True), []).append((capability, claim))
        object.__setattr__(self, "_by_kind", {kind: tuple(pairs) for kind, pairs in by_kind.items()})

    def __bool__(self) -> bool:
        return bool(self.capabilities)

    @property
    def http_checks(self) -> tuple[HealthCheck, ...]:
        """The checks the service's health gate runs after the play (Kubernetes-aware mode)."""
        return tuple(check for check in self.health_checks if check.url)

    @property
    def object_checks(self) -> tuple[HealthCheck, ...]:
        """The checks of cluster objects, before each update starts and after it ends."""
        return tuple(check for check in self.health_checks if check.kubernetes is not None)

    @property
    def command_checks(self) -> tuple[HealthCheck, ...]:
        """The checks the play runs on the host before it writes the stamp (every mode)."""
        return tuple(check for check in self.health_checks if check.command)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(capability.name for capability in self.capabilities)

    @property
    def roles_paths(self) -> tuple[str, ...]:
        """Distinct roles directories in first-use order."""
        # shipped roles (roles_path "") live in the playbook's own roles/, which Ansible searches anyway
        return tuple(dict.fromkeys(c.roles_path for c in self.capabilities if c.roles_path))

    def disruption_of(self, name: str) -> Disruption:
        """The class of the user-defined capability ``name`` (KeyError when there is none)."""
        for capability in self.capabilities:
            if capability.name == name:
                return capability.disruption
        raise KeyError(name)

    def claims_for(self, kind: str, template: bool) -> tuple[tuple[CustomCapability, CustomClaim], ...]:
        """(capability, claim) pairs for an object of ``kind`` in this shape (template or not), file order.

        An object only matches in its own shape: a ``Metal3Machine`` where a template is expected (or the
        reverse) is claimed by nothing, so the change is declined rather than read at the wrong root.
        """
        return self._by_kind.get((kind, template), ())


NO_CUSTOM: Final = CustomTable()


# Kinds whose spec becomes cloud-init user data, where "{{ ... }}" is a template rendered at bootstrap;
# anywhere else (a Metal3Machine image URL) it is plain text and passed on as such.
BOOTSTRAP_DATA_KINDS: Final = frozenset({"KubeadmConfig"})


def removal_problem(desired: Any, kind: str) -> str | None:
    """The guard of every custom claim (on ``kind``): a value the role can set, not a removal."""
    if desired is MISSING:
        return "the field is removed; a user-defined capability only sets values"
    if kind in BOOTSTRAP_DATA_KINDS and holds_template(desired):
        return f"the desired value {TEMPLATE_PROBLEM}"
    return None


class CustomValueError(LocatedError):
    """A claimed value a shipped capability's rule refuses; ``where`` names the field, never the value."""


def extract_values(
    capability: CustomCapability,
    specs: Mapping[str, Mapping[str, Any]],
    annotations: Mapping[str, Any] | None = None,
) -> dict[str, Any] | None:
    """``{<name>_values: {key: value}}`` (and ``<name>_settings`` with a rule) from the desired specs by
    kind and the desired Machine's annotations, or None when none is present."""
    values: dict[str, Any] = {}
    for claim in capability.claims:
        if claim.annotation is not None:
            value = (annotations or {}).get(claim.annotation, MISSING)
        else:
            spec = specs.get(claim.kind)
            if spec is None:
                continue
            value = get_in(spec, claim.tokens)
        # a templated value stays as cloud-init rendered it at bootstrap (a change of it is declined)
        if value is not MISSING and not (claim.kind in BOOTSTRAP_DATA_KINDS and holds_template(value)):
            problem = capability.rule.problem(value) if capability.rule is not None else None
            if problem is not None:
                raise CustomValueError(f"{claim.kind} {claim.key}", problem)
            values[claim.key] = value
    if not values:
        return None
    if capability.rule is None:
        return {capability.input_name: values}
    return {capability.input_name: values, f"{capability.name}_settings": capability.rule.settings(values)}


def overlap_problems(
    custom: Iterable[CustomCapability], builtin: Mapping[str, Iterable[str]], builtin_names: Iterable[str]
) -> list[tuple[tuple[str | int, ...], str]]:
    """Why a set of custom capabilities cannot be used together with the built-ins (empty = fine).

    Each problem is (location in the file as ``("capabilities", index, ...)``, message).

    ``builtin`` maps a machine-level kind to the pointers built-in capabilities claim on it. Two claims on
    overlapping pointers of one kind would both copy the field, and the run order could not say which
    role wins; a name or role equal to a built-in one would shadow it in the playbook.
    """
    problems: list[tuple[tuple[str | int, ...], str]] = []
    reserved = set(builtin_names)
    seen: dict[str, str] = {}  # name -> where first declared
    claimed: list[tuple[str, str, str]] = [
        (kind, pointer, "built-in") for kind, pointers in builtin.items() for pointer in pointers
    ]
    for index, capability in enumerate(custom):
        where: tuple[str | int, ...] = ("capabilities", index)
        if capability.name in reserved:
            problems.append(((*where, "name"), f"{capability.name!r} is a built-in capability"))
        if capability.role in reserved:
            problems.append(((*where, "role"), f"{capability.role!r} is the role of a built-in capability"))
        if capability.name in seen:
            problems.append(
                ((*where, "name"), f"{capability.name!r} is already declared by {seen[capability.name]}")
            )
        seen.setdefault(capability.name, f"capabilities[{index}]")
        pointers: set[str] = set()
        for number, claim in enumerate(capability.claims):
            claim_where = (*where, "claims", number, "pointer")
            if claim.annotation is not None:
                continue  # shipped capabilities only; an annotation is no spec field to overlap
            if not claim.tokens:
                problems.append((claim_where, "must name a field below the spec, not the spec"))
            elif claim.pointer in pointers:
                # <name>_values is keyed by pointer: the same pointer twice would lose a value
                problems.append((claim_where, f"{claim.pointer} is already claimed by this capability"))
            else:
                for kind, pointer, owner in claimed:
                    if kind == claim.kind and (
                        is_under(claim.pointer, pointer) or is_under(pointer, claim.pointer)
                    ):
                        problems.append(
                            (
                                claim_where,
                                f"{claim.kind} {claim.pointer} overlaps {pointer}, claimed by {owner}",
                            )
                        )
            pointers.add(claim.pointer)
            claimed.append((claim.kind, claim.pointer, capability.name))
    return problems
