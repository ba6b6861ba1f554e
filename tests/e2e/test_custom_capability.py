"""A user-defined capability end to end: a role shipped in a temp dir, declared in a --capabilities-file,
claimed by CanUpdateMachineSet and carried out through UpdateMachine by the real service on a lab host."""

from __future__ import annotations

from pathlib import Path

import pytest
from hostlab.lab import Host, Lab
from hostlab.pytest_plugin import WriteInventory

from .capi import NodeSpec, can_update_machine_set, poll_update_machine
from .conftest import START_VERSION, StartService
from .hostcheck import run_on, stamp_writes

pytestmark = pytest.mark.lab

MACHINE = "md-0-osimg"
MARKER = "/tmp/e2e-os-image-pwned"
CHECK_COPY = "/var/tmp/e2e-health-check-copy"
PAYLOAD = f"https://images.example/os-{{{{ lookup('pipe','touch {MARKER}') }}}}-$(touch {MARKER}2).qcow2"
ROLE_TASKS = """\
---
- name: Record the OS image URL
  ansible.builtin.copy:
    content: "{{ os_image_values['/image/url'] }}\\n"
    dest: /etc/os-image-url
    owner: root
    group: root
    mode: "0644"
"""


def node(url: str) -> NodeSpec:
    return NodeSpec(START_VERSION, infrastructure={"kind": "Metal3Machine", "spec": {"image": {"url": url}}})


def capabilities_file(tmp_path: Path) -> Path:
    tasks = tmp_path / "user-roles" / "os_image" / "tasks"
    tasks.mkdir(parents=True)
    (tasks / "main.yml").write_text(ROLE_TASKS)
    path = tmp_path / "capabilities.yaml"
    path.write_text(
        "capabilities:\n"
        "  - name: os_image\n"
        "    role: os_image\n"
        f"    roles_path: {tmp_path / 'user-roles'}\n"
        "    claims:\n"
        "      - {kind: Metal3Machine, pointer: /image/url}\n"
        # a command check of the health gate: runs on the host after the role, before the stamp
        "health_checks:\n"
        f"  - {{name: image_recorded, command: [cp, /etc/os-image-url, {CHECK_COPY}]}}\n"
    )
    return path


def test_custom_role_from_a_capabilities_file_updates_the_host(
    lab: Lab, nodes: list[Host], lab_inventory: WriteInventory, start_service: StartService, tmp_path: Path
) -> None:
    host = nodes[0]
    caps = capabilities_file(tmp_path)
    service = start_service(lab_inventory([MACHINE]), extra_args=["--capabilities-file", str(caps)])
    old, new = node("https://images.example/os-v1.qcow2"), node(PAYLOAD)
    can_update_machine_set(service.client, old, new)  # asserts CAPI would update in place
    polled = poll_update_machine(service.client, MACHINE, new)
    assert (polled.status, polled.message) == ("Success", "update applied"), polled.messages
    # the user's role ran on the host with the claimed value, literally: never templated, never shelled
    assert run_on(lab, host, ["cat", "/etc/os-image-url"]) == PAYLOAD + "\n"
    # serve handed the file's command check to the play, which ran it after the role
    assert run_on(lab, host, ["cat", CHECK_COPY]) == PAYLOAD + "\n"
    assert run_on(lab, host, ["sh", "-c", f"ls {MARKER}* 2>/dev/null || true"]) == ""
    assert not Path(MARKER).exists() and not Path(MARKER + "2").exists()
    assert len(stamp_writes(lab, host)) == 1
    assert PAYLOAD not in service.log()  # request strings are never logged
    # CAPI calls again after completion: done at once, nothing re-applied
    again = poll_update_machine(service.client, MACHINE, new)
    assert (again.status, again.calls) == ("Success", 1)
    assert len(stamp_writes(lab, host)) == 1
