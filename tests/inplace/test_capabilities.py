"""The capabilities table: names, order, claims, and the role-input contract with the playbooks."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from inplace_extension.inplace.capabilities import CAPABILITIES, capability_names
from inplace_extension.inplace.entries import ARG_NAME, ARG_VALUE, NTP_SERVER, USER_NAME
from inplace_extension.inplace.inputs import InputSpec
from inplace_extension.inplace.objects import ClaimKind
from inplace_extension.inplace.plan import plan_update
from inplace_extension.inplace.pointers import parse_pointer

from .support import load

ROLES = Path(__file__).resolve().parents[2] / "playbooks" / "roles"
UPDATE_MACHINE_BODIES = (
    "capi/update_machine/6A.request.json",
    "capi/update_machine/6B.request.json",
    "requests/update_machine.worker_all_capabilities.request.json",
)
_PYTHON_TYPES: Mapping[str, type] = {
    "str": str,
    "bool": bool,
    "int": int,
    "list": list,
    "dict": dict,
}


def test_capabilities_are_in_the_documented_run_order() -> None:
    assert capability_names() == ("users", "ntp", "kubeadm_files", "kubelet_args", "kubernetes_version")


@pytest.mark.parametrize("capability", CAPABILITIES, ids=lambda c: c.name)
def test_capability_names_inputs_and_claims_are_well_formed(capability: Any) -> None:
    assert re.fullmatch(r"[a-z][a-z0-9_]*", capability.name)  # ansible-lint role-name rule
    assert capability.inputs
    assert all(name.startswith(capability.name + "_") for name in capability.inputs)
    assert capability.claims
    for claim in capability.claims:
        assert isinstance(claim.kind, ClaimKind)
        assert parse_pointer(claim.pointer)


def test_no_two_claims_overlap() -> None:
    pointers = [(c.kind, c.pointer) for cap in CAPABILITIES for c in cap.claims]
    assert len(pointers) == len(set(pointers))
    for kind, pointer in pointers:
        for other_kind, other in pointers:
            if kind is other_kind and pointer != other:
                assert not other.startswith(pointer + "/"), (pointer, other)


def _conforms(value: Any, spec: InputSpec, where: str) -> None:
    assert isinstance(value, _PYTHON_TYPES[spec.type]), where
    assert spec.type == "bool" or not isinstance(value, bool), f"{where}: bool where {spec.type} is declared"
    if isinstance(value, list) and spec.elements is not None:
        for index, item in enumerate(value):
            _conforms(item, InputSpec(spec.elements, options=spec.options), f"{where}[{index}]")
    if isinstance(value, dict) and spec.options:
        assert set(value) <= set(spec.options), f"{where}: undeclared keys {set(value) - set(spec.options)}"
        for key, option in spec.options.items():
            if option.required:
                assert key in value, f"{where}.{key} is required"
            if key in value:
                _conforms(value[key], option, f"{where}.{key}")


@pytest.mark.parametrize("path", UPDATE_MACHINE_BODIES)
def test_plan_inputs_conform_to_the_declared_input_types(path: str) -> None:
    plan = plan_update(load(path)["desired"])
    declared = {capability.name: capability.inputs for capability in CAPABILITIES}
    for step in plan.steps:
        assert set(step.inputs) == set(declared[step.capability])
        for name, value in step.inputs.items():
            _conforms(value, declared[step.capability][name], name)


def _normalise_argument_spec(spec: Mapping[str, Any]) -> dict[str, Any]:
    """An argument_specs option without prose, with Ansible's defaults made explicit."""
    result: dict[str, Any] = {"type": spec.get("type", "str"), "required": bool(spec.get("required", False))}
    if "elements" in spec:
        result["elements"] = spec["elements"]
    if "options" in spec:
        result["options"] = {
            name: _normalise_argument_spec(option) for name, option in spec["options"].items()
        }
    if spec.get("no_log"):
        result["no_log"] = True
    return result


@pytest.mark.parametrize("capability", CAPABILITIES, ids=lambda c: c.name)
def test_role_argument_specs_declare_exactly_the_capability_inputs(capability: Any) -> None:
    specs_file = ROLES / capability.name / "meta" / "argument_specs.yml"
    assert specs_file.is_file(), f"every capability needs a role: {specs_file} is missing"
    options = yaml.safe_load(specs_file.read_text())["argument_specs"]["main"]["options"]
    role_side = {name: _normalise_argument_spec(option) for name, option in options.items()}
    python_side = {name: spec.to_argument_spec() for name, spec in capability.inputs.items()}
    assert role_side == python_side


def test_input_spec_renders_ansible_argument_spec() -> None:
    spec = InputSpec(
        "list", required=True, elements="dict", options={"passwd": InputSpec("str", no_log=True)}
    )
    assert spec.to_argument_spec() == {
        "type": "list",
        "required": True,
        "elements": "dict",
        "options": {"passwd": {"type": "str", "required": False, "no_log": True}},
    }


@pytest.mark.parametrize(
    ("role", "variable", "pattern"),
    [
        ("users", "users_name_pattern", USER_NAME),
        ("kubelet_args", "kubelet_args_name_pattern", ARG_NAME),
        ("kubelet_args", "kubelet_args_value_pattern", ARG_VALUE),
        ("ntp", "ntp_server_pattern", NTP_SERVER),
    ],
)
def test_python_refuses_exactly_what_the_role_asserts(
    role: str, variable: str, pattern: re.Pattern[str]
) -> None:
    # A value the role refuses must never be claimed: CAPI would hand the machine over and the run fail.
    defaults = yaml.safe_load((ROLES / role / "defaults" / "main.yml").read_text())
    assert defaults[variable] == pattern.pattern
