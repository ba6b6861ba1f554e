"""A lab's recorded state (``lab.json``) and the controller's view of one host.

Owns the state records (:class:`LabState`, :class:`HostState`), :class:`Host` (name, address, veth,
directory and whether its PID 1 runs) and the slot -> network mapping every other module derives
addresses from.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hostlab.config import DEFAULT_DISK_MB, LAB_NETWORK_PREFIX
from hostlab.errors import LabError
from hostlab.proc import is_ours, namespace_init

HOST, NODE = "host", "node"  # a lab's kind of machine: chroot hosts (hostlab.hosts) or nodes (hostlab.nodes)


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
    kind: str = HOST
    hosts: dict[str, HostState] = field(default_factory=dict)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LabState:
        hosts = {name: HostState(**h) for name, h in data.pop("hosts", {}).items()}
        return cls(hosts=hosts, **data)


def slot_network(slot: int) -> ipaddress.IPv4Network:
    return ipaddress.IPv4Network(f"{LAB_NETWORK_PREFIX}.{slot}.0/24")


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
    unshare_pid: int | None  # the process the lab started: unshare (a host) or node_init.sh (a node)
    kind: str = HOST

    @property
    def pid1(self) -> int | None:
        """PID (in the machine's PID namespace) of the host's PID 1, or None if the host is down."""
        if self.unshare_pid is None or not is_ours(self.unshare_pid, str(self.dir)):
            return None
        return namespace_init(self.unshare_pid)

    @property
    def running(self) -> bool:
        return self.pid1 is not None

    def root(self) -> Path:
        """The host's root directory, reachable from the controller through /proc (root only)."""
        pid1 = self.pid1
        if pid1 is None:
            raise LabError(f"host {self.name} is not running")
        return Path(f"/proc/{pid1}/root")


def host_of(state: LabState, lab_dir: Path, lab_name: str, name: str) -> Host:
    """The :class:`Host` named ``name`` in ``state`` (addresses derive from the slot and index)."""
    hstate = state.hosts[name]
    net = slot_network(state.slot)
    return Host(
        lab=lab_name,
        slot=state.slot,
        index=hstate.index,
        name=name,
        address=str(net.network_address + 10 + hstate.index),
        veth=f"{name}v",
        dir=lab_dir / "hosts" / name,
        unshare_pid=hstate.unshare_pid,
        kind=state.kind,
    )
