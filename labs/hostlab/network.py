"""A lab's network: picking a free slot (/24), the bridge, the apt proxy on the gateway, and probes.

Slot ``S`` means bridge ``hlbS`` with gateway 10.77.S.1/24 and the apt proxy on 10.77.S.1:3142; a slot
is free when no other lab recorded it and the machine routes nothing that overlaps its /24.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import socket
import sys
from collections.abc import Callable
from pathlib import Path

from hostlab.config import LAB_NETWORK_PREFIX, MAX_SLOT, MIN_SLOT, PROXY_PORT, Config, machine_apt_hosts
from hostlab.errors import LabError
from hostlab.proc import alive, file_lock, is_ours, run, spawn, wait_until
from hostlab.state import Host, LabState, slot_network

PACKAGE_DIR = Path(__file__).resolve().parent
Save = Callable[[LabState], None]


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


def claim_slot(cfg: Config, slot: int | None, record: Callable[[int], LabState]) -> LabState:
    """Pick (or check) a slot whose /24 nobody uses; ``record`` saves it before the slot lock is released."""
    with file_lock(cfg.run_dir / "slots.lock", timeout=60, what="slot lock"):
        taken = set()
        for state_file in (cfg.run_dir / "labs").glob("*/lab.json"):
            with contextlib.suppress(OSError, ValueError, KeyError):
                taken.add(int(json.loads(state_file.read_text())["slot"]))
        if slot is not None:
            if not MIN_SLOT <= slot <= MAX_SLOT:
                raise LabError(f"slot must be {MIN_SLOT}..{MAX_SLOT}, got {slot}")
            if slot in taken:
                raise LabError(f"slot {slot} is used by another lab")
            if subnet_in_use(slot) or link_exists(f"hlb{slot}"):
                raise LabError(f"{slot_network(slot)} is already routed on this machine; pick another slot")
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
        return record(chosen)


def ensure_bridge(state: LabState, save: Save) -> None:
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
    save(state)
    run(["ip", "addr", "add", f"{gateway}/24", "dev", bridge])
    run(["ip", "link", "set", bridge, "up"])


def ensure_proxy(cfg: Config, lab_dir: Path, state: LabState, save: Save) -> None:
    """Start the lab's apt proxy on its gateway unless it already runs (the hosts' only way out)."""
    if state.proxy_pid is not None and is_ours(state.proxy_pid, str(lab_dir)):
        return
    gateway = str(slot_network(state.slot).network_address + 1)
    argv = [sys.executable, "-m", "hostlab.aptproxy", "--listen", f"{gateway}:{PROXY_PORT}"]
    argv += ["--cache", str(cfg.apt_cache_dir), "--log-file", str(lab_dir / "aptproxy.log")]
    for mirror_host in sorted(machine_apt_hosts()):
        argv += ["--allow", mirror_host]
    env = dict(os.environ, PYTHONPATH=str(PACKAGE_DIR.parent))
    log_file = lab_dir / "aptproxy.log"
    pid = spawn(argv, output=log_file, env=env)
    state.proxy_pid = pid
    save(state)

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
