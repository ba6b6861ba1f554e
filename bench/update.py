"""Benchmark: UpdateMachine end to end through the service vs ``ansible-playbook`` run directly, on lab hosts.

Brings up its own hostlab lab (10 hosts, Kubernetes stand-ins installed), starts ``inplace-extension
serve --plain-http`` on loopback, and measures, all in the same run:

1. one host, a files + kubelet_args update: wall time from the first UpdateMachine call to
   ``Success``/``retryAfterSeconds: 0``, polled like CAPI (again after ``retryAfterSeconds``), against
   ``ansible-playbook`` of the same playbook with the same inputs, inventory and ansible.cfg run
   directly. Alternating rounds on the same host, each with new content (real work every time);
2. ten hosts updated at once vs one host;
3. the no-op: a fingerprint the service already applied (answered from memory), and the same after a
   restart with an empty runs dir (a run that finds the host stamp and ends early);
4. peak RSS of the service process, and peak PSS of each play's process tree (wrapper, ansible-playbook,
   its forks and ssh), sampled every 100 ms, shared out over the Machines the play carried.

    .venv/bin/python bench/update.py [--rounds 3] [--hosts 10]

Targets (issue #4): overhead <= 1.15x raw ansible-playbook; 10 hosts <= 1.5x one host; no-op <= 2 s;
<= 100 MB per in-flight run. Needs root (the lab); the lab and the service are stopped at the end.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the e2e CAPI driver and the lab stand-ins live with the tests

from e2e.capi import NodeSpec, Polled, poll_update_machine  # noqa: E402
from e2e.service import Service  # noqa: E402
from playbooks.standins import install_standins, lab_run_on_host  # noqa: E402

from extension.runs.runner import close_control_masters  # noqa: E402
from hostlab.config import Config  # noqa: E402
from hostlab.inventory import render  # noqa: E402
from hostlab.lab import Lab  # noqa: E402

VERSION = "v1.30.2"
SAMPLE_SECONDS = 0.1


def spec(tag: str, max_pods: int) -> NodeSpec:
    """A files + kubelet_args change; ``tag`` makes every round's content (and fingerprint) new."""
    files = [
        {
            "path": f"/etc/bench/{name}.conf",
            "content": f"{name} {tag}\n",
            "owner": "root:root",
            "permissions": "0644",
        }
        for name in ("a", "b", "c")
    ]
    args = {"nodeRegistration": {"kubeletExtraArgs": [{"name": "max-pods", "value": str(max_pods)}]}}
    return NodeSpec(VERSION, {"files": files, "joinConfiguration": args})


# ---------------------------------------------------------------- memory sampling


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


class MemorySampler:
    """Peak PSS per run (process tree under each ansible-playbook-detached / ansible-playbook root)."""

    def __init__(self) -> None:
        self.peaks: dict[str, int] = {}  # run key (attempt dir or raw tag) -> peak PSS KiB
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> MemorySampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def _loop(self) -> None:
        while not self._stop.wait(SAMPLE_SECONDS):
            kids = _children()
            for pid in [p for ps in kids.values() for p in ps]:
                cmd = _cmdline(pid).split(b"\0")
                key = None
                if any(part.endswith(b"ansible-playbook-detached") for part in cmd[:2]):
                    key = next(
                        (p.decode() for p in cmd if b"/inputs.json" in p or b"hosts.json" in p), str(pid)
                    )
                elif (
                    b"bench-raw-ansible" in _cmdline(pid)
                    and cmd[1:2]
                    and cmd[1].endswith(b"ansible-playbook")
                ):
                    key = f"raw-{pid}"
                if key is None:
                    continue
                total = sum(_pss_kb(p) for p in _tree(pid, kids))
                self.peaks[key] = max(self.peaks.get(key, 0), total)


def _hosts_in(inventory: str) -> int:
    try:
        return max(1, len(json.loads(Path(inventory).read_text())["all"]["hosts"]))
    except (OSError, ValueError, KeyError):
        return 1


def children_cpu_seconds(pid: int) -> float:
    """CPU time (user + system) of the waited-for descendants of ``pid``: the plays it ran, on this side."""
    fields = Path(f"/proc/{pid}/stat").read_text(encoding="ascii").rsplit(")", 1)[1].split()
    return (int(fields[13]) + int(fields[14])) / os.sysconf("SC_CLK_TCK")  # cutime, cstime


def peak_rss_mb(pid: int) -> float:
    with Path(f"/proc/{pid}/status").open(encoding="ascii") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return 0.0


# ---------------------------------------------------------------- runs


@dataclass
class Bench:
    lab: Lab
    service: Service
    work: Path
    names: list[str]

    def update(self, name: str, node: NodeSpec) -> tuple[float, Polled]:
        started = time.monotonic()
        polled = poll_update_machine(self.service.client, name, node, within=600)
        if (polled.status, polled.message) != ("Success", "update applied"):
            raise SystemExit(f"bench: {name} did not converge: {polled.messages}")
        return time.monotonic() - started, polled

    def raw(self, name: str, node: NodeSpec, tag: str) -> float:
        """The same playbook, inputs, host variables and ansible.cfg as the service's last run for ``name``,
        started directly as ``ansible-playbook`` for that one host (what an operator would type)."""
        last = sorted(self.service.runs_dir.glob(f"e2e.{name}.*/attempt-*"))[-1]
        meta = json.loads((last / "meta.json").read_text())
        batch_dir = Path(meta["batch_dir"])
        command = json.loads((batch_dir / "artifacts" / meta["batch_ident"] / "command").read_text())[
            "command"
        ]
        host_vars = json.loads((batch_dir / "inventory" / "hosts.json").read_text())["all"]["hosts"][
            meta["host"]
        ]
        host_vars = {k: v for k, v in host_vars.items() if not k.startswith("update_machine_")}
        inputs = json.loads((last / "inputs.json").read_text())
        inputs["kubeadm_files"]["kubeadm_files_files"] = [
            {**f, "content": f"{Path(f['path']).stem} {tag}\n"}
            for f in inputs["kubeadm_files"]["kubeadm_files_files"]
        ]
        max_pods = node.kubeadm["joinConfiguration"]["nodeRegistration"]["kubeletExtraArgs"][0]["value"]
        for arg in inputs["kubelet_args"]["kubelet_args_extra_args"]:
            arg["value"] = max_pods
        raw_dir = Path(tempfile.mkdtemp(prefix="bench-raw-ansible-", dir=self.work))
        inputs_file = raw_dir / "inputs.json"
        inputs_file.write_text(json.dumps(inputs))
        inventory = raw_dir / "hosts.json"
        inventory.write_text(json.dumps({"all": {"hosts": {name: host_vars}}}))
        fingerprint = hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()
        extravars = {
            "update_machine_ident": f"raw.{name}.{fingerprint[:12]}",
            "update_machine_fingerprint": fingerprint,
            "update_machine_capabilities": list(inputs),
            "update_machine_inputs_file": str(inputs_file),
        }
        argv = ["ansible-playbook", command[1], "-i", str(inventory), "-e", json.dumps(extravars)]
        env = {
            **os.environ,
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
            "ANSIBLE_CONFIG": str(ROOT / "playbooks" / "ansible.cfg"),
            "ANSIBLE_HOME": str(raw_dir / "home"),
            "ANSIBLE_SSH_CONTROL_PATH_DIR": str(self.work / "rawcp"),
        }
        started = time.monotonic()
        proc = subprocess.run(argv, env=env, cwd=raw_dir, capture_output=True, text=True, check=False)
        elapsed = time.monotonic() - started
        if proc.returncode != 0:
            raise SystemExit(
                f"bench: raw ansible-playbook failed ({proc.returncode}):\n{proc.stdout[-3000:]}"
            )
        return elapsed


@contextmanager
def lab_and_service(hosts: int) -> Iterator[Bench]:
    lab = Lab("bench-update", Config.from_env())
    work = Path(tempfile.mkdtemp(prefix="bench-update-"))
    service: Service | None = None
    try:
        lab.up(hosts, owner_pid=os.getpid())
        for host in lab.hosts():
            install_standins(lab_run_on_host(lab, host), version=VERSION)
        names = [f"bench-{n:02d}" for n in range(1, hosts + 1)]
        inventory = work / "inventory.yaml"
        inventory.write_text(render(lab, "service", names))
        service = start(inventory, lab, work / "runs", work / "service.log")
        yield Bench(lab, service, work, names)
    finally:
        if service is not None:
            service.stop()
            close_control_masters(service.runs_dir)
        close_control_masters(work / "raw")
        lab.down()


def start(inventory: Path, lab: Lab, runs_dir: Path, log: Path) -> Service:
    argv = [
        sys.executable, "-m", "extension", "serve", "--listen", "127.0.0.1:0", "--plain-http",
        "--inventory", str(inventory), "--allowed-cidrs", str(lab.network), "--runs-dir", str(runs_dir),
        "--retry-after-seconds", "1", "--max-parallel-runs", "10", "--log-level", "WARNING",
    ]  # fmt: skip
    return Service(argv, log, runs_dir)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3, help="alternating service/raw rounds (median)")
    parser.add_argument("--hosts", type=int, default=10, help="hosts for the many-at-once case")
    opts = parser.parse_args()
    with lab_and_service(opts.hosts) as bench, MemorySampler() as memory:
        one = bench.names[0]
        # warm-up (ssh masters, page cache) for both ways, not counted
        bench.update(one, spec("warm", 100))
        bench.raw(one, spec("warm", 101), "warm-raw")
        service_times, raw_times, calls, cpu_one = [], [], [], []
        for r in range(opts.rounds):
            cpu = children_cpu_seconds(bench.service.proc.pid)
            t, polled = bench.update(one, spec(f"svc{r}", 110 + r))
            cpu_one.append(children_cpu_seconds(bench.service.proc.pid) - cpu)
            service_times.append(t)
            calls.append(polled.calls)
            raw_times.append(bench.raw(one, spec(f"raw{r}", 120 + r), f"raw{r}"))
        svc, raw = statistics.median(service_times), statistics.median(raw_times)

        cpu = children_cpu_seconds(bench.service.proc.pid)
        started = time.monotonic()
        with ThreadPoolExecutor(len(bench.names)) as pool:
            list(pool.map(lambda n: bench.update(n, spec("many", 130)), bench.names))
        many = time.monotonic() - started
        cpu_many = (children_cpu_seconds(bench.service.proc.pid) - cpu) / len(bench.names)

        # no-op: the fingerprint the service just applied (memory) ...
        started = time.monotonic()
        _, noop_polled = bench.update(one, spec("many", 130))
        noop_memory = time.monotonic() - started
        # ... and after a restart that lost the runs dir: a run that finds the host stamp
        restarted = start(
            bench.work / "inventory.yaml",
            bench.lab,
            bench.work / "runs-restarted",
            bench.work / "restarted.log",
        )
        try:
            started = time.monotonic()
            noop_run = poll_update_machine(restarted.client, one, spec("many", 130), within=120)
            noop_stamp = time.monotonic() - started
            restarted_rss = peak_rss_mb(restarted.proc.pid)
        finally:
            restarted.stop()
            close_control_masters(restarted.runs_dir)
        service_rss = peak_rss_mb(bench.service.proc.pid)

    # a batch carries several Machines: its peak shared out over the hosts it held in flight
    runs = [kb / 1024 / _hosts_in(key) for key, kb in memory.peaks.items() if not key.startswith("raw-")]
    batches = [kb / 1024 for key, kb in memory.peaks.items() if not key.startswith("raw-")]
    raws = [kb / 1024 for key, kb in memory.peaks.items() if key.startswith("raw-")]
    times = ", ".join(f"{t:.2f}" for t in service_times)
    raw_list = ", ".join(f"{t:.2f}" for t in raw_times)
    report = [
        (
            f"bench/update.py: {opts.rounds} rounds, {opts.hosts} hosts",
            f"{os.cpu_count()} CPUs, shared with the lab",
        ),
        ("one host, files+kubelet_args: service", f"{svc:6.2f} s  median of {times}"),
        ("  UpdateMachine calls per update", f"{statistics.median(calls):6.0f}    (retryAfterSeconds 1)"),
        ("  raw ansible-playbook, same inputs", f"{raw:6.2f} s  median of {raw_list}"),
        ("  overhead service / raw", f"{svc / raw:6.2f}x   target <= 1.15x"),
        (f"{opts.hosts} hosts at once", f"{many:6.2f} s"),
        (f"  {opts.hosts} hosts / one host", f"{many / svc:6.2f}x   target <= 1.5x"),
        (
            "  controller CPU per host update",
            f"{statistics.median(cpu_one):6.2f} s alone, {cpu_many:.2f} s in the batch",
        ),
        (
            "no-op, fingerprint applied (memory)",
            f"{noop_memory:6.3f} s  {noop_polled.calls} call, target <= 2 s",
        ),
        (
            "no-op after restart, empty runs dir",
            f"{noop_stamp:6.2f} s  {noop_run.calls} calls, stamp on host",
        ),
        ("peak RSS, service process", f"{service_rss:6.1f} MB  (restarted service: {restarted_rss:.1f} MB)"),
    ]
    if runs:
        report.append(
            (
                "peak PSS per in-flight run",
                f"{max(runs):6.1f} MB  max over {len(runs)} plays, target <= 100 MB",
            )
        )
        report.append(
            ("peak PSS of one play (process tree)", f"{max(batches):6.1f} MB  (all the Machines it carried)")
        )
    if raws:
        report.append(("peak PSS, raw ansible-playbook tree", f"{max(raws):6.1f} MB"))
    for label, value in report:
        print(f"{label:<40} {value}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
