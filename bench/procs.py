"""Process measurements for the benches: peak PSS of process trees, CPU and RSS from /proc.

``Sampler`` is the benches' one way to measure while something runs: a thread that samples every
100 ms (or its own ``seconds``) from the ``with`` block's start to its end. On it: ``MemorySampler``
keeps, per play, the peak PSS of the process tree under each ``ansible-playbook-detached`` (the service's
plays) or raw ``ansible-playbook`` (the bench's own); ``TreeSampler`` the peak PSS of one process and its
descendants (the service's whole tree).
"""

from __future__ import annotations

import json
import os
import threading
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Self

SAMPLE_SECONDS = 0.1


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with Path(f"/proc/{entry.name}/stat").open(encoding="ascii") as fh:
                ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        kids.setdefault(ppid, []).append(int(entry.name))
    return kids


def _tree(root: int, kids: dict[int, list[int]]) -> list[int]:
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(kids.get(pid, []))
    return out


def _pss_kb(pid: int) -> int:
    try:
        with Path(f"/proc/{pid}/smaps_rollup").open(encoding="ascii") as fh:
            for line in fh:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


class Sampler(ABC):
    """Calls :meth:`sample` every :attr:`seconds` in a daemon thread while the ``with`` block runs (the
    first call one period after the start); the block's end stops the thread and waits up to
    :attr:`join_seconds` for its last sample."""

    seconds = SAMPLE_SECONDS
    join_seconds = 5.0

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(self.join_seconds)

    def _loop(self) -> None:
        while not self._stop.wait(self.seconds):
            self.sample()

    @abstractmethod
    def sample(self) -> None:
        """One sample: what each kind of sampler measures."""


class MemorySampler(Sampler):
    """Peak PSS per run (process tree under each ansible-playbook-detached / ansible-playbook root)."""

    def __init__(self) -> None:
        super().__init__()
        self.peaks: dict[str, int] = {}  # run key (attempt dir or raw tag) -> peak PSS KiB

    def sample(self) -> None:
        kids = _children()
        for pid in [p for ps in kids.values() for p in ps]:
            cmd = _cmdline(pid).split(b"\0")
            key = None
            if any(part.endswith(b"ansible-playbook-detached") for part in cmd[:2]):
                key = next((p.decode() for p in cmd if b"/inputs.json" in p or b"hosts.json" in p), str(pid))
            elif b"bench-raw-ansible" in _cmdline(pid) and cmd[1:2] and cmd[1].endswith(b"ansible-playbook"):
                key = f"raw-{pid}"
            if key is None:
                continue
            total = sum(_pss_kb(p) for p in _tree(pid, kids))
            self.peaks[key] = max(self.peaks.get(key, 0), total)


class TreeSampler(Sampler):
    """The peak PSS (KiB) of a process and its descendants."""

    def __init__(self, pid: int) -> None:
        super().__init__()
        self.pid = pid
        self.peak_kb = 0

    def sample(self) -> None:
        self.peak_kb = max(self.peak_kb, tree_pss_kb(self.pid))


def hosts_in(inventory: str) -> int:
    try:
        return max(1, len(json.loads(Path(inventory).read_text())["all"]["hosts"]))
    except (OSError, ValueError, KeyError):
        return 1


def children_cpu_seconds(pid: int) -> float:
    """CPU time (user + system) of the waited-for descendants of ``pid``: the plays it ran, on this side.
    A play forked from the service's fork server (plays/forkserver.py) is the server's child, not the
    service's: the servers still running count whole (their import of ansible-core and their reaped
    plays; one that has ended was waited for by the service, so it is in the service's own figure)."""
    fields = Path(f"/proc/{pid}/stat").read_text(encoding="ascii").rsplit(")", 1)[1].split()
    own = (int(fields[13]) + int(fields[14])) / os.sysconf("SC_CLK_TCK")  # cutime, cstime
    return own + sum(cpu_seconds(child) for child in _fork_servers(pid))


def _fork_servers(pid: int) -> list[int]:
    servers = []
    for child in _children().get(pid, []):
        try:
            argv = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if len(argv) > 1 and argv[1].endswith(b"/forkserver.py"):
            servers.append(child)
    return servers


def peak_rss_mb(pid: int) -> float:
    with Path(f"/proc/{pid}/status").open(encoding="ascii") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return 0.0


def tree_pss_kb(pid: int) -> int:
    """PSS (KiB) of ``pid`` and all its descendants now."""
    return sum(_pss_kb(p) for p in _tree(pid, _children()))


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system) of ``pid`` itself and of its waited-for descendants."""
    fields = Path(f"/proc/{pid}/stat").read_text(encoding="ascii").rsplit(")", 1)[1].split()
    return sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")  # utime stime cutime cstime
