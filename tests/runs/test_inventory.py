"""Inventory file: the lab tool's shape is accepted; mistakes get errors that name line and field."""

from __future__ import annotations

from pathlib import Path

import pytest

from inplace_extension.runs.inventory import (
    InventoryError,
    load_inventory,
    parse_inventory,
    parse_known_hosts,
)

KEY = "AAAAC3NzaC1lZDI1NTE5AAAAIJAm/+qD5i6Qm8kDm+Qr9ygOJL1jDRtSlh6jlxmhLn0T"

LAB_SHAPE = f"""\
hosts:
  - match: {{name: "hlh1"}}
    address: 10.77.1.11
    port: 22
    user: ansible
    private_key_file: /abs/path/id_ed25519
    become: true
    known_hosts: "10.77.1.11 ssh-ed25519 {KEY}"
  - match: {{name: "md-0-*"}}
    address: "fd00::12"
    insecure_skip_host_key_check: true
  - match: {{labels: {{role: worker}}}}
    address: 10.77.1.13
defaults: {{user: ops, port: 2222, private_key_file: /keys/id, become: false}}
"""


def test_lab_shape_is_accepted() -> None:
    inv = parse_inventory(LAB_SHAPE)
    assert [h.address for h in inv.hosts] == ["10.77.1.11", "fd00::12", "10.77.1.13"]
    assert inv.hosts[0].match.name == "hlh1"
    assert inv.hosts[0].private_key_file == Path("/abs/path/id_ed25519")
    assert inv.hosts[1].insecure_skip_host_key_check is True
    assert inv.hosts[2].match.labels == {"role": "worker"}
    assert inv.defaults.port == 2222
    assert inv.defaults.become is False


def test_empty_file_is_an_empty_inventory() -> None:
    assert parse_inventory("").hosts == []


def test_unknown_field_names_line_and_field() -> None:
    text = "hosts:\n  - match: {name: a}\n    address: 10.0.0.1\n    adress: 10.0.0.2\n"
    with pytest.raises(InventoryError) as err:
        parse_inventory(text, "inv.yaml")
    assert "inv.yaml" in str(err.value)
    assert "line 4" in str(err.value)
    assert "hosts[0].adress" in str(err.value)


def test_host_names_are_refused_as_addresses() -> None:
    with pytest.raises(InventoryError, match=r"line 3: hosts\[0\]\.address: .*IPv4 or IPv6 address literal"):
        parse_inventory("hosts:\n  - match: {name: a}\n    address: node1.example.com\n")


def test_match_needs_a_criterion() -> None:
    with pytest.raises(InventoryError, match=r"hosts\[0\]\.match.*'name' or 'labels'"):
        parse_inventory("hosts:\n  - match: {}\n    address: 10.0.0.1\n")


def test_relative_key_path_is_refused() -> None:
    with pytest.raises(InventoryError, match=r"private_key_file: .*absolute"):
        parse_inventory("defaults: {private_key_file: keys/id}\n")


def test_known_hosts_and_insecure_together_are_refused() -> None:
    text = f"hosts:\n  - match: {{name: a}}\n    address: 10.0.0.1\n    known_hosts: 'ssh-ed25519 {KEY}'\n"
    text += "    insecure_skip_host_key_check: true\n"
    with pytest.raises(InventoryError, match="either known_hosts or insecure"):
        parse_inventory(text)


def test_bad_known_hosts_line_is_refused() -> None:
    with pytest.raises(InventoryError, match="known_hosts"):
        parse_inventory("hosts:\n  - match: {name: a}\n    address: 10.0.0.1\n    known_hosts: 'not a key'\n")


def test_not_yaml_and_missing_file(tmp_path: Path) -> None:
    with pytest.raises(InventoryError, match="not valid YAML"):
        parse_inventory("hosts: [\n")
    with pytest.raises(InventoryError, match="cannot read"):
        load_inventory(tmp_path / "absent.yaml")
    with pytest.raises(InventoryError, match="hosts"):
        parse_inventory("hosts: 3\n")


def test_known_hosts_keeps_only_keys() -> None:
    text = f"# comment\n10.0.0.1,node1 ssh-ed25519 {KEY} comment\n\nssh-rsa AAAAB3Nza\n"
    assert parse_known_hosts(text) == (f"ssh-ed25519 {KEY}", "ssh-rsa AAAAB3Nza")
    with pytest.raises(ValueError, match="cert-authority"):
        parse_known_hosts(f"@cert-authority * ssh-ed25519 {KEY}")
