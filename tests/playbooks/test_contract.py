"""The playbooks match the Python capability table (no lab needed).

inplace_extension.inplace.capabilities.CAPABILITIES is the one table of capabilities and their role inputs;
each role's meta/argument_specs.yml must declare exactly those inputs (names, types, required, element
types, dict options, no_log), and update_machine.yml must run the roles in the table's order.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from inplace_extension.inplace.capabilities import CAPABILITIES
from inplace_extension.inplace.shipped import SHIPPED
from inplace_extension.plays.steps import HEALTH_TASK, JOINT_STEPS, JOINT_TASK

PLAYBOOKS = Path(__file__).resolve().parents[2] / "playbooks"
SPEC_KEYS = ("type", "required", "elements", "options", "no_log")


def normalise(option: dict[str, Any]) -> dict[str, Any]:
    """An argument_specs option reduced to what InputSpec.to_argument_spec() states."""
    spec: dict[str, Any] = {
        "type": option.get("type", "str"),
        "required": bool(option.get("required", False)),
    }
    if "elements" in option:
        spec["elements"] = option["elements"]
    if option.get("options"):
        spec["options"] = {name: normalise(sub) for name, sub in option["options"].items()}
    if option.get("no_log"):
        spec["no_log"] = True
    return spec


def role_options(role: str) -> dict[str, Any]:
    data = yaml.safe_load((PLAYBOOKS / "roles" / role / "meta" / "argument_specs.yml").read_text())
    options: dict[str, Any] = data["argument_specs"]["main"]["options"]
    return options


@pytest.mark.parametrize("capability", CAPABILITIES, ids=[c.name for c in CAPABILITIES])
def test_argument_specs_declare_the_capability_inputs(capability: Any) -> None:
    options = role_options(capability.name)
    assert sorted(options) == sorted(capability.inputs), "role inputs differ from the capability table"
    for name, input_spec in capability.inputs.items():
        assert normalise(options[name]) == input_spec.to_argument_spec(), name
        assert name.startswith(f"{capability.name}_"), "role inputs are named <capability>_<input>"


def test_every_role_is_a_capability_and_has_the_standard_layout() -> None:
    roles = sorted(p.name for p in (PLAYBOOKS / "roles").iterdir() if p.is_dir())
    assert roles == sorted([*(c.name for c in CAPABILITIES), *SHIPPED])
    for role in roles:
        parts = ["defaults/main.yml", "meta/argument_specs.yml", "tasks/main.yml"]
        parts += [] if role in SHIPPED else ["handlers/main.yml"]
        for part in parts:
            assert (PLAYBOOKS / "roles" / role / part).is_file(), f"{role}/{part}"


def test_shipped_roles_take_exactly_their_values_from_the_custom_step() -> None:
    # tasks/custom_capability.yml sets <name>_values; each role reads <name>_settings from the inputs
    for role in SHIPPED:
        data = yaml.safe_load((PLAYBOOKS / "roles" / role / "meta" / "argument_specs.yml").read_text())
        assert list(data["argument_specs"]["main"]["options"]) == [f"{role}_values"]
        tasks = (PLAYBOOKS / "roles" / role / "tasks" / "main.yml").read_text()
        assert f"update_machine_inputs.{role}.{role}_settings" in tasks


def test_playbook_runs_the_roles_in_table_order() -> None:
    [play] = yaml.safe_load((PLAYBOOKS / "update_machine.yml").read_text())
    order = [c.name for c in CAPABILITIES]
    assert play["vars"]["update_machine_known_capabilities"] == order
    [block] = [t for t in play["tasks"] if "block" in t]
    # imported (static: no include task per host) where the role is one module, included where a
    # skipped step would otherwise cost a skipped result per task of its role (kubernetes_version)
    steps = [
        (t, t.get("ansible.builtin.import_role") or t.get("ansible.builtin.include_role"))
        for t in block["block"]
    ]
    roles = [(task, role) for task, role in steps if role is not None]
    assert [role["name"] for _, role in roles] == order
    included = [role["name"] for task, role in roles if "ansible.builtin.include_role" in task]
    assert included == ["kubernetes_version"]
    for task, role_call in roles:
        # the role's own argument-spec validation as a run by hand has it, off with the service's
        # --skip-tags update_machine_recheck (the service validated the same inputs in Python)
        assert role_call["rolespec_validate"] == "{{ update_machine_role_checks }}"
        role = role_call["name"]
        # each role gets exactly its inputs, read from the inputs file; a role whose one module can
        # write the play's stamp after its work also gets that (<role>_host_stamp, ours, no input),
        # and the lock before its work (<role>_host_lock)
        riders = {f"{role}_host_stamp": "stamp", f"{role}_host_lock": "lock"}
        assert sorted(set(task["vars"]) - set(riders)) == sorted(role_options(role))
        for name, value in task["vars"].items():
            if name in riders:
                what = riders[name]
                assert role in play["vars"][f"update_machine_{what}_riders"]
                # the stamp: the step's entry of update_machine_stamp_for (the last step, or a first
                # step that took the lock when every step after it is unchanged)
                lock = f"update_machine_lock_rider if update_machine_lock_rides_on == '{role}' else None"
                stamp = f"update_machine_stamp_for.{role} | default(None)"
                expected = f"{{{{ {stamp if what == 'stamp' else lock} }}}}"
                assert str(value).strip() == expected
                continue
            assert f"update_machine_inputs.{role}.{name}" in str(value)
        # listed, and not skipped as applied with these inputs (the stamp's per-step fingerprints)
        # and, for the two steps the play may do in one module execution, not done by that one
        joint = ["not update_machine_joint"] if role in JOINT_STEPS else []
        assert task["when"] == [
            f"'{role}' in update_machine_capabilities",
            f"'{role}' not in update_machine_unchanged",
            *joint,
        ]
    # that execution: after the first step's role and before the second's, with exactly their inputs
    [joint_task] = [t for t in block["block"] if "inplace_joint_steps" in t]
    at = block["block"].index(joint_task)
    assert [role["name"] for task, role in roles if block["block"].index(task) < at] == order[:3]
    assert joint_task["name"] == JOINT_TASK
    files = joint_task["inplace_joint_steps"]["kubeadm_files"]
    assert files["files"] == "{{ update_machine_inputs.kubeadm_files.kubeadm_files_files }}"
    assert sorted(joint_task["vars"]) == sorted(role_options("kubelet_args"))
    flags = "{{ update_machine_inputs.kubelet_args.kubelet_args_extra_args }}"
    assert joint_task["vars"]["kubelet_args_extra_args"] == flags
    # the lock is released whatever happens inside the block
    assert [t["inplace_host_state"]["state"] for t in block["always"]] == ["unlocked"]


def test_user_defined_roles_run_after_the_built_ins_with_inputs_from_the_inputs_file() -> None:
    [play] = yaml.safe_load((PLAYBOOKS / "update_machine.yml").read_text())
    [block] = [t for t in play["tasks"] if "block" in t]
    names = [next(k for k in t if k.startswith(("ansible.builtin.", "inplace_"))) for t in block["block"]]
    # built-ins, then the custom steps, then the health gate's command checks, then the stamp: neither a
    # custom role nor a check may run after the stamp
    assert names[-3:] == ["ansible.builtin.include_tasks", "inplace_health_commands", "inplace_host_state"]
    # the service names the phase by this task (inplace_extension/plays/steps.py)
    assert block["block"][-2]["name"] == HEALTH_TASK
    checks = block["block"][-2]["inplace_health_commands"]
    # the argv lists are read out of a file (lookup + from_json: untrusted, never templated)
    assert checks["checks"] == "{{ lookup('ansible.builtin.file', update_machine_health_file) | from_json }}"
    custom = block["block"][-3]
    assert custom["ansible.builtin.include_tasks"] == "tasks/custom_capability.yml"
    assert custom["loop"] == "{{ update_machine_custom | default([]) }}"
    assert "when" not in custom  # update_machine_custom lists exactly the steps to run
    drain_point, set_fact, include = yaml.safe_load(
        (PLAYBOOKS / "tasks" / "custom_capability.yml").read_text()
    )
    # a user-defined step can be the first disruptive one: the drain point comes before its inputs and role
    assert drain_point["ansible.builtin.include_tasks"] == "drain_point.yml"
    assert drain_point["when"] == (
        "update_machine_drain_before | default('') == update_machine_step.capability"
        " and update_machine_drain_due"
    )
    # a step the stamp shows applied with these inputs is skipped, its drain point is not
    for task in (set_fact, include):
        assert task["when"] == "update_machine_step.capability not in update_machine_unchanged"
    [(key, value)] = set_fact["ansible.builtin.set_fact"].items()
    assert key == "{{ update_machine_step.capability }}_values"
    # the value is read out of the inputs document (lookup + from_json), never written into the task text
    assert value.strip().startswith("{{ update_machine_inputs[update_machine_step.capability]")
    assert set_fact["no_log"] is True
    assert include["ansible.builtin.include_role"] == {"name": "{{ update_machine_step.role }}"}
