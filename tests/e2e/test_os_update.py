"""The shipped os_update capability end to end: the real service with a capabilities file, CAPI's calls,
a lab host with the STAND-IN update command and version reader (tests/playbooks/shipped.py) and
hostlab's reboot stand-in. What CAPI sees: ``update applied``, or the terminal ``Rolled back to <version>``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hostlab.hosts import boot_id
from hostlab.lab import Host, Lab
from hostlab.pytest_plugin import WriteInventory
from playbooks.shipped import CAPABILITIES_FILE, install_os_update_standin, set_mode, standin_calls

from .capi import NodeSpec, can_update_machine_set, poll_update_machine
from .conftest import START_VERSION, StartService

pytestmark = pytest.mark.lab

MACHINE = "md-0-osupd"
OLD, NEW = "https://images.example/os-1.0.0.qcow2", "https://images.example/os-1.2.0.qcow2"


def node(url: str) -> NodeSpec:
    return NodeSpec(START_VERSION, infrastructure={"kind": "Metal3Machine", "spec": {"image": {"url": url}}})


@pytest.mark.parametrize(
    ("mode", "status", "message"),
    [
        ("ok", "Success", "update applied"),
        ("rollback", "Failure", 'os_update: task "Rolled back to 1.0.0" failed on host'),
    ],
)
def test_os_update_through_the_service(
    lab: Lab,
    nodes: list[Host],
    lab_inventory: WriteInventory,
    start_service: StartService,
    tmp_path: Path,
    mode: str,
    status: str,
    message: str,
) -> None:
    host = nodes[0]
    install_os_update_standin(lab, host, booted="1.0.0")
    set_mode(lab, host, mode)
    caps = tmp_path / "capabilities.yaml"
    caps.write_text(CAPABILITIES_FILE % {"retries": 1})
    service = start_service(lab_inventory([MACHINE]), extra_args=["--capabilities-file", str(caps)])
    before = boot_id(host)
    can_update_machine_set(service.client, node(OLD), node(NEW))  # asserts CAPI would update in place
    polled = poll_update_machine(service.client, MACHINE, node(NEW))
    assert (polled.status, polled.message) == (status, message), polled.messages
    assert boot_id(host) != before  # rebooted either way
    assert standin_calls(lab, host) == [f"--image {NEW} --version 1.2.0"]
    assert NEW not in service.log()
