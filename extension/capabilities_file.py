"""The ``--capabilities-file``: user-defined capabilities (design.md §2), its model, loading and errors.

Read once at start-up by ``extension.cli`` (``serve`` and ``plan``); a bad file stops the service with a
message naming the file, the line and the field. The result is a pure
:class:`extension.inplace.custom.CustomTable` that the hooks pass to the decision and plan functions.
Its JSON Schema (``schemas/capabilities.schema.json``) is generated from :class:`CapabilitiesFile`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

from pydantic import BaseModel, ConfigDict, Field, field_validator

from extension.inplace.capabilities import CAPABILITIES, capability_names
from extension.inplace.custom import CustomCapability, CustomClaim, CustomTable, overlap_problems
from extension.yamlfile import locate, parse_model, read_file

# Capability and role names become Ansible variable prefixes (<name>_values) and role names, and the
# runs layer accepts only this shape for capability names (extension/runs/service.py).
NAME_PATTERN: Final = r"^[a-z][a-z0-9_]{0,62}$"
# RFC 6901: "/" then tokens, "~" only as the escapes ~0 and ~1.
POINTER_PATTERN: Final = r"^(/([^~/]|~[01])*)+$"
KIND_PATTERN: Final = r"^[A-Z][A-Za-z0-9]{0,62}$"


class CapabilitiesFileError(ValueError):
    """The capabilities file is missing, not YAML, invalid, or clashes with the built-ins."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ClaimEntry(_Strict):
    """One claimed field: the machine-level kind and a pointer relative to its ``/spec``."""

    kind: str = Field(
        pattern=KIND_PATTERN,
        description="machine-level kind (Metal3Machine, KubeadmConfig, Machine); the claim also applies "
        "to its template shape (Metal3MachineTemplate, KubeadmConfigTemplate, MachineSet)",
    )
    pointer: str = Field(
        pattern=POINTER_PATTERN,
        description="JSON pointer relative to the object's spec (template: spec.template.spec): /image/url",
    )

    @field_validator("kind")
    @classmethod
    def _machine_level(cls, value: str) -> str:
        if value.endswith("Template") or value == "MachineSet":
            raise ValueError(
                "name the machine-level kind (e.g. Metal3Machine, Machine); its claims apply to the "
                "template shape (Metal3MachineTemplate, MachineSet) as well"
            )
        return value


class CapabilityEntry(_Strict):
    """One user-defined capability: what it claims and the role that carries it out."""

    name: str = Field(pattern=NAME_PATTERN, description="capability name; the role gets <name>_values")
    role: str = Field(pattern=NAME_PATTERN, description="name of the Ansible role under roles_path")
    roles_path: Path = Field(description="absolute directory that holds the role")
    claims: list[ClaimEntry] = Field(min_length=1, description="claimed fields, in any kind")

    @field_validator("roles_path")
    @classmethod
    def _absolute(cls, value: Path) -> Path:
        if not value.is_absolute():
            raise ValueError("must be an absolute path")
        return value


class CapabilitiesFile(_Strict):
    """The ``--capabilities-file``: capabilities run after the built-ins, in this order."""

    capabilities: list[CapabilityEntry] = Field(default_factory=list)


def _builtin_claims() -> dict[str, list[str]]:
    claims: dict[str, list[str]] = {}
    for capability in CAPABILITIES:
        for claim in capability.claims:
            claims.setdefault(claim.kind.value, []).append(claim.pointer)
    return claims


def load_capabilities(path: Path) -> CustomTable:
    """Read, validate and check a capabilities file; errors name the file, the line and the field."""
    text = read_file(path, f"capabilities file {path}", CapabilitiesFileError)
    return parse_capabilities(text, str(path))


def parse_capabilities(text: str, source: str = "<capabilities>") -> CustomTable:
    model, node = parse_model(text, CapabilitiesFile, f"capabilities file {source}", CapabilitiesFileError)
    table = CustomTable(
        tuple(
            CustomCapability(
                name=entry.name,
                role=entry.role,
                roles_path=str(entry.roles_path),
                claims=tuple(CustomClaim(claim.kind, claim.pointer) for claim in entry.claims),
            )
            for entry in model.capabilities
        )
    )
    problems = [
        locate(node, loc, message)
        for loc, message in overlap_problems(table.capabilities, _builtin_claims(), capability_names())
    ]
    for index, entry in enumerate(model.capabilities):
        # checked here, not at the first UpdateMachine: a missing role would fail every run much later
        tasks = entry.roles_path / entry.role / "tasks"
        if not (tasks / "main.yml").is_file() and not (tasks / "main.yaml").is_file():
            problems.append(locate(node, ("capabilities", index, "role"), f"no role at {tasks.parent}"))
    if problems:
        raise CapabilitiesFileError(f"capabilities file {source}: " + "; ".join(problems))
    return table
