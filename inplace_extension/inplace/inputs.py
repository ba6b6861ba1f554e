"""Role inputs: their declared types (the Python side of each role's ``meta/argument_specs.yml``) and how
the UpdateMachine plan reads them from the desired objects.

Input names are ``<capability>_<input>`` (architecture.md). Extractors read only the fields their
capability claims; in particular nothing here reads ``joinConfiguration.discovery`` (bootstrap tokens).
Invalid values raise PlanError naming the field path, never the value.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from inplace_extension.errors import LocatedError
from inplace_extension.inplace.entries import (
    EntryInvalid,
    EntrySkipped,
    effective_kubelet_args,
    entries_of,
    holds_template,
    parse_kubelet_arg,
    parse_ntp,
    parse_user,
)
from inplace_extension.inplace.files import parse_file
from inplace_extension.inplace.pointers import MISSING, get_in
from inplace_extension.inplace.versions import parse_version

InputType = Literal["str", "bool", "int", "list", "dict"]  # Ansible argument_spec type names


@dataclass(frozen=True)
class InputSpec:
    """One role input (or one key of a dict input), in Ansible argument_spec terms."""

    type: InputType
    required: bool = False
    elements: InputType | None = None  # element type when ``type`` is list
    options: Mapping[str, InputSpec] = field(default_factory=dict)  # keys of a dict / of dict elements
    no_log: bool = False

    def to_argument_spec(self) -> dict[str, Any]:
        """This spec as it appears under ``options:`` in a role's ``meta/argument_specs.yml``."""
        spec: dict[str, Any] = {"type": self.type, "required": self.required}
        if self.elements is not None:
            spec["elements"] = self.elements
        if self.options:
            spec["options"] = {name: option.to_argument_spec() for name, option in self.options.items()}
        if self.no_log:
            spec["no_log"] = True
        return spec


class PlanError(LocatedError):
    """A desired value the plan cannot turn into role inputs: ``where`` names the field, never its value."""


@dataclass(frozen=True)
class DesiredObjects:
    """The desired state the built-in capabilities read, with the paths PlanError messages name: an
    UpdateMachine request's (the defaults), or an MCM MachineClass's ``providerSpec.inPlaceUpdate``."""

    machine_spec: Mapping[str, Any]
    control_plane: bool
    bootstrap_spec: Mapping[str, Any] | None  # None unless the bootstrap config is a KubeadmConfig
    version_path: str = "desired.machine.spec.version"
    bootstrap_path: str = "desired.bootstrapConfig.spec"


def extract_kubernetes_version(desired: DesiredObjects) -> dict[str, Any] | None:
    value = desired.machine_spec.get("version", MISSING)
    if value is MISSING:
        return None
    version = parse_version(value)
    if version is None:
        raise PlanError(desired.version_path, "not a Kubernetes version like v1.31.0")
    return {
        "kubernetes_version_target": str(version),
        "kubernetes_version_control_plane": desired.control_plane,
    }


def extract_kubeadm_files(desired: DesiredObjects) -> dict[str, Any] | None:
    value = _bootstrap_value(desired, ("files",))
    if value is MISSING:
        return None
    files = []
    for index, entry in enumerate(_entries(value, f"{desired.bootstrap_path}.files")):
        if holds_template(entry):
            continue  # rendered by cloud-init at bootstrap; CanUpdate declined any change of it
        try:
            files.append(parse_file(entry).as_input())
        except EntrySkipped:
            continue  # contentFrom or non-text content: written at bootstrap, not ours to manage
        except EntryInvalid as exc:
            raise _plan_error(f"{desired.bootstrap_path}.files[{index}]", exc) from None
    return {"kubeadm_files_files": files}


def extract_kubelet_args(desired: DesiredObjects) -> dict[str, Any] | None:
    if desired.bootstrap_spec is None:
        return None
    tokens, value = effective_kubelet_args(desired.bootstrap_spec)
    if tokens is None:
        return None
    path = desired.bootstrap_path + "".join("." + token for token in tokens)
    args = []
    for index, entry in enumerate(_entries(value, path)):
        if holds_template(entry):
            continue  # kubelet keeps the value kubeadm rendered at join (kubeadm-flags.env)
        try:
            args.append(parse_kubelet_arg(entry))
        except EntryInvalid as exc:
            raise _plan_error(f"{path}[{index}]", exc) from None
    return {"kubelet_args_extra_args": args}


def extract_users(desired: DesiredObjects) -> dict[str, Any] | None:
    value = _bootstrap_value(desired, ("users",))
    if value is MISSING:
        return None
    users: list[dict[str, Any]] = []
    for index, entry in enumerate(_entries(value, f"{desired.bootstrap_path}.users")):
        if holds_template(entry):
            continue  # rendered by cloud-init at bootstrap; CanUpdate declined any change of it
        try:
            user = parse_user(entry)
        except EntrySkipped:
            continue  # passwdFrom: its password lives in a Secret we do not read
        except EntryInvalid as exc:
            raise _plan_error(f"{desired.bootstrap_path}.users[{index}]", exc) from None
        if any(other["name"] == user["name"] for other in users):
            raise PlanError(f"{desired.bootstrap_path}.users[{index}].name", "repeats an earlier user")
        users.append(user)
    return {"users_users": users}


def extract_ntp(desired: DesiredObjects) -> dict[str, Any] | None:
    value = _bootstrap_value(desired, ("ntp",))
    if value is MISSING or holds_template(value):
        return None
    try:
        return parse_ntp(value)
    except EntrySkipped:
        return None
    except EntryInvalid as exc:
        raise _plan_error(f"{desired.bootstrap_path}.ntp", exc) from None


def _bootstrap_value(desired: DesiredObjects, tokens: tuple[str, ...]) -> Any:
    return MISSING if desired.bootstrap_spec is None else get_in(desired.bootstrap_spec, tokens)


def _entries(value: Any, path: str) -> list[Any]:
    try:
        return entries_of(value)
    except EntryInvalid as exc:
        raise PlanError(path, exc.problem) from None


def _plan_error(path: str, exc: EntryInvalid) -> PlanError:
    return PlanError(f"{path}.{exc.where}" if exc.where else path, exc.problem)
