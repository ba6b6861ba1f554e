#!/usr/bin/env python3
"""Write the inventory for the Vagrant test machines (vagrant/Vagrantfile), like ``hostlab inventory``.

Run from ``vagrant/`` after ``vagrant up``. Each running node's host key is read through ``vagrant ssh``
(Vagrant's own channel to the machine) and pinned in the inventory, so the service and Ansible verify it.
Addresses follow the Vagrantfile: a VM (libvirt, virtualbox) node N has ``$VAGRANT_SUBNET.(10+N)``, port
22; a container (the docker provider) is reached where Vagrant reaches it, its SSH port published on
loopback (``vagrant ssh-config``). Standard library only.

    ./write_inventory.py -o inventory.yaml                          # service format (--inventory)
    ./write_inventory.py --machine-names md-0-a,md-0-b -o inv.yaml  # nodes mapped to Machine names
    ./write_inventory.py --format ini -o hosts.ini                  # plain Ansible
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
KEY = HERE / ".hostlab" / "id_ed25519"
NODE_RE = re.compile(r"^node(\d+)$")
HOST_KEY_RE = re.compile(r"^(ssh-ed25519|ecdsa-sha2-nistp256|ssh-rsa) [A-Za-z0-9+/=]+$")
MACHINE_NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")


class InventoryError(RuntimeError):
    """The inventory cannot be written; the message says why."""


@dataclass(frozen=True)
class Node:
    name: str
    address: str
    host_key: str  # "<type> <base64>"
    port: int = 22


def providers(status_output: str) -> dict[str, str]:
    """Each node's provider (libvirt, virtualbox, docker) in ``vagrant status --machine-readable`` output."""
    found = {}
    for line in status_output.splitlines():
        fields = line.split(",", 3)
        if len(fields) == 4 and fields[2] == "provider-name" and NODE_RE.match(fields[1]):
            found[fields[1]] = fields[3]
    return found


def ssh_endpoint(ssh_config: str) -> tuple[str, int]:
    """``HostName`` and ``Port`` of ``vagrant ssh-config`` output: where Vagrant itself reaches the node."""
    values = dict(
        line.strip().split(None, 1)
        for line in ssh_config.splitlines()
        if len(line.strip().split(None, 1)) == 2
    )
    try:
        return values["HostName"], int(values["Port"])
    except (KeyError, ValueError):
        raise InventoryError(
            f"vagrant ssh-config gave no HostName and Port: {ssh_config.strip()!r}"
        ) from None


def container_endpoint(name: str) -> tuple[str, int]:
    result = subprocess.run(
        ["vagrant", "ssh-config", name], cwd=HERE, capture_output=True, text=True, timeout=120, check=False
    )
    if result.returncode != 0:
        raise InventoryError(f"{name}: vagrant ssh-config failed: {result.stderr.strip()}")
    return ssh_endpoint(result.stdout)


def running_nodes(status_output: str) -> list[str]:
    """Names of the running nodes in ``vagrant status --machine-readable`` output."""
    nodes = []
    for line in status_output.splitlines():
        fields = line.split(",", 3)
        if len(fields) < 4:
            continue
        _, target, kind, data = fields
        if kind == "error-exit":
            message = data.split(",", 1)[-1].replace("%!(VAGRANT_COMMA)", ",").replace("\\n", "\n")
            raise InventoryError(f"vagrant status failed: {message.strip()}")
        if kind == "state" and data == "running" and NODE_RE.match(target):
            nodes.append(target)
    return sorted(nodes, key=lambda n: int(n.removeprefix("node")))


def node_address(name: str, subnet: str) -> str:
    match = NODE_RE.match(name)
    if match is None:
        raise InventoryError(f"not a node of the Vagrantfile: {name!r}")
    return f"{subnet}.{10 + int(match.group(1))}"


def read_host_key(name: str) -> str:
    result = subprocess.run(
        ["vagrant", "ssh", name, "-c", "cat /etc/ssh/ssh_host_ed25519_key.pub", "--", "-o", "LogLevel=ERROR"],
        cwd=HERE,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    fields = result.stdout.strip().split()
    key = " ".join(fields[:2])
    if result.returncode != 0 or not HOST_KEY_RE.match(key):
        raise InventoryError(
            f"{name}: cannot read its ed25519 host key: {result.stderr.strip() or result.stdout}"
        )
    return key


def known_host(node: Node) -> str:
    """The node as known_hosts names it: ``address``, or ``[address]:port`` off port 22."""
    return node.address if node.port == 22 else f"[{node.address}]:{node.port}"


def render(nodes: list[Node], private_key: Path, fmt: str, machine_names: list[str]) -> str:
    """The inventory text: ``service`` (inplace-extension --inventory) or ``ini`` (plain Ansible)."""
    if machine_names:
        if len(machine_names) > len(nodes):
            raise InventoryError(
                f"{len(machine_names)} machine names given but {len(nodes)} nodes are running"
            )
        bad = [n for n in machine_names if not MACHINE_NAME_RE.match(n)]
        if bad:
            raise InventoryError(f"not valid Kubernetes object names: {', '.join(map(repr, bad))}")
    names = machine_names or [n.name for n in nodes]
    pairs = list(zip(names, nodes, strict=False))
    if fmt == "service":
        lines = ["hosts:"]
        for name, node in pairs:
            # JSON strings are valid YAML scalars: quoting without a YAML library
            lines += [
                f"  - match: {{name: {json.dumps(name)}}}",
                f"    address: {node.address}",
                f"    port: {node.port}",
                "    user: ansible",
                f"    private_key_file: {json.dumps(str(private_key))}",
                "    become: true",
                f"    known_hosts: {json.dumps(f'{known_host(node)} {node.host_key}')}",
                "    python_interpreter: /usr/bin/python3",
            ]
        return "\n".join(lines) + "\n"
    if fmt == "ini":
        known_hosts = private_key.parent / "known_hosts"
        hosts = [f"{name} ansible_host={node.address} ansible_port={node.port}" for name, node in pairs]
        lines = ["[lab]", *hosts, "", "[lab:vars]"]
        lines += [
            "ansible_user=ansible",
            f"ansible_ssh_private_key_file={private_key}",
            "ansible_python_interpreter=/usr/bin/python3",
            "ansible_become=true",
            f"ansible_ssh_common_args='-o UserKnownHostsFile={known_hosts} -o StrictHostKeyChecking=yes'",
        ]
        return "\n".join(lines) + "\n"
    raise InventoryError(f"unknown format {fmt!r}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--format", choices=["service", "ini"], default="service")
    parser.add_argument("--machine-names", default="", help="comma-separated Machine names, in node order")
    parser.add_argument("-o", "--output", type=Path, help="file to write (default: stdout)")
    args = parser.parse_args(argv)
    subnet = os.environ.get("VAGRANT_SUBNET", "192.168.56")
    try:
        if not KEY.is_file():
            raise InventoryError(f"no key at {KEY}: run 'vagrant up' in {HERE} first")
        status = subprocess.run(
            ["vagrant", "status", "--machine-readable"], cwd=HERE, capture_output=True, text=True, check=False
        )
        names = running_nodes(status.stdout)
        if not names:
            raise InventoryError("no node is running: 'vagrant up' first")
        provider_of = providers(status.stdout)
        nodes = []
        for name in names:
            if provider_of.get(name) == "docker":
                address, port = container_endpoint(name)
            else:
                address, port = node_address(name, subnet), 22
            nodes.append(Node(name, address, read_host_key(name), port))
        if args.format == "ini":  # plain Ansible reads the pinned keys from a known_hosts file
            (KEY.parent / "known_hosts").write_text("".join(f"{known_host(n)} {n.host_key}\n" for n in nodes))
        machine_names = [n.strip() for n in args.machine_names.split(",") if n.strip()]
        text = render(nodes, KEY, args.format, machine_names)
    except (InventoryError, OSError, subprocess.TimeoutExpired) as exc:
        print(f"write_inventory: {exc}", file=sys.stderr)
        return 1
    if args.output:
        args.output.write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
