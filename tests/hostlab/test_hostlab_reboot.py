"""The lab's reboot stand-in: processes restart, the disk stays, the boot id changes.

Lab hosts have no kernel of their own, so ``Lab.reboot`` / ``hostlab reboot`` / the guest's STAND-IN
``shutdown -r`` ask the host's PID 1 to end every other process, empty /run, change the boot id the
host sees and start sshd again. That is enough for Ansible's ``ansible.builtin.reboot`` (it runs
``shutdown -r 0`` and waits for a new boot id), which the last test runs against a lab host.
"""

from __future__ import annotations

import sys
from pathlib import Path

import ansible_runner
import pytest
import yaml
from hostlab.cli import main
from hostlab.hosts import boot_id
from hostlab.inventory import render
from hostlab.lab import Host, Lab, banner_ready
from hostlab.proc import wait_until

pytestmark = pytest.mark.lab

BOOT_ID = "/proc/sys/kernel/random/boot_id"


def seen_boot_id(lab: Lab, host: Host) -> str:
    result = lab.ssh(host, ["cat", BOOT_ID])
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_reboot_restarts_processes_keeps_the_disk_and_changes_the_boot_id(
    lab: Lab, lab_hosts: list[Host]
) -> None:
    host, other = lab_hosts[0], lab_hosts[1]
    before = seen_boot_id(lab, host)
    machine = Path(BOOT_ID).read_text().strip()
    assert before not in (machine, seen_boot_id(lab, other))  # every host has a boot id of its own
    sleeper = lab.exec_in(host, ["sh", "-c", "sleep 600 >/dev/null 2>&1 & echo $!"]).stdout.strip()
    lab.ssh(host, ["sudo", "-n", "sh", "-c", "echo kept >/var/tmp/disk && echo gone >/run/scratch"])
    pid1 = host.pid1
    lab.reboot(host.name)
    after = seen_boot_id(lab, host)
    assert after != before and after == boot_id(host)
    assert lab.read_file(host, "/var/tmp/disk") == "kept\n"  # the disk stays
    assert lab.exec_in(host, ["test", "-e", "/run/scratch"]).returncode == 1  # /run starts empty
    assert lab.exec_in(host, ["kill", "-0", sleeper]).returncode != 0  # every process ended
    assert host.pid1 == pid1  # the same host (a reset would start a new one from an empty layer)
    assert seen_boot_id(lab, other) != after


def test_guest_shutdown_standin_reboots_and_refuses_what_it_cannot_do(
    lab: Lab, lab_hosts: list[Host]
) -> None:
    host = lab_hosts[1]
    before = seen_boot_id(lab, host)
    for refused in (
        ["shutdown", "-h", "now"],
        ["shutdown", "-r", "+5"],
        ["shutdown", "-r"],
        ["shutdown", "-c"],
    ):
        result = lab.ssh(host, ["sudo", "-n", *refused])
        assert result.returncode == 1, refused
        assert "hostlab stand-in" in result.stderr
    assert lab.ssh(host, ["/usr/sbin/shutdown", "-r", "now"]).stderr.strip() == "shutdown: must be root"
    asked = lab.ssh(host, ["sudo", "-n", "shutdown", "-r", "now", "maintenance"])
    assert asked.returncode == 0, asked.stderr
    assert wait_until(lambda: boot_id(host) != before and banner_ready(host.address), 30)
    assert seen_boot_id(lab, host) != before


def test_cli_reboot(lab: Lab, lab_hosts: list[Host], capsys: pytest.CaptureFixture[str]) -> None:
    host = lab_hosts[2]
    before = boot_id(host)
    assert main(["--name", lab.name, "reboot", str(host.index)]) == 0
    assert f"hostlab: {host.name} rebooted" in capsys.readouterr().out
    assert boot_id(host) != before
    assert main(["--name", lab.name, "reboot", "no-such-host"]) == 1


def test_ansible_reboot_module_reboots_a_lab_host(lab: Lab, lab_hosts: list[Host], tmp_path: Path) -> None:
    host = lab_hosts[0]
    before = seen_boot_id(lab, host)
    inventory = yaml.safe_load(render(lab, "yaml-ansible"))
    play = [
        {
            "hosts": host.name,
            "gather_facts": False,
            "become": True,
            "tasks": [
                {"name": "Reboot", "ansible.builtin.reboot": {"reboot_timeout": 120}, "register": "rebooted"},
                {
                    "name": "Boot id",
                    "ansible.builtin.command": {"argv": ["cat", BOOT_ID]},
                    "register": "boot",
                    "changed_when": False,
                },
            ],
        }
    ]
    path = f"{Path(sys.executable).parent}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    runner = ansible_runner.run(
        private_data_dir=str(tmp_path),
        playbook=play,
        inventory=inventory,
        envvars={**lab.ansible_env(), "PATH": path, "ANSIBLE_HOME": str(tmp_path / "home")},
        quiet=True,
        suppress_env_files=True,
        cancel_callback=lambda: False,
        timeout=300,
    )
    results = {
        e["event_data"]["task"]: e["event_data"]["res"]
        for e in runner.events
        if e["event"] in ("runner_on_ok", "runner_on_failed")
    }
    assert runner.status == "successful", results
    assert results["Reboot"]["rebooted"] is True
    assert results["Boot id"]["stdout"].strip() not in ("", before)
    assert results["Boot id"]["stdout"].strip() == boot_id(host)
