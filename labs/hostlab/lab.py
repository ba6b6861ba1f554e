"""A lab: a named set of hosts on one bridge and /24, with its apt proxy, keys and state file.

This module owns :class:`Lab`: its lifecycle (up, reset, reboot, down, status, stale-lab reaping) under
the lab's lock, and the access to its hosts from the controller (SSH with pinned host keys, nsenter,
Ansible settings); the parts live beside it: :mod:`hostlab.state` (the state file, :class:`Host`),
:mod:`hostlab.network` (slots, bridge, apt proxy) and :mod:`hostlab.hosts` (a host's processes). The
names tests and tools import from here (``Lab``, ``Host``, ``banner_ready``, ``link_exists``,
``reap_stale``, ``all_labs``) stay here.

Layout of lab ``NAME`` with slot ``S`` (several labs coexist; each gets a free slot under a lock):

- bridge ``hlbS`` with the gateway address 10.77.S.1/24 in the machine's network namespace, and the
  apt proxy listening on 10.77.S.1:3142;
- host ``n`` is named ``hlShn`` (also its hostname), has address 10.77.S.(10+n) on ``eth0`` and the
  bridge-side veth ``hlShnv``, an isolated bridge port (hosts reach the gateway, not each other);
- ``$HOSTLAB_RUN_DIR/labs/NAME/``: ``lab.json`` (state), ``id_ed25519`` (the lab's client key),
  ``known_hosts`` (the pinned host keys), ``aptproxy.log``, ``hosts/hlShn/`` (host key, console log,
  mount points) and ``cp/`` (a ControlPath directory for Ansible, closed on ``down``).

A reset restarts one host from an empty writable layer, keeping its name, address and host key, so
it takes well under a second and clears every fault.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import shlex
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from hostlab import prereqs
from hostlab.base import ensure_base
from hostlab.config import DEFAULT_DISK_MB, LOGIN_USER, MAX_HOSTS, NAME_RE, PROXY_PORT, Config
from hostlab.errors import LabError, LabUnavailable
from hostlab.hosts import reboot_host, start_host, stop_host
from hostlab.network import banner_ready, claim_slot, ensure_bridge, ensure_proxy, link_exists
from hostlab.node_base import ensure_node_base, node_base_dir
from hostlab.nodes import DEFAULT_NODE_DISK_MB, reboot_node, start_node, stop_node
from hostlab.proc import alive, file_lock, is_ours, kill_and_wait, run
from hostlab.routes import remove_rules
from hostlab.state import HOST, NODE, Host, HostState, LabState, host_of, slot_network

__all__ = ["Host", "Lab", "Log", "all_labs", "banner_ready", "link_exists", "reap_stale", "slot_network"]

Log = Callable[[str], None]
# ssh client options of every connection to a lab host: key only, no prompt, pinned host keys, no master
SSH_OPTIONS = (
    "IdentitiesOnly=yes",
    "BatchMode=yes",
    "StrictHostKeyChecking=yes",
    "GlobalKnownHostsFile=/dev/null",
    "ControlMaster=no",
    "ControlPath=none",
    "LogLevel=ERROR",
)


Start = Callable[[Host, LabState, Path, Path], int]


def _start(kind: str) -> Start:
    return start_node if kind == NODE else start_host


def _stop(host: Host) -> None:
    stop_node(host) if host.kind == NODE else stop_host(host)


def _base(cfg: Config, kind: str, log: Log) -> Path:
    return ensure_node_base(cfg, log) if kind == NODE else ensure_base(cfg, log)


def _quiet(_: str) -> None:
    """Default logger of the Python API: silent (the CLI passes print)."""


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

    def _host(self, state: LabState, name: str) -> Host:
        return host_of(state, self.dir, self.name, name)

    def hosts(self) -> list[Host]:
        state = self._load()
        return sorted((self._host(state, n) for n in state.hosts), key=lambda h: h.index)

    def host(self, ref: str | int) -> Host:
        """A host by name (``hl3h1``) or 1-based index."""
        for host in self.hosts():
            if ref in (host.name, host.index, str(host.index)):
                return host
        raise LabError(f"lab {self.name!r} has no host {ref!r}")

    # ----- access: SSH (pinned host keys), nsenter, Ansible settings ---------------------------------

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

    def known_hosts_line(self, host: Host) -> str:
        key = (host.dir / "ssh_host_ed25519_key.pub").read_text().split()
        return f"{host.address} {key[0]} {key[1]}"

    def ssh_argv(self, host: Host, user: str = LOGIN_USER, *, connect_timeout: int = 5) -> list[str]:
        """ssh client arguments for ``host`` with host-key verification ON (pinned known_hosts)."""
        options = [
            *SSH_OPTIONS,
            f"UserKnownHostsFile={self.known_hosts}",
            f"ConnectTimeout={connect_timeout}",
        ]
        pairs = [arg for option in options for arg in ("-o", option)]
        return ["ssh", "-i", str(self.private_key), *pairs, f"{user}@{host.address}"]

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
            [*nsenter, *argv],
            capture_output=True,
            text=True,
            timeout=timeout,
            input=input_text,
            check=False,
            env=env,
        )

    def ansible_env(self) -> dict[str, str]:
        """Environment for ansible-playbook/ansible-runner runs against this lab."""
        return {"ANSIBLE_SSH_CONTROL_PATH_DIR": str(self.control_path_dir), "ANSIBLE_NOCOLOR": "1"}

    # ----- up --------------------------------------------------------------------------------------

    def up(
        self,
        count: int,
        *,
        slot: int | None = None,
        disk_mb: int | None = None,
        owner_pid: int | None = None,
        log: Log = _quiet,
        kind: str = HOST,
    ) -> list[Host]:
        """Make hosts 1..count run (starting the missing ones, stopping any beyond count).

        ``kind`` is fixed when the lab is created: chroot hosts (``host``, the default) or nodes that boot
        systemd (``node``, :mod:`hostlab.nodes`)."""
        if kind not in (HOST, NODE):
            raise LabError(f"lab kind must be {HOST} or {NODE}, got {kind!r}")
        if disk_mb is None:
            disk_mb = DEFAULT_NODE_DISK_MB if kind == NODE else DEFAULT_DISK_MB
        if not 1 <= count <= MAX_HOSTS:
            raise LabError(f"host count must be 1..{MAX_HOSTS}, got {count}")
        if not 64 <= disk_mb <= 65536:
            raise LabError(f"per-host disk size must be 64..65536 MB, got {disk_mb}")
        why = prereqs.missing(self.cfg, kind)
        if why:
            raise LabUnavailable(why)
        base = _base(self.cfg, kind, log)
        with self._locked():
            state = self._load() if self.exists() else self._claim_slot(slot, disk_mb, owner_pid, kind)
            if slot is not None and slot != state.slot:
                raise LabError(f"lab {self.name!r} already uses slot {state.slot}; down it to change")
            if kind != state.kind:
                raise LabError(f"lab {self.name!r} runs {state.kind}s, not {kind}s; down it to change")
            self._ensure_keys()
            ensure_bridge(state, self._save)
            ensure_proxy(self.cfg, self.dir, state, self._save)
            wanted = {f"hl{state.slot}h{n}" for n in range(1, count + 1)}
            for name in sorted(set(state.hosts) - wanted):
                _stop(self._host(state, name))
                shutil.rmtree(self.dir / "hosts" / name, ignore_errors=True)
                del state.hosts[name]
                self._save(state)
            for n in range(1, count + 1):
                name = f"hl{state.slot}h{n}"
                state.hosts.setdefault(name, HostState(index=n))
                host = self._host(state, name)
                if host.running and banner_ready(host.address):
                    continue
                _stop(host)  # running but unreachable (e.g. its link was removed): start afresh
                started = time.monotonic()
                state.hosts[name].unshare_pid = _start(kind)(host, state, base, self.private_key)
                self._save(state)
                log(f"hostlab: {name} up at {host.address} ({time.monotonic() - started:.2f}s)")
            self._write_known_hosts(state)
            return self.hosts()

    def _claim_slot(self, slot: int | None, disk_mb: int, owner_pid: int | None, kind: str) -> LabState:
        def record(chosen: int) -> LabState:
            state = LabState(name=self.name, slot=chosen, disk_mb=disk_mb, owner_pid=owner_pid, kind=kind)
            self._save(state)
            return state

        return claim_slot(self.cfg, slot, record)

    def _ensure_keys(self) -> None:
        if not self.private_key.is_file():
            comment = f"hostlab-{self.name}"
            run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(self.private_key)])
        self.control_path_dir.mkdir(mode=0o700, exist_ok=True)

    def _write_known_hosts(self, state: LabState) -> None:
        hosts = sorted((self._host(state, n) for n in state.hosts), key=lambda h: h.index)
        self.known_hosts.write_text("".join(self.known_hosts_line(h) + "\n" for h in hosts))

    # ----- reset / down ----------------------------------------------------------------------------

    def reset(self, ref: str | int, log: Log = _quiet) -> Host:
        """Restart a host from an empty writable layer: undoes every change and every fault."""
        host = self.host(ref)
        with self._locked():
            state = self._load()
            base = node_base_dir(self.cfg) if state.kind == NODE else self.cfg.base_dir
            started = time.monotonic()
            _stop(host)
            state.hosts[host.name].unshare_pid = None
            self._save(state)
            state.hosts[host.name].unshare_pid = _start(state.kind)(host, state, base, self.private_key)
            self._save(state)
            log(f"hostlab: {host.name} reset ({time.monotonic() - started:.2f}s)")
        return self.host(host.name)

    def reboot(self, ref: str | int, log: Log = _quiet) -> Host:
        """Reboot a host: its processes restart (sshd too), its disk stays, its boot id changes."""
        host = self.host(ref)
        with self._locked():
            started = time.monotonic()
            reboot_node(host) if host.kind == NODE else reboot_host(host)
            log(f"hostlab: {host.name} rebooted ({time.monotonic() - started:.2f}s)")
        return host

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
                    _stop(self._host(state, name))
                if state.proxy_pid is not None and is_ours(state.proxy_pid, str(self.dir)):
                    kill_and_wait(state.proxy_pid, signal.SIGTERM)
                bridge = f"hlb{state.slot}"
                if state.bridge_created and link_exists(bridge):
                    run(["ip", "link", "del", bridge])
            remove_rules(self.name)  # a route to another lab's hosts (hostlab.routes) goes with the lab
            shutil.rmtree(self.dir)
            # the lock file too (still held, so a concurrent waiter on this name re-checks the state)
            self._lock_path.unlink(missing_ok=True)
            log(f"hostlab: lab {self.name} down")

    # ----- queries ---------------------------------------------------------------------------------

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
