"""Starting and stopping one lab host's processes: ``unshare`` + PID 1, its veth, and the go signal.

A host runs under ``unshare --fork --kill-child=SIGKILL`` in its own network, PID, mount, UTS and IPC
namespaces (``host_init.sh`` builds its root, then execs the guest supervisor ``guest_init.py``);
SIGKILL of that ``unshare`` (by recorded PID) ends the whole host, and its mounts and network
namespace disappear with it. A reboot (:func:`reboot_host`) is asked of the host's PID 1 instead: its
processes restart, its disk stays, and the boot id it sees changes (guest_init.py).
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

from hostlab.config import PROXY_PORT
from hostlab.errors import LabError
from hostlab.guest_init import REBOOT_SIGNAL
from hostlab.network import banner_ready, host_mac, link_exists
from hostlab.proc import alive, children, is_ours, kill_and_wait, run, spawn, wait_until
from hostlab.state import Host, LabState, slot_network

PACKAGE_DIR = Path(__file__).resolve().parent
HOST_INIT = PACKAGE_DIR / "host_init.sh"
GUEST_INIT = PACKAGE_DIR / "guest_init.py"
SSH_START_TIMEOUT = 20.0
REBOOT_TIMEOUT = 30.0


def start_host(host: Host, state: LabState, base: Path, client_key: Path) -> int:
    """Start ``host`` (its directory keeps the host key); return the PID of its ``unshare``."""
    hd = host.dir
    fifo = prepare_host_dir(host, client_key)
    gateway = str(slot_network(state.slot).network_address + 1)
    namespaces = ["--pid", "--mount", "--uts", "--ipc", "--net", "--propagation", "private"]
    unshare = ["unshare", "--fork", "--kill-child=SIGKILL", *namespaces]
    init = [str(HOST_INIT), host.name, str(hd), str(base), host.address, gateway]
    argv = [*unshare, "/bin/sh", *init, str(PROXY_PORT), str(state.disk_mb), str(GUEST_INIT)]
    pid = spawn(
        argv, output=hd / "console.log", env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
    )
    try:
        if not wait_until(lambda: bool(children(pid)) or not alive(pid), 10):
            raise LabError(f"{host.name}: unshare started no PID 1 within 10s")
        if not alive(pid):
            raise LabError(f"{host.name}: unshare exited at start:\n{console_tail(host)}")
        plug_and_go(host, pid, children(pid)[0], fifo, f"hlb{state.slot}", SSH_START_TIMEOUT)
    except BaseException:
        kill_and_wait(pid)
        if link_exists(host.veth):
            run(["ip", "link", "del", host.veth], check=False)
        raise
    return pid


def console_tail(host: Host, lines: int = 15) -> str:
    text = (host.dir / "console.log").read_text(errors="replace")
    return "\n".join(text.splitlines()[-lines:])


def prepare_host_dir(host: Host, client_key: Path) -> Path:
    """The host's directory with its mount points, host key and authorized key; returns its new go fifo."""
    hd = host.dir
    (hd / "rw").mkdir(parents=True, exist_ok=True)
    (hd / "root").mkdir(exist_ok=True)
    host_key = hd / "ssh_host_ed25519_key"
    if not host_key.is_file():  # generated here so the controller can pin it in known_hosts
        run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", host.name, "-f", str(host_key)])
    shutil.copyfile(client_key.with_suffix(".pub"), hd / "authorized_keys")
    fifo = hd / "go.fifo"
    fifo.unlink(missing_ok=True)
    os.mkfifo(fifo, 0o600)
    if link_exists(host.veth):  # an unclean stop left the bridge end behind
        run(["ip", "link", "del", host.veth])
    return fifo


def plug_and_go(
    host: Host,
    pid: int,
    netns_pid: int,
    fifo: Path,
    bridge: str,
    ssh_timeout: float,
    *,
    isolated: bool = True,
) -> None:
    """Give the network namespace of ``netns_pid`` its eth0 on ``bridge``, tell the host's start script
    (``pid``) to go on, and wait until sshd answers (or the host ends). ``isolated``: the host reaches
    only the gateway, not the lab's other hosts."""
    # fixed MACs: after a reset the machine's neighbour cache still points at the right host
    # (with random ones, packets go to the old MAC for up to a minute and SSH times out)
    bridge_end = [host.veth, "address", host_mac(host, 1), "type", "veth"]
    host_end = ["peer", "name", "eth0", "address", host_mac(host, 0), "netns", str(netns_pid)]
    run(["ip", "link", "add", *bridge_end, *host_end])
    run(["ip", "link", "set", host.veth, "master", bridge, "up"])
    # an isolated bridge port forwards only to the bridge itself (the gateway), never to another
    # isolated port: hosts reach the gateway and nothing else, not even each other
    if isolated:
        run(["ip", "link", "set", "dev", host.veth, "type", "bridge_slave", "isolated", "on"])
    # no default route: the host can address only its /24, and the bridge lets it reach only the gateway
    batch = f"link set lo up\naddr add {host.address}/24 dev eth0\nlink set eth0 up\n"
    run(["nsenter", "-t", str(netns_pid), "-n", "ip", "-batch", "-"], input_text=batch)
    fd = -1

    def open_fifo() -> bool:
        nonlocal fd
        try:
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as exc:
            if exc.errno != errno.ENXIO:  # ENXIO: PID 1 has not opened it for reading yet
                raise
            return not alive(pid)
        return True

    if not wait_until(open_fifo, 10) or fd < 0:
        raise LabError(f"{host.name}: PID 1 never waited for the go signal:\n{console_tail(host)}")
    try:
        os.write(fd, b"go\n")
    finally:
        os.close(fd)
    if not wait_until(lambda: not alive(pid) or banner_ready(host.address), ssh_timeout):
        raise LabError(f"{host.name}: sshd not answering within {ssh_timeout:g}s:\n{console_tail(host)}")
    if not alive(pid):
        raise LabError(f"{host.name}: host exited at start:\n{console_tail(host)}")


def stop_host(host: Host) -> None:
    """End the host (all its processes, mounts and network namespace) and remove its veth."""
    pid = host.unshare_pid
    if pid is not None and is_ours(pid, str(host.dir)):
        pid1 = host.pid1
        # unshare --fork ignores SIGTERM; SIGKILL makes the kernel SIGKILL its child (PID 1) and
        # with it the whole PID namespace; mounts and the network namespace go with them
        kill_and_wait(pid)
        if pid1 is not None and not wait_until(lambda: not alive(pid1), 10):
            raise LabError(f"{host.name}: PID 1 ({pid1}) still alive 10s after SIGKILL")
    # the kernel tears the network namespace down asynchronously; delete our veth end now so a
    # restart can reuse the name (deleting one end deletes the pair)
    if link_exists(host.veth):
        run(["ip", "link", "del", host.veth], check=False)


def boot_id(host: Host) -> str:
    """The boot id the host sees (/proc/sys/kernel/random/boot_id there); new at every start and reboot."""
    return (host.root() / "run/hostlab/boot_id").read_text().strip()


def reboot_host(host: Host, timeout: float = REBOOT_TIMEOUT) -> str:
    """Reboot a running host (processes restart, disk kept); wait for sshd; return the new boot id."""
    pid1 = host.pid1
    if pid1 is None:
        raise LabError(f"host {host.name} is not running")
    before = boot_id(host)
    os.kill(pid1, REBOOT_SIGNAL)
    state_file = host.root() / "run/hostlab/sshd.state"

    def back() -> bool:
        try:
            rebooted = boot_id(host) != before and state_file.read_text().startswith("running")
        except OSError:
            return False
        return rebooted and banner_ready(host.address)

    if not wait_until(back, timeout):
        raise LabError(
            f"{host.name}: not back with sshd within {timeout:g}s of the reboot:\n{console_tail(host)}"
        )
    return boot_id(host)
