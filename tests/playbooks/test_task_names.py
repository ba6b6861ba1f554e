"""Task names reach CAPI's Failure message rendered (ansible-core fills their variables in), so a task
name may only template values the service checked or produced itself, never free request text."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

PLAYBOOKS = Path(__file__).resolve().parents[2] / "playbooks"
# validated before a run (versions, role and capability names) or cut to a safe alphabet by the role
ALLOWED = {
    "update_machine_step.capability",
    "update_machine_step.role",
    "kubernetes_version_minor",
    "kubernetes_version_packages",
    "kubernetes_version_target",
    "os_update_shown",
}
TEMPLATE = re.compile(r"{{\s*([A-Za-z_][A-Za-z0-9_.]*)")


def _task_names(node: object, in_list: bool = False) -> list[str]:
    """Names of tasks (dicts listed in a task list), not ``name:`` arguments of modules."""
    names: list[str] = []
    if isinstance(node, dict):
        if in_list and isinstance(node.get("name"), str):
            names.append(node["name"])
        for value in node.values():
            names.extend(_task_names(value))
    elif isinstance(node, list):
        for item in node:
            names.extend(_task_names(item, in_list=True))
    return names


def test_templated_task_names_use_only_checked_values() -> None:
    files = [f for f in PLAYBOOKS.rglob("*.yml") if "tasks" in f.parts or f.parent == PLAYBOOKS]
    assert len(files) > 5
    used: set[str] = set()
    for path in files:
        for name in _task_names(yaml.safe_load(path.read_text())):
            for variable in TEMPLATE.findall(name):
                assert variable in ALLOWED, f"{path}: task name {name!r} templates {variable}"
                used.add(variable)
    assert "kubernetes_version_target" in used  # the check really looked at the roles
