"""Lab lifecycle: labs coexist, ``up`` is idempotent, ``down`` leaves the machine as it was, reaping."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
from hostlab.errors import LabError
from hostlab.lab import Lab, link_exists, reap_stale
from hostlab.proc import alive, cmdline, run

pytestmark = pytest.mark.lab


def _start_time(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return "?"


@dataclass(frozen=True)
class Snapshot:
    """What a lab could leave behind on the machine."""

    links: frozenset[str]
    mounts: frozenset[str]
    named_netns: frozenset[str]
    # namespace ("net:[4026532...]") -> the processes in it, each as (pid, start time, cmdline)
    namespaces: dict[str, set[tuple[int, str, str]]]

    @classmethod
    def take(cls) -> Snapshot:
        namespaces: dict[str, set[tuple[int, str, str]]] = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            pid = int(entry.name)
            proc = (pid, _start_time(pid), " ".join(cmdline(pid)))
            for kind in ("net", "mnt", "pid", "uts", "ipc"):
                try:
                    namespaces.setdefault(str((entry / "ns" / kind).readlink()), set()).add(proc)
                except OSError:
                    continue
        mounts = {line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()}
        named = {line.split()[0] for line in run(["ip", "netns", "list"]).splitlines() if line.strip()}
        return cls(
            links=frozenset(p.name for p in Path("/sys/class/net").iterdir()),
            mounts=frozenset(mounts),
            named_netns=frozenset(named),
            namespaces=namespaces,
        )

    @property
    def processes(self) -> set[tuple[int, str, str]]:
        return set().union(*self.namespaces.values())


def _host_namespaces(pid1: int) -> set[str]:
    return {str(Path(f"/proc/{pid1}/ns/{kind}").readlink()) for kind in ("net", "mnt", "pid", "uts", "ipc")}


def test_down_leaves_namespaces_mounts_links_and_processes_as_before(lab: Lab) -> None:
    before = Snapshot.take()
    other = Lab(f"pytest-{os.getpid()}-down", lab.cfg)
    try:
        hosts = other.up(2, owner_pid=os.getpid())
        slot, bridge = other.slot, other.bridge  # read while up: down() removes the state file
        assert slot != lab.slot  # coexists with the session lab on its own /24
        for host in hosts:
            assert other.ssh(host, ["hostname"]).stdout.strip() == host.name
        pids1 = [h.pid1 for h in hosts]
        assert all(pid is not None for pid in pids1)
        created_ns = set().union(*(_host_namespaces(pid) for pid in pids1 if pid is not None))
        during = Snapshot.take()
        ours = {proc for proc in during.processes if str(other.dir) in proc[2]}
        in_lab = set().union(*(during.namespaces[ns] for ns in created_ns))
        # the snapshot sees what the lab created, so comparing snapshots can catch leftovers
        assert {other.bridge, *(h.veth for h in hosts)} <= during.links - before.links
        # (not "new since before": a number freed by another process meanwhile is reused at once, seen in CI)
        assert created_ns <= set(during.namespaces)
        assert len(ours) == 3  # two hosts' unshare + the apt proxy
        assert len(in_lab) >= 4  # per host: PID 1 (hostlab-init) and sshd
    finally:
        other.down()
    after = Snapshot.take()
    new_links = after.links - before.links
    assert not {name for name in new_links if name.startswith(f"hl{slot}h") or name == bridge}
    # namespace numbers are reused at once by others' new namespaces: compare the processes instead
    assert not (ours | in_lab) & after.processes
    assert not [proc for proc in after.processes if str(other.dir) in proc[2]]
    mounted = after.mounts - before.mounts
    assert not [m for m in mounted if str(other.dir) in m or str(other.cfg.base_dir) in m]
    # (other engineers' labs come and go meanwhile: only names a lab of ours could have made count)
    assert not {ns for ns in after.named_netns - before.named_netns if ns.startswith("hl")}
    assert not other.dir.exists()


def test_up_is_idempotent_and_shrinks_to_the_requested_count(lab: Lab) -> None:
    other = Lab(f"pytest-{os.getpid()}-idem", lab.cfg)
    try:
        first = other.up(2, owner_pid=os.getpid())
        again = other.up(2, owner_pid=os.getpid())
        assert [h.unshare_pid for h in again] == [h.unshare_pid for h in first]
        fewer = other.up(1, owner_pid=os.getpid())
        assert [h.name for h in fewer] == [first[0].name]
        assert not alive(first[1].unshare_pid or 0)
        assert not link_exists(first[1].veth)
    finally:
        other.down()


def test_up_refuses_a_subnet_already_routed_on_the_machine(lab: Lab) -> None:
    taken = next(s for s in range(200, 255) if not link_exists(f"hlb{s}"))
    squatter = f"hlsq{os.getpid() % 100000}"
    run(["ip", "link", "add", squatter, "type", "bridge"])
    try:
        run(["ip", "addr", "add", f"10.77.{taken}.1/24", "dev", squatter])
        run(["ip", "link", "set", squatter, "up"])
        other = Lab(f"pytest-{os.getpid()}-routed", lab.cfg)
        with pytest.raises(LabError, match=rf"10\.77\.{taken}\.0/24 is already routed"):
            other.up(1, slot=taken, owner_pid=os.getpid())
        assert not link_exists(f"hlb{taken}")
        with pytest.raises(LabError, match="used by another lab"):
            Lab(f"pytest-{os.getpid()}-dup", lab.cfg).up(1, slot=lab.slot)
    finally:
        run(["ip", "link", "del", squatter])
        for name in ("routed", "dup"):
            Lab(f"pytest-{os.getpid()}-{name}", lab.cfg).down()


def test_labs_of_dead_sessions_are_reaped(lab: Lab) -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    orphan = Lab(f"pytest-{os.getpid()}-orphan", lab.cfg)
    try:
        host = orphan.up(1, owner_pid=dead.pid)[0]
        assert host.running
        reaped = reap_stale(lab.cfg)
        assert orphan.name in reaped
        assert lab.name not in reaped  # our own session's lab has a live owner
        assert not orphan.dir.exists()
        assert not alive(host.unshare_pid or 0)
        assert lab.ssh(lab.hosts()[0], ["true"]).returncode == 0
    finally:
        orphan.down()
