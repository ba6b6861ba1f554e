"""Starting, stopping and rebooting one lab node: systemd booted by ``systemd-nspawn`` in its own namespaces.

A node is the lab's real machine: its PID 1 is systemd (from the nodes' root filesystem,
:mod:`hostlab.node_base`), which starts sshd, containerd and whatever the node's units say, restarts
them, and reboots on request. ``node_init.sh`` runs under ``unshare --mount --net`` (its PID is the
one recorded), waits for eth0 like a chroot host, mounts the node's overlay root and runs
``systemd-nspawn --boot`` in a loop that boots again after a reboot (exit status 133).

Stopping never SIGKILLs ``systemd-nspawn``: that would orphan the container's systemd with its whole
PID namespace. The node is powered off with SIGTERM to ``systemd-nspawn`` (systemd shuts down, the
script ends); if it is not down in time, the container's PID 1 is SIGKILLed, which ends its PID
namespace, then the script. Its mounts and network namespace end with the script.
"""

from __future__ import annotations

import signal
from pathlib import Path

from hostlab.config import PROXY_PORT
from hostlab.errors import LabError
from hostlab.hosts import HOST_INIT, console_tail, plug_and_go, prepare_host_dir
from hostlab.network import banner_ready, link_exists
from hostlab.proc import alive, children, cmdline, is_ours, kill_and_wait, run, spawn, wait_until
from hostlab.state import Host, LabState, slot_network

NODE_INIT = HOST_INIT.with_name("node_init.sh")
DEFAULT_NODE_DISK_MB = 3072  # the writable layer: two kubelet/kubeadm versions, containerd's state
BOOT_TIMEOUT = 60.0  # systemd to sshd; seconds on an idle machine, more beside a busy test run
POWEROFF_TIMEOUT = 30.0


def start_node(host: Host, state: LabState, base: Path, client_key: Path) -> int:
    """Boot node ``host`` (its directory keeps the host key); return the PID of its ``node_init.sh``."""
    fifo = prepare_host_dir(host, client_key)
    gateway = str(slot_network(state.slot).network_address + 1)
    unshare = ["unshare", "--mount", "--net", "--propagation", "private"]
    init = [str(NODE_INIT), host.name, str(host.dir), str(base), host.address, gateway]
    argv = [*unshare, "/bin/sh", *init, str(PROXY_PORT), str(state.disk_mb)]
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
    pid = spawn(argv, output=host.dir / "console.log", env=env)
    try:
        # without --fork, unshare becomes the script in the new namespaces (it unshares, then execs
        # /bin/sh): eth0 goes into its network namespace once that exec happened
        if not wait_until(lambda: cmdline(pid)[:1] == ["/bin/sh"] or not alive(pid), 10):
            raise LabError(f"{host.name}: node_init.sh did not start:\n{console_tail(host)}")
        # the nodes of a cluster reach each other (unlike the chroot hosts): a Pod on one node reaches
        # the machines it works on, the other nodes, over SSH (its node masquerades it)
        plug_and_go(host, pid, pid, fifo, f"hlb{state.slot}", BOOT_TIMEOUT, isolated=False)
    except BaseException:
        _end(host, pid)
        raise
    return pid


def _nspawn(pid: int) -> int | None:
    kids = [kid for kid in children(pid) if "systemd-nspawn" in " ".join(cmdline(kid)[:1])]
    return kids[0] if kids else None


def _end(host: Host, pid: int) -> None:
    """Power the node off (SIGTERM to systemd-nspawn), else kill its PID 1, then its script."""
    nspawn = _nspawn(pid)
    if nspawn is not None:
        kill_and_wait_quiet(nspawn, signal.SIGTERM, POWEROFF_TIMEOUT)
    if alive(pid) and (nspawn := _nspawn(pid)) is not None:
        init = host.pid1
        if init is not None:  # SIGKILL of a PID 1 ends its whole PID namespace
            kill_and_wait_quiet(init, signal.SIGKILL, 10)
        kill_and_wait_quiet(nspawn, signal.SIGTERM, 10)
    kill_and_wait(pid)
    if link_exists(host.veth):
        run(["ip", "link", "del", host.veth], check=False)


def kill_and_wait_quiet(pid: int, sig: int, timeout: float) -> bool:
    """Like ``kill_and_wait`` but says whether ``pid`` ended instead of raising."""
    try:
        kill_and_wait(pid, sig, timeout)
    except LabError:
        return False
    return True


def stop_node(host: Host) -> None:
    """Power the node off and remove its veth; nothing of it is left running (checked)."""
    pid = host.unshare_pid
    if pid is not None and is_ours(pid, str(host.dir)):
        init = host.pid1
        _end(host, pid)
        if init is not None and not wait_until(lambda: not alive(init), 10):
            raise LabError(f"{host.name}: its systemd ({init}) is still alive after the node was stopped")
    if link_exists(host.veth):
        run(["ip", "link", "del", host.veth], check=False)


def node_boot_id(host: Host) -> str:
    """The boot id the node sees: systemd-nspawn gives each boot its own."""
    return (host.root() / "proc/sys/kernel/random/boot_id").read_text().strip()


def reboot_node(host: Host, timeout: float = BOOT_TIMEOUT) -> str:
    """Reboot a running node with ``systemctl reboot``; wait for sshd; return the new boot id."""
    before_init = host.pid1
    if before_init is None:
        raise LabError(f"node {host.name} is not running")
    before = node_boot_id(host)
    run(["nsenter", "-t", str(before_init), "-a", "systemctl", "reboot"], check=False)

    def back() -> bool:
        init = host.pid1
        if init is None or init == before_init:
            return False
        try:
            rebooted = node_boot_id(host) != before
        except OSError:
            return False
        return rebooted and banner_ready(host.address)

    if not wait_until(back, timeout, 0.2):
        raise LabError(f"{host.name}: not back within {timeout:g}s of the reboot:\n{console_tail(host)}")
    return node_boot_id(host)
