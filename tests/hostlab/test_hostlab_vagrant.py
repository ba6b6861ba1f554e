"""vagrant/: the Vagrantfile parses and validates (no provider needed), and write_inventory.py writes
inventories the service accepts. Bringing the machines up needs libvirt or VirtualBox, which CI lacks."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from hostlab.pytest_plugin import unavailable

from inplace_extension.runs.inventory import parse_inventory

VAGRANT_DIR = Path(__file__).resolve().parents[2] / "vagrant"


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        unavailable(f"{name} is not installed (scripts/bootstrap installs it as root)")
    return path


def _write_inventory() -> ModuleType:
    name = "vagrant_write_inventory"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, VAGRANT_DIR / "write_inventory.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the class is created
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def vagrant_copy(tmp_path: Path) -> Path:
    """The Vagrantfile in a scratch directory, so validating it writes no key into the checkout."""
    shutil.copy(VAGRANT_DIR / "Vagrantfile", tmp_path / "Vagrantfile")
    return tmp_path


def test_vagrantfile_is_valid_ruby(vagrant_copy: Path) -> None:
    result = subprocess.run(
        [_tool("ruby"), "-c", "Vagrantfile"], cwd=vagrant_copy, capture_output=True, text=True, check=False
    )
    assert (result.returncode, result.stdout.strip()) == (0, "Syntax OK"), result.stderr


def _validate(directory: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [_tool("vagrant"), "validate", "--ignore-provider"],
        cwd=directory,
        env={
            "PATH": os.environ["PATH"],
            "HOME": str(directory),
            "VAGRANT_HOME": str(directory / ".vd"),
            **env,
        },
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_vagrant_validates_both_providers_config_and_makes_the_key(vagrant_copy: Path) -> None:
    result = _validate(vagrant_copy)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Vagrantfile validated successfully." in result.stdout
    assert [line for line in result.stdout.splitlines() if "Ignoring provider config" in line] == [
        f"==> node{n}: Ignoring provider config for validation..." for n in (1, 2, 3)
    ]
    key = vagrant_copy / ".hostlab" / "id_ed25519"
    assert key.read_text().startswith("-----BEGIN OPENSSH PRIVATE KEY-----")
    assert (vagrant_copy / ".hostlab" / "id_ed25519.pub").read_text().startswith("ssh-ed25519 ")


def test_vagrantfile_rejects_bad_settings(vagrant_copy: Path) -> None:
    result = _validate(vagrant_copy, VAGRANT_NODES="0")
    assert result.returncode != 0
    assert "VAGRANT_NODES must be 1..50, got 0" in result.stdout + result.stderr


def test_running_nodes_are_read_from_vagrant_status() -> None:
    module = _write_inventory()
    status = (
        "1795326965,node2,metadata,provider,libvirt\n"
        "1795326965,node2,provider-name,libvirt\n"
        "1795326965,node2,state,running\n"
        "1795326965,node10,state,running\n"
        "1795326965,node1,state,running\n"
        "1795326965,node3,state,shutoff\n"
        "1795326965,,ui,info,Current machine states:\n"
    )
    assert module.running_nodes(status) == ["node1", "node2", "node10"]
    failed = (
        "1795326965,,error-exit,Vagrant::Errors::NoDefaultProvider,"
        "No usable default provider%!(VAGRANT_COMMA) sorry"
    )
    with pytest.raises(
        module.InventoryError, match="vagrant status failed: No usable default provider, sorry"
    ):
        module.running_nodes(failed)


def test_inventory_is_accepted_by_the_service_loader(tmp_path: Path) -> None:
    module = _write_inventory()
    key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIN6POzKeRDi80GpFsXm+OXnFSMF0ZCsMklrYqqAdbYv0"
    nodes = [module.Node(f"node{n}", module.node_address(f"node{n}", "192.168.56"), key) for n in (1, 2)]
    text = module.render(nodes, tmp_path / "id_ed25519", "service", ["md-0-a", "md-0-b"])
    inventory = parse_inventory(text, "vagrant")
    assert [(h.match.name, h.address) for h in inventory.hosts] == [
        ("md-0-a", "192.168.56.11"),
        ("md-0-b", "192.168.56.12"),
    ]
    assert inventory.hosts[0].known_hosts == f"192.168.56.11 {key}"
    assert inventory.hosts[0].user == "ansible"
    ini = module.render(nodes, tmp_path / "id_ed25519", "ini", [])
    assert "node2 ansible_host=192.168.56.12" in ini
    assert "StrictHostKeyChecking=yes" in ini
    with pytest.raises(module.InventoryError, match="3 machine names given but 2 nodes are running"):
        module.render(nodes, tmp_path / "k", "service", ["a", "b", "c"])
    with pytest.raises(module.InventoryError, match="not valid Kubernetes object names: 'Bad_Name'"):
        module.render(nodes, tmp_path / "k", "service", ["Bad_Name"])


def test_a_container_node_is_reached_where_vagrant_reaches_it() -> None:
    """The docker provider's machines: the address and port of ``vagrant ssh-config`` (loopback, the
    published SSH port), pinned in known_hosts as ``[address]:port``."""
    module = _write_inventory()
    status = "1795326965,node1,provider-name,docker\n1795326965,node2,provider-name,libvirt\n"
    assert module.providers(status) == {"node1": "docker", "node2": "libvirt"}
    config = "Host node1\n  HostName 127.0.0.1\n  User ansible\n  Port 2200\n  IdentitiesOnly yes\n"
    assert module.ssh_endpoint(config) == ("127.0.0.1", 2200)
    with pytest.raises(module.InventoryError, match="no HostName and Port"):
        module.ssh_endpoint("Host node1\n")
    key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIN6POzKeRDi80GpFsXm+OXnFSMF0ZCsMklrYqqAdbYv0"
    text = module.render([module.Node("node1", "127.0.0.1", key, 2200)], Path("/k"), "service", ["vm-1"])
    [host] = parse_inventory(text, "vagrant").hosts
    assert (host.address, host.port, host.known_hosts) == ("127.0.0.1", 2200, f"[127.0.0.1]:2200 {key}")
