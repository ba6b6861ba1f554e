"""The shipped os_update capability on a lab host: success with reboot, retriable, terminal, rolled back.

The OS update command and the booted-version reader are STAND-INS (shipped.py); the reboot is hostlab's
reboot stand-in (processes restart, disk kept, new boot id) driven by Ansible's ansible.builtin.reboot.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hostlab.hosts import boot_id
from hostlab.lab import Host, Lab

from inplace_extension.plays.outcomes import task_label

from .shipped import (
    desired,
    failed_tasks,
    install_os_update_standin,
    plan_for,
    run_plan,
    set_mode,
    standin_calls,
)

pytestmark = pytest.mark.lab

TARGET = "https://images.example/os-1.2.0.qcow2"


@pytest.fixture
def host(lab: Lab, lab_hosts: list[Host]) -> Host:
    install_os_update_standin(lab, lab_hosts[0], booted="1.0.0")
    return lab_hosts[0]


def test_update_reboots_and_boots_the_target_once(lab: Lab, host: Host, tmp_path: Path) -> None:
    before = boot_id(host)
    plan = plan_for(desired(TARGET))
    assert plan.capabilities == ("os_update",)
    result = run_plan(lab, host, tmp_path, plan)
    assert result.status == "successful", result.failure_messages
    assert "Reboot into the updated OS" in result.changed_tasks
    assert boot_id(host) != before
    assert lab.exec_in(host, ["/usr/local/bin/os-version"]).stdout.strip() == "1.2.0"
    assert standin_calls(lab, host) == [f"--image {TARGET} --version 1.2.0"]
    # idempotent: the target is booted, so a new run (new fingerprint) calls nothing and reboots nothing
    again = run_plan(lab, host, tmp_path, plan_for(desired(TARGET), retries=3))
    assert again.status == "successful", again.failure_messages
    assert "Run the OS update command" not in again.changed_tasks
    assert len(standin_calls(lab, host)) == 1


def test_a_retriable_failure_is_retried_within_the_budget(lab: Lab, host: Host, tmp_path: Path) -> None:
    set_mode(lab, host, "retriable:1")
    result = run_plan(lab, host, tmp_path, plan_for(desired(TARGET), retries=2))
    assert result.status == "successful", result.failure_messages
    assert len(standin_calls(lab, host)) == 2
    assert lab.exec_in(host, ["/usr/local/bin/os-version"]).stdout.strip() == "1.2.0"


def test_a_retriable_failure_beyond_the_budget_is_terminal(lab: Lab, host: Host, tmp_path: Path) -> None:
    set_mode(lab, host, "retriable:5")
    result = run_plan(lab, host, tmp_path, plan_for(desired(TARGET), retries=1))
    assert result.status == "failed"
    assert failed_tasks(result) == [
        "Stop, the OS update kept failing with retriable errors (retry budget spent)"
    ]
    assert len(standin_calls(lab, host)) == 2  # the first run and one retry
    assert lab.exec_in(host, ["/usr/local/bin/os-version"]).stdout.strip() == "1.0.0"


def test_a_terminal_failure_is_not_retried(lab: Lab, host: Host, tmp_path: Path) -> None:
    set_mode(lab, host, "terminal")
    before = boot_id(host)
    result = run_plan(lab, host, tmp_path, plan_for(desired(TARGET), retries=3))
    assert result.status == "failed"
    assert failed_tasks(result) == ["Stop, the OS update refused the target (terminal)"]
    assert len(standin_calls(lab, host)) == 1
    assert boot_id(host) == before  # no reboot


def test_a_rollback_at_boot_fails_naming_the_booted_version(lab: Lab, host: Host, tmp_path: Path) -> None:
    set_mode(lab, host, "rollback")
    before = boot_id(host)
    result = run_plan(lab, host, tmp_path, plan_for(desired(TARGET)))
    assert result.status == "failed"
    [task] = failed_tasks(result)
    assert boot_id(host) != before  # it did reboot
    # what CAPI sees: os_update: task "Rolled back to 1.0.0" failed on host
    assert task_label(task) == "Rolled back to 1.0.0"
    assert result.failed_roles == ["os_update"]
