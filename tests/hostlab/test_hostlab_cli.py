"""The ``hostlab`` command end to end; its inventories work with the service loader and plain Ansible."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from hostlab.cli import main
from hostlab.inventory import defaults_only_inventory
from hostlab.lab import Lab
from hostlab.pytest_plugin import WriteInventory

from inplace_extension.runs.inventory import load_inventory

HOSTLAB = str(Path(sys.executable).with_name("hostlab"))


def test_bad_lab_name_is_refused_precisely(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--name", "Bad Name!", "status"]) == 1
    assert "lab name 'Bad Name!' must match" in capsys.readouterr().err


def test_status_of_a_lab_that_is_not_up(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOSTLAB_RUN_DIR", str(tmp_path))
    assert main(["--name", "nothing-here", "status"]) == 1
    assert "lab 'nothing-here' is not up" in capsys.readouterr().err


@pytest.fixture
def cli_lab(lab: Lab, monkeypatch: pytest.MonkeyPatch) -> Iterator[Lab]:
    """A second, CLI-managed lab of 2 hosts, owned by this process (reaped if the session dies)."""
    monkeypatch.setenv("HOSTLAB_OWNER_PID", str(os.getpid()))
    other = Lab(f"pytest-{os.getpid()}-cli", lab.cfg)
    try:
        yield other
    finally:
        other.down()


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([HOSTLAB, *args], capture_output=True, text=True, timeout=300, check=False)


@pytest.mark.lab
def test_cli_up_status_ssh_inventory_fault_reset_down(cli_lab: Lab) -> None:
    name = ["--name", cli_lab.name]
    up = _cli(*name, "up", "2")
    assert up.returncode == 0, up.stderr
    assert f"lab {cli_lab.name} with 2 hosts up" in up.stdout
    status = json.loads(_cli(*name, "status", "--json").stdout)
    assert [h["ssh"] for h in status["hosts"]] == [True, True]
    assert status["owner_pid"] == os.getpid()
    first = status["hosts"][0]["name"]
    ssh = _cli(*name, "ssh", "1", "hostname")
    assert (ssh.returncode, ssh.stdout.strip()) == (0, first)

    inv = yaml.safe_load(_cli(*name, "inventory", "--machine-names", "md-0-abc,md-0-def").stdout)
    assert [e["match"] for e in inv["hosts"]] == [{"name": "md-0-abc"}, {"name": "md-0-def"}]
    assert inv["hosts"][0]["address"] == status["hosts"][0]["address"]
    too_many = _cli(*name, "inventory", "--machine-names", "a,b,c")
    assert too_many.returncode == 1
    assert "3 machine names given but lab" in too_many.stderr

    down = _cli(*name, "fault", "link", "down", "2")
    assert down.returncode == 0, down.stderr
    assert [h["ssh"] for h in json.loads(_cli(*name, "status", "--json").stdout)["hosts"]] == [True, False]
    bad = _cli(*name, "fault", "slow", "1", "fast")
    assert (bad.returncode, bad.stderr.strip()) == (
        1,
        "hostlab: delay must be milliseconds or 'off', got 'fast'",
    )
    assert _cli(*name, "reset", "2").returncode == 0
    assert [h["ssh"] for h in json.loads(_cli(*name, "status", "--json").stdout)["hosts"]] == [True, True]

    gone = _cli(*name, "down")
    assert gone.returncode == 0, gone.stderr
    assert not cli_lab.dir.exists()
    assert _cli(*name, "status").returncode == 1


@pytest.mark.lab
def test_service_inventory_is_accepted_by_the_service_loader(lab: Lab, lab_inventory: WriteInventory) -> None:
    path = lab_inventory(["m-1", "m-2", "m-3"])
    loaded = load_inventory(path)
    assert [entry.match.name for entry in loaded.hosts] == ["m-1", "m-2", "m-3"]
    assert [entry.address for entry in loaded.hosts] == [h.address for h in lab.hosts()]
    assert all(entry.known_hosts and not entry.insecure_skip_host_key_check for entry in loaded.hosts)


@pytest.mark.lab
def test_a_defaults_only_inventory_pins_the_key_of_the_host_it_names(lab: Lab) -> None:
    for host in lab.hosts():
        defaults = defaults_only_inventory(lab, host)["defaults"]
        assert defaults["known_hosts"] == lab.known_hosts_line(host), host.name
        assert "address" not in defaults


@pytest.mark.lab
@pytest.mark.parametrize("fmt", ["ini", "yaml-ansible"])
def test_ansible_reaches_every_host_with_host_key_checking(
    lab: Lab, lab_inventory: WriteInventory, fmt: str, tmp_path: Path
) -> None:
    ansible = shutil.which("ansible", path=str(Path(sys.executable).parent))
    assert ansible is not None, "ansible-core is a project dependency"
    path = lab_inventory(["web-1", "web-2"], fmt)
    env = {
        "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "ANSIBLE_HOME": str(tmp_path / "ansible"),
        "ANSIBLE_HOST_KEY_CHECKING": "True",
        **lab.ansible_env(),
    }
    result = subprocess.run(
        [ansible, "-i", str(path), "lab", "-m", "command", "-a", "hostname", "--one-line"],
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    hosts = lab.hosts()
    assert f"web-1 | CHANGED | rc=0 | (stdout) {hosts[0].name}" in result.stdout
    assert f"web-2 | CHANGED | rc=0 | (stdout) {hosts[1].name}" in result.stdout
