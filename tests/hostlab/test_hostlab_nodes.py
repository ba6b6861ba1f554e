"""Lab nodes (``kind="node"``): systemd booted by systemd-nspawn from the shared node root filesystem, each
in its own network namespace, reachable over SSH, rebooted for real, and gone without a trace at ``down``."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hostlab import prereqs
from hostlab.config import Config
from hostlab.lab import Host, Lab, link_exists
from hostlab.node_base import node_base_dir
from hostlab.proc import cmdline, wait_until
from hostlab.pytest_plugin import nodes_lab, unavailable
from hostlab.state import NODE

pytestmark = pytest.mark.lab


@pytest.fixture(scope="module")
def node_lab() -> Iterator[Lab]:
    with nodes_lab("nodes") as lab:
        yield lab


def read_only_cgroup_controllers(lab: Lab, host: Host) -> list[str]:
    """The cgroup v1 controller hierarchies mounted read-only in the node (containerd needs them rw)."""
    mounts = lab.exec_in(host, ["cat", "/proc/self/mountinfo"]).stdout.splitlines()
    found = []
    for fields in (line.split() for line in mounts):
        name, options = fields[4].rsplit("/", 1)[-1], fields[5].split(",")
        if fields[4].startswith("/sys/fs/cgroup/") and name not in ("systemd", "unified") and "ro" in options:
            found.append(fields[4])
    return found


def running(lab: Lab, host: Host) -> bool:
    state = lab.exec_in(host, ["systemctl", "is-system-running"]).stdout.strip()
    assert state not in ("degraded", "maintenance"), lab.exec_in(host, ["systemctl", "--failed"]).stdout
    return state == "running"


def test_nodes_boot_systemd_with_sshd_and_containerd_in_their_own_network_namespaces(node_lab: Lab) -> None:
    hosts = node_lab.hosts()
    for host in hosts:
        assert wait_until(lambda host=host: running(node_lab, host), 60, 0.5)  # type: ignore[misc]
        init = node_lab.exec_in(host, ["readlink", "/proc/1/exe"]).stdout.strip()
        assert init == "/usr/lib/systemd/systemd"
        active = node_lab.exec_in(host, ["systemctl", "is-active", "ssh", "containerd", "systemd-timesyncd"])
        assert active.stdout.split() == ["active"] * 3
        login = node_lab.ssh(host, ["sudo", "-n", "hostname"])
        assert login.stdout.strip() == host.name, login.stderr
        assert host.pid1 is not None
        assert Path(f"/proc/{host.pid1}/ns/net").readlink() != Path("/proc/self/ns/net").readlink()
    assert hosts[0].pid1 != hosts[1].pid1
    # unlike the chroot hosts, the nodes of a cluster reach each other (a Pod's SSH to another node)
    banner = "import socket, sys; print(socket.create_connection((sys.argv[1], 22), 10).recv(4))"
    reached = node_lab.exec_in(hosts[0], ["python3", "-c", banner, hosts[1].address])
    assert reached.stdout.strip() == "b'SSH-'", reached.stderr
    assert all(read_only_cgroup_controllers(node_lab, h) == [] for h in hosts)
    machine_ids = {node_lab.exec_in(h, ["cat", "/etc/machine-id"]).stdout.strip() for h in hosts}
    assert len(machine_ids) == 2  # the kubelet reports it: each node has its own


def test_the_root_filesystem_is_shared_read_only_and_each_node_writes_its_own_layer(node_lab: Lab) -> None:
    one, two = node_lab.hosts()
    assert node_lab.exec_in(one, ["sh", "-c", "echo one >/etc/hostlab-test"]).returncode == 0
    assert node_lab.exec_in(two, ["test", "-e", "/etc/hostlab-test"]).returncode == 1
    assert not (node_base_dir(node_lab.cfg) / "etc/hostlab-test").exists()


def test_a_reboot_restarts_systemd_keeps_the_disk_and_changes_the_boot_id(node_lab: Lab) -> None:
    host = node_lab.host(1)
    node_lab.exec_in(host, ["sh", "-c", "echo kept >/var/lib/hostlab-test"])
    boot_id = node_lab.exec_in(host, ["cat", "/proc/sys/kernel/random/boot_id"]).stdout
    init = host.pid1
    # from inside, as a user or the os_update role would: systemd reboots, systemd-nspawn boots again
    node_lab.ssh(host, ["sudo", "-n", "systemctl", "reboot"])
    assert wait_until(lambda: host.pid1 not in (None, init) and running(node_lab, host), 90, 0.5)
    assert node_lab.exec_in(host, ["cat", "/proc/sys/kernel/random/boot_id"]).stdout != boot_id
    assert node_lab.exec_in(host, ["cat", "/var/lib/hostlab-test"]).stdout == "kept\n"
    assert node_lab.ssh(host, ["true"]).returncode == 0
    # systemd-nspawn mounts them read-only at every boot; the node's own unit makes them writable again
    assert read_only_cgroup_controllers(node_lab, host) == []


def test_down_stops_every_node_process_and_leaves_nothing_behind() -> None:
    cfg = Config.from_env()
    if prereqs.missing(cfg, NODE):
        unavailable(str(prereqs.missing(cfg, NODE)))
    lab = Lab(f"pytest-{os.getpid()}-nodedown", cfg)
    try:
        [host] = lab.up(1, owner_pid=os.getpid(), kind=NODE)
        init = host.pid1
        assert init is not None
        pid_ns = Path(f"/proc/{init}/ns/pid").readlink()
        veth = host.veth
    finally:
        lab.down()
    left = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            in_node = (entry / "ns/pid").readlink() == pid_ns
        except OSError:
            continue
        if in_node or str(lab.dir) in " ".join(cmdline(int(entry.name))):
            left.append(entry.name)
    assert left == []  # not the node's systemd, nor any of its services, nor systemd-nspawn
    assert not link_exists(veth)
    assert str(lab.dir) not in Path("/proc/self/mountinfo").read_text()
    assert not lab.dir.exists()
