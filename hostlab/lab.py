"""A lab: a named set of hosts on one bridge and /24, with its apt proxy, keys and state file.

Layout of lab ``NAME`` with slot ``S`` (several labs coexist; each gets a free slot under a lock):

- bridge ``hlbS`` with the gateway address 10.77.S.1/24 in the machine's network namespace, and the
  apt proxy listening on 10.77.S.1:3142;
- host ``n`` is named ``hlShn`` (also its hostname), has address 10.77.S.(10+n) on ``eth0`` and the
  bridge-side veth ``hlShnv``, an isolated bridge port (hosts reach the gateway, not each other); it
  runs under ``unshare --fork --kill-child=SIGKILL`` in its own network, PID, mount, UTS and IPC
  namespaces, so SIGKILL of that ``unshare`` (by recorded PID) ends the whole host, and its mounts and
  network namespace disappear with it;
- ``$HOSTLAB_RUN_DIR/labs/NAME/``: ``lab.json`` (state), ``id_ed25519`` (the lab's client key),
  ``known_hosts`` (the pinned host keys), ``aptproxy.log``, ``hosts/hlShn/`` (host key, console log,
  mount points) and ``cp/`` (a ControlPath directory for Ansible, closed on ``down``).

A reset restarts one host from an empty writable layer, keeping its name, address and host key, so
it takes well under a second and clears every fault.
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hostlab import prereqs
from hostlab.base import ensure_base
from hostlab.config import (
    DEFAULT_DISK_MB,
    LAB_NETWORK_PREFIX,
    LOGIN_USER,
    MAX_HOSTS,
    MAX_SLOT,
    MIN_SLOT,
    NAME_RE,
    PROXY_PORT,
    Config,
    machine_apt_hosts,
)
from hostlab.errors import LabError, LabUnavailable
from hostlab.proc import alive, children, file_lock, is_ours, kill_and_wait, run, spawn, wait_until

PACKAGE_DIR = Path(__file__).resolve().parent
HOST_INIT = PACKAGE_DIR / "host_init.sh"
GUEST_INIT = PACKAGE_DIR / "guest_init.py"
SSH_START_TIMEOUT = 20.0
Log = Callable[[str], None]


def _quiet(_: str) -> None:
    """Default logger of the Python API: silent (the CLI passes print)."""


@dataclass
class HostState:
    index: int
    unshare_pid: int | None = None


@dataclass
class LabState:
    name: str
    slot: int
    disk_mb: int = DEFAULT_DISK_MB
    owner_pid: int | None = None  # set by the pytest plugin: a lab whose owner died is stale
    proxy_pid: int | None = None
    bridge_created: bool = False
    hosts: dict[str, HostState] = field(default_factory=dict)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LabState:
        hosts = {name: HostState(**h) for name, h in data.pop("hosts", {}).items()}
        return cls(hosts=hosts, **data)


@dataclass(frozen=True)
class Host:
    """One lab host, as seen from the controller."""

    lab: str
    slot: int
    index: int
    name: str
    address: str
    veth: str
    dir: Path
    unshare_pid: int | None

    @property
    def pid1(self) -> int | None:
        """PID (in the machine's PID namespace) of the host's PID 1, or None if the host is down."""
        if self.unshare_pid is None or not is_ours(self.unshare_pid, str(self.dir)):
            return None
        kids = children(self.unshare_pid)
        return kids[0] if kids else None

    @property
    def running(self) -> bool:
        return self.pid1 is not None

    def root(self) -> Path:
        """The host's root directory, reachable from the controller through /proc (root only)."""
        pid1 = self.pid1
        if pid1 is None:
            raise LabError(f"host {self.name} is not running")
        return Path(f"/proc/{pid1}/root")


def slot_network(slot: int) -> ipaddress.IPv4Network:
    return ipaddress.IPv4Network(f"{LAB_NETWORK_PREFIX}.{slot}.0/24")


def _routed_networks() -> list[ipaddress.IPv4Network]:
    """Every IPv4 destination or address this machine already routes or owns (default route excluded)."""
    nets = []
    routes = json.loads(run(["ip", "-j", "-4", "route", "show", "table", "all"]) or "[]")
    for route in routes:
        dst = route.get("dst", "default")
        if dst != "default":
            nets.append(ipaddress.IPv4Network(dst, strict=False))
    for link in json.loads(run(["ip", "-j", "-4", "addr", "show"]) or "[]"):
        for info in link.get("addr_info", []):
            nets.append(ipaddress.IPv4Network(f"{info['local']}/{info.get('prefixlen', 32)}", strict=False))
    return nets


def subnet_in_use(slot: int) -> bool:
    net = slot_network(slot)
    return any(net.overlaps(other) for other in _routed_networks())


def host_mac(host: Host, end: int) -> str:
    """Locally administered MAC of a host's eth0 (end 0) or its bridge port (end 1), fixed per host."""
    return f"02:68:6c:{host.slot:02x}:{host.index:02x}:{end:02x}"


def link_exists(name: str) -> bool:
    return Path(f"/sys/class/net/{name}").exists()


def banner_ready(address: str, port: int = 22, timeout: float = 1.0) -> bool:
    """True if an SSH server answers with its version banner on address:port."""
    try:
        with socket.create_connection((address, port), timeout=timeout) as sock:
            return sock.recv(4) == b"SSH-"
    except OSError:
        return False


class Lab:
    """Control one named lab. Every method that changes the lab holds the lab's lock."""

    def __init__(self, name: str = "default", cfg: Config | None = None) -> None:
        if not NAME_RE.match(name):
            raise LabError(f"lab name {name!r} must match {NAME_RE.pattern}")
        self.name = name
        self.cfg = cfg or Config.from_env()
        self.dir = self.cfg.lab_dir(name)
        self._lock_path = self.cfg.run_dir / "labs" / f"{name}.lock"

    # ----- state -----------------------------------------------------------------------------------

    @property
    def state_file(self) -> Path:
        return self.dir / "lab.json"

    def exists(self) -> bool:
        return self.state_file.is_file()

    def _load(self) -> LabState:
        try:
            return LabState.from_json(json.loads(self.state_file.read_text()))
        except FileNotFoundError:
            raise LabError(f"lab {self.name!r} is not up (no {self.state_file})") from None
        except (ValueError, TypeError) as exc:
            raise LabError(f"lab state {self.state_file} is unreadable: {exc}") from None

    def _save(self, state: LabState) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(state), indent=2) + "\n")
        tmp.replace(self.state_file)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        with file_lock(self._lock_path, timeout=300, what=f"lock of lab {self.name}"):
            yield

    @property
    def slot(self) -> int:
        return self._load().slot

    @property
    def network(self) -> ipaddress.IPv4Network:
        return slot_network(self.slot)

    @property
    def gateway(self) -> str:
        return str(self.network.network_address + 1)

    @property
    def bridge(self) -> str:
        return f"hlb{self.slot}"

    @property
    def private_key(self) -> Path:
        return self.dir / "id_ed25519"

    @property
    def known_hosts(self) -> Path:
        return self.dir / "known_hosts"

    @property
    def control_path_dir(self) -> Path:
        """Use as ANSIBLE_SSH_CONTROL_PATH_DIR so ``down`` can close Ansible's SSH masters first."""
        return self.dir / "cp"

    def _host(self, state: LabState, name: str) -> Host:
        hstate = state.hosts[name]
        net = slot_network(state.slot)
        return Host(
            lab=self.name,
            slot=state.slot,
            index=hstate.index,
            name=name,
            address=str(net.network_address + 10 + hstate.index),
            veth=f"{name}v",
            dir=self.dir / "hosts" / name,
            unshare_pid=hstate.unshare_pid,
        )

    def hosts(self) -> list[Host]:
        state = self._load()
        return sorted((self._host(state, n) for n in state.hosts), key=lambda h: h.index)

    def host(self, ref: str | int) -> Host:
        """A host by name (``hl3h1``) or 1-based index."""
        for host in self.hosts():
            if ref in (host.name, host.index, str(host.index)):
                return host
        raise LabError(f"lab {self.name!r} has no host {ref!r}")

    # ----- up --------------------------------------------------------------------------------------

    def up(
        self,
        count: int,
        *,
        slot: int | None = None,
        disk_mb: int = DEFAULT_DISK_MB,
        owner_pid: int | None = None,
        log: Log = _quiet,
    ) -> list[Host]:
        """Make hosts 1..count run (starting the missing ones, stopping any beyond count)."""
        if not 1 <= count <= MAX_HOSTS:
            raise LabError(f"host count must be 1..{MAX_HOSTS}, got {count}")
        if not 64 <= disk_mb <= 65536:
            raise LabError(f"per-host disk size must be 64..65536 MB, got {disk_mb}")
        why = prereqs.missing(self.cfg)
        if why:
            raise LabUnavailable(why)
        base = ensure_base(self.cfg, log)
        with self._locked():
            state = self._load() if self.exists() else self._claim_slot(slot, disk_mb, owner_pid)
            if slot is not None and slot != state.slot:
                raise LabError(f"lab {self.name!r} already uses slot {state.slot}; down it to change")
            self._ensure_keys()
            self._ensure_bridge(state)
            self._ensure_proxy(state)
            wanted = {f"hl{state.slot}h{n}" for n in range(1, count + 1)}
            for name in sorted(set(state.hosts) - wanted):
                self._stop_host(self._host(state, name))
                shutil.rmtree(self.dir / "hosts" / name, ignore_errors=True)
                del state.hosts[name]
                self._save(state)
            for n in range(1, count + 1):
                name = f"hl{state.slot}h{n}"
                state.hosts.setdefault(name, HostState(index=n))
                host = self._host(state, name)
                if host.running and banner_ready(host.address):
                    continue
                self._stop_host(host)  # running but unreachable (e.g. its link was removed): start afresh
                started = time.monotonic()
                state.hosts[name].unshare_pid = self._start_host(host, state, base)
                self._save(state)
                log(f"hostlab: {name} up at {host.address} ({time.monotonic() - started:.2f}s)")
            self._write_known_hosts(state)
            return self.hosts()

    def _claim_slot(self, slot: int | None, disk_mb: int, owner_pid: int | None) -> LabState:
        """Pick (or check) a slot whose /24 nobody uses, and record it before releasing the slot lock."""
        with file_lock(self.cfg.run_dir / "slots.lock", timeout=60, what="slot lock"):
            taken = set()
            for state_file in (self.cfg.run_dir / "labs").glob("*/lab.json"):
                with contextlib.suppress(OSError, ValueError, KeyError):
                    taken.add(int(json.loads(state_file.read_text())["slot"]))
            if slot is not None:
                if not MIN_SLOT <= slot <= MAX_SLOT:
                    raise LabError(f"slot must be {MIN_SLOT}..{MAX_SLOT}, got {slot}")
                if slot in taken:
                    raise LabError(f"slot {slot} is used by another lab")
                if subnet_in_use(slot) or link_exists(f"hlb{slot}"):
                    raise LabError(
                        f"{slot_network(slot)} is already routed on this machine; pick another slot"
                    )
                chosen = slot
            else:
                free = (
                    s
                    for s in range(MIN_SLOT, MAX_SLOT + 1)
                    if s not in taken and not link_exists(f"hlb{s}") and not subnet_in_use(s)
                )
                chosen_or_none = next(free, None)
                if chosen_or_none is None:
                    raise LabError(f"no free slot: every {LAB_NETWORK_PREFIX}.S.0/24 is in use")
                chosen = chosen_or_none
            state = LabState(name=self.name, slot=chosen, disk_mb=disk_mb, owner_pid=owner_pid)
            self._save(state)
            return state

    def _ensure_keys(self) -> None:
        if not self.private_key.is_file():
            run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"hostlab-{self.name}",
                 "-f", str(self.private_key)])  # fmt: skip
        self.control_path_dir.mkdir(mode=0o700, exist_ok=True)

    def _ensure_bridge(self, state: LabState) -> None:
        bridge = f"hlb{state.slot}"
        if link_exists(bridge):
            if not state.bridge_created:
                raise LabError(f"bridge {bridge} exists but this lab did not create it")
            return
        if subnet_in_use(state.slot):  # routed since the slot was claimed
            raise LabError(f"{slot_network(state.slot)} is already routed on this machine")
        gateway = str(slot_network(state.slot).network_address + 1)
        # a fixed MAC: a bridge otherwise takes its lowest port's MAC, which changes as hosts come and go
        run(["ip", "link", "add", bridge, "address", f"02:68:6c:{state.slot:02x}:00:01", "type", "bridge"])
        state.bridge_created = True
        self._save(state)
        run(["ip", "addr", "add", f"{gateway}/24", "dev", bridge])
        run(["ip", "link", "set", bridge, "up"])

    def _ensure_proxy(self, state: LabState) -> None:
        if state.proxy_pid is not None and is_ours(state.proxy_pid, str(self.dir)):
            return
        gateway = str(slot_network(state.slot).network_address + 1)
        argv = [sys.executable, "-m", "hostlab.aptproxy", "--listen", f"{gateway}:{PROXY_PORT}"]
        argv += ["--cache", str(self.cfg.apt_cache_dir), "--log-file", str(self.dir / "aptproxy.log")]
        for mirror_host in sorted(machine_apt_hosts()):
            argv += ["--allow", mirror_host]
        env = dict(os.environ, PYTHONPATH=str(PACKAGE_DIR.parent))
        log_file = self.dir / "aptproxy.log"
        pid = spawn(argv, output=log_file, env=env)
        state.proxy_pid = pid
        self._save(state)

        def listening() -> bool:
            if not alive(pid):
                return True
            with contextlib.suppress(OSError), socket.create_connection((gateway, PROXY_PORT), timeout=0.5):
                return True
            return False

        wait_until(listening, 10)
        if not alive(pid):
            tail = "\n".join(log_file.read_text(errors="replace").splitlines()[-10:])
            raise LabError(f"apt proxy on {gateway}:{PROXY_PORT} exited at start:\n{tail}")

    def _write_known_hosts(self, state: LabState) -> None:
        lines = []
        for name in sorted(state.hosts, key=lambda n: state.hosts[n].index):
            host = self._host(state, name)
            key = (host.dir / "ssh_host_ed25519_key.pub").read_text().split()
            lines.append(f"{host.address} {key[0]} {key[1]}")
        self.known_hosts.write_text("".join(line + "\n" for line in lines))

    def known_hosts_line(self, host: Host) -> str:
        key = (host.dir / "ssh_host_ed25519_key.pub").read_text().split()
        return f"{host.address} {key[0]} {key[1]}"

    def _start_host(self, host: Host, state: LabState, base: Path) -> int:
        hd = host.dir
        (hd / "rw").mkdir(parents=True, exist_ok=True)
        (hd / "root").mkdir(exist_ok=True)
        host_key = hd / "ssh_host_ed25519_key"
        if not host_key.is_file():  # generated here so the controller can pin it in known_hosts
            run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", host.name, "-f", str(host_key)])
        shutil.copyfile(self.private_key.with_suffix(".pub"), hd / "authorized_keys")
        fifo = hd / "go.fifo"
        fifo.unlink(missing_ok=True)
        os.mkfifo(fifo, 0o600)
        if link_exists(host.veth):  # an unclean stop left the bridge end behind
            run(["ip", "link", "del", host.veth])
        gateway = str(slot_network(state.slot).network_address + 1)
        argv = ["unshare", "--fork", "--kill-child=SIGKILL", "--pid", "--mount", "--uts", "--ipc", "--net",
                "--propagation", "private", "/bin/sh", str(HOST_INIT), host.name, str(hd), str(base),
                host.address, gateway, str(PROXY_PORT), str(state.disk_mb), str(GUEST_INIT)]  # fmt: skip
        pid = spawn(
            argv, output=hd / "console.log", env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
        )
        try:
            self._plug_and_go(host, pid, fifo, f"hlb{state.slot}")
        except BaseException:
            kill_and_wait(pid)
            if link_exists(host.veth):
                run(["ip", "link", "del", host.veth], check=False)
            raise
        return pid

    def _plug_and_go(self, host: Host, pid: int, fifo: Path, bridge: str) -> None:
        def console_tail() -> str:
            text = (host.dir / "console.log").read_text(errors="replace")
            return "\n".join(text.splitlines()[-15:])

        if not wait_until(lambda: bool(children(pid)) or not alive(pid), 10):
            raise LabError(f"{host.name}: unshare started no PID 1 within 10s")
        if not alive(pid):
            raise LabError(f"{host.name}: unshare exited at start:\n{console_tail()}")
        pid1 = children(pid)[0]
        # fixed MACs: after a reset the machine's neighbour cache still points at the right host
        # (with random ones, packets go to the old MAC for up to a minute and SSH times out)
        run(["ip", "link", "add", host.veth, "address", host_mac(host, 1), "type", "veth",
             "peer", "name", "eth0", "address", host_mac(host, 0), "netns", str(pid1)])  # fmt: skip
        run(["ip", "link", "set", host.veth, "master", bridge, "up"])
        # an isolated bridge port forwards only to the bridge itself (the gateway), never to another
        # isolated port: hosts reach the gateway and nothing else, not even each other
        run(["ip", "link", "set", "dev", host.veth, "type", "bridge_slave", "isolated", "on"])
        # no default route: the host can address only its /24, and the bridge lets it reach only the gateway
        batch = f"link set lo up\naddr add {host.address}/24 dev eth0\nlink set eth0 up\n"
        run(["nsenter", "-t", str(pid1), "-n", "ip", "-batch", "-"], input_text=batch)
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
            raise LabError(f"{host.name}: PID 1 never waited for the go signal:\n{console_tail()}")
        try:
            os.write(fd, b"go\n")
        finally:
            os.close(fd)
        if not wait_until(lambda: not alive(pid) or banner_ready(host.address), SSH_START_TIMEOUT):
            raise LabError(
                f"{host.name}: sshd not answering within {SSH_START_TIMEOUT:g}s:\n{console_tail()}"
            )
        if not alive(pid):
            raise LabError(f"{host.name}: host exited at start:\n{console_tail()}")

    # ----- stop / reset / down ---------------------------------------------------------------------

    def _stop_host(self, host: Host) -> None:
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

    def reset(self, ref: str | int, log: Log = _quiet) -> Host:
        """Restart a host from an empty writable layer: undoes every change and every fault."""
        host = self.host(ref)
        base = self.cfg.base_dir
        with self._locked():
            state = self._load()
            started = time.monotonic()
            self._stop_host(host)
            state.hosts[host.name].unshare_pid = None
            self._save(state)
            state.hosts[host.name].unshare_pid = self._start_host(host, state, base)
            self._save(state)
            log(f"hostlab: {host.name} reset ({time.monotonic() - started:.2f}s)")
        return self.host(host.name)

    def _close_control_masters(self) -> None:
        # Ansible's ControlPersist masters would otherwise linger after their hosts vanish
        for sock in self.control_path_dir.glob("*"):
            if sock.is_socket():
                run(["ssh", "-O", "exit", "-o", f"ControlPath={sock}", "lab"], check=False, timeout=10)

    def down(self, log: Log = _quiet) -> None:
        """Stop every host and the proxy, remove the bridge and the lab directory. Idempotent."""
        if not self.dir.exists():
            if self._lock_path.exists():  # left by an up that failed before creating anything
                with self._locked():
                    self._lock_path.unlink(missing_ok=True)
            return
        with self._locked():
            state = self._load() if self.exists() else None
            self._close_control_masters()
            if state is not None:
                for name in list(state.hosts):
                    self._stop_host(self._host(state, name))
                if state.proxy_pid is not None and is_ours(state.proxy_pid, str(self.dir)):
                    kill_and_wait(state.proxy_pid, signal.SIGTERM)
                bridge = f"hlb{state.slot}"
                if state.bridge_created and link_exists(bridge):
                    run(["ip", "link", "del", bridge])
            shutil.rmtree(self.dir)
            # the lock file too (still held, so a concurrent waiter on this name re-checks the state)
            self._lock_path.unlink(missing_ok=True)
            log(f"hostlab: lab {self.name} down")

    # ----- queries and helpers ---------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        state = self._load()
        proxy_up = state.proxy_pid is not None and is_ours(state.proxy_pid, str(self.dir))
        return {
            "name": self.name,
            "slot": state.slot,
            "network": str(slot_network(state.slot)),
            "gateway": self.gateway,
            "bridge": self.bridge,
            "proxy": f"{self.gateway}:{PROXY_PORT}" if proxy_up else "down",
            "owner_pid": state.owner_pid,
            "private_key": str(self.private_key),
            "known_hosts": str(self.known_hosts),
            "hosts": [
                {
                    "name": h.name,
                    "address": h.address,
                    "running": h.running,
                    "ssh": h.running and banner_ready(h.address, timeout=0.5),
                }
                for h in self.hosts()
            ],
        }

    def ssh_argv(self, host: Host, user: str = LOGIN_USER, *, connect_timeout: int = 5) -> list[str]:
        """ssh client arguments for ``host`` with host-key verification ON (pinned known_hosts)."""
        return ["ssh", "-i", str(self.private_key), "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
                "-o", f"UserKnownHostsFile={self.known_hosts}", "-o", "StrictHostKeyChecking=yes",
                "-o", "GlobalKnownHostsFile=/dev/null", "-o", "ControlMaster=no", "-o", "ControlPath=none",
                "-o", f"ConnectTimeout={connect_timeout}", "-o", "LogLevel=ERROR",
                f"{user}@{host.address}"]  # fmt: skip

    def ssh(
        self,
        host: Host | str | int,
        command: Sequence[str],
        *,
        user: str = LOGIN_USER,
        timeout: float = 60,
        connect_timeout: int = 5,
        input_text: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run ``command`` (an argv, quoted for the remote shell) on ``host`` over SSH; returns any exit."""
        target = host if isinstance(host, Host) else self.host(host)
        argv = [*self.ssh_argv(target, user, connect_timeout=connect_timeout), "--", shlex.join(command)]
        return subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout, input=input_text, check=False
        )

    def read_file(self, host: Host | str | int, path: str) -> str:
        """Read a file on ``host`` over SSH (with sudo, so root-only files work too)."""
        result = self.ssh(host, ["sudo", "-n", "cat", "--", path])
        if result.returncode != 0:
            raise LabError(f"cannot read {path}: {result.stderr.strip()}")
        return result.stdout

    def exec_in(
        self,
        host: Host | str | int,
        argv: Sequence[str],
        *,
        timeout: float = 60,
        input_text: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` as root inside ``host``'s namespaces and root, without SSH (works with no sshd)."""
        target = host if isinstance(host, Host) else self.host(host)
        pid1 = target.pid1
        if pid1 is None:
            raise LabError(f"host {target.name} is not running")
        nsenter = ["nsenter", "-t", str(pid1), "-m", "-u", "-i", "-n", "-p", "-r", "-w"]
        env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
        return subprocess.run(
            [*nsenter, *argv], capture_output=True, text=True, timeout=timeout, input=input_text,
            check=False, env=env,
        )  # fmt: skip

    def ansible_env(self) -> dict[str, str]:
        """Environment for ansible-playbook/ansible-runner runs against this lab."""
        return {"ANSIBLE_SSH_CONTROL_PATH_DIR": str(self.control_path_dir), "ANSIBLE_NOCOLOR": "1"}


def all_labs(cfg: Config | None = None) -> list[Lab]:
    cfg = cfg or Config.from_env()
    labs_dir = cfg.run_dir / "labs"
    if not labs_dir.is_dir():
        return []
    return [Lab(p.name, cfg) for p in sorted(labs_dir.iterdir()) if p.is_dir() and NAME_RE.match(p.name)]


def reap_stale(cfg: Config | None = None, log: Log = _quiet) -> list[str]:
    """Tear down labs whose owning process (a killed test session) is gone; return their names.

    Only labs that recorded an owner PID are considered: a lab started from the CLI has no owner and
    stays until ``hostlab down``.
    """
    reaped = []
    for lab in all_labs(cfg):
        try:
            owner = lab._load().owner_pid
        except LabError:
            continue  # no state (yet): a lab being created right now, or not ours to judge
        if owner is not None and not alive(owner):
            lab.down(log)
            reaped.append(lab.name)
    return reaped
