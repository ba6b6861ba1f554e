"""User-defined capabilities: claims of kind + pointer carried out by a role the user ships (design.md §2).

They are data: the start-up loader (``extension/capabilities_file.py``) reads them from the
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

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from extension.inplace.pointers import MISSING, get_in, is_under, parse_pointer

# The one kind whose template shape is not "<kind>Template" (CAPI's MachineSet carries a Machine template).
_TEMPLATE_OF: Final = {"Machine": "MachineSet"}


def template_kind(kind: str) -> str:
    """The template shape of a machine-level kind: ``Metal3Machine`` -> ``Metal3MachineTemplate``."""
    return _TEMPLATE_OF.get(kind, kind + "Template")


@dataclass(frozen=True)
class CustomClaim:
    kind: str  # machine-level kind; the template kind is template_kind(kind)
    pointer: str  # relative to the object's spec (template: /spec/template/spec), e.g. "/image/url"
    tokens: tuple[str, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "tokens", parse_pointer(self.pointer))


@dataclass(frozen=True)
class CustomCapability:
    name: str  # capability name: run order label, plan step, inputs-file key, prefix of its variable
    role: str  # the user's Ansible role
    roles_path: str  # absolute directory holding the role (goes into ANSIBLE_ROLES_PATH)
    claims: tuple[CustomClaim, ...]

    @property
    def input_name(self) -> str:
        return f"{self.name}_values"


@dataclass(frozen=True)
class CustomTable:
    """The user-defined capabilities in file (= run) order, indexed by the kind strings they claim."""

    capabilities: tuple[CustomCapability, ...] = ()
    _by_kind: Mapping[tuple[str, bool], tuple[tuple[CustomCapability, CustomClaim], ...]] = field(
        init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        by_kind: dict[tuple[str, bool], list[tuple[CustomCapability, CustomClaim]]] = {}
        for capability in self.capabilities:
            for claim in capability.claims:
                by_kind.setdefault((claim.kind, False), []).append((capability, claim))
                by_kind.setdefault((template_kind(claim.kind), True), []).append((capability, claim))
        object.__setattr__(self, "_by_kind", {kind: tuple(pairs) for kind, pairs in by_kind.items()})

    def __bool__(self) -> bool:
        return bool(self.capabilities)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(capability.name for capability in self.capabilities)

    @property
    def roles_paths(self) -> tuple[str, ...]:
        """Distinct roles directories in first-use order."""
        return tuple(dict.fromkeys(capability.roles_path for capability in self.capabilities))

    def claims_for(self, kind: str, template: bool) -> tuple[tuple[CustomCapability, CustomClaim], ...]:
        """(capability, claim) pairs for an object of ``kind`` in this shape (template or not), file order.

        An object only matches in its own shape: a ``Metal3Machine`` where a template is expected (or the
        reverse) is claimed by nothing, so the change is declined rather than read at the wrong root.
        """
        return self._by_kind.get((kind, template), ())


NO_CUSTOM: Final = CustomTable()


def removal_problem(desired: Any) -> str | None:
    """The guard of every custom claim: a value the role can set, not a removal."""
    if desired is MISSING:
        return "the field is removed; a user-defined capability only sets values"
    return None


def extract_values(
    capability: CustomCapability, specs: Mapping[str, Mapping[str, Any]]
) -> dict[str, Any] | None:
    """``{<name>_values: {pointer: value}}`` from the desired specs by kind, or None when none is present."""
    values: dict[str, Any] = {}
    for claim in capability.claims:
        spec = specs.get(claim.kind)
        if spec is None:
            continue
        value = get_in(spec, claim.tokens)
        if value is not MISSING:
            values[claim.pointer] = value
    return {capability.input_name: values} if values else None


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
