"""Benchmark: UpdateMachine end to end through the service vs ``ansible-playbook`` run directly, on lab hosts.

Brings up its own hostlab lab (10 hosts, Kubernetes stand-ins), starts ``inplace-extension serve
--plain-http`` on loopback and measures in one run: a files + kubelet_args update on one host, polled
like CAPI, against the same play run directly (alternating rounds, new content each time); all five
built-in capabilities on untouched hosts, and the same inputs again under a new fingerprint (every step
skipped on the stamp's per-step fingerprints); ten hosts
at once (controller CPU per host update); the no-op (from memory, and after a restart that lost the
runs dir); peak RSS of the service and peak PSS of each play. Module executions per role are counted
from the job events (bench/plays.py). Each line with a target says "met" or "MISSED"; the last line is
``targets met: N/M``. Needs root (the lab); the lab and the service are stopped at the end.

    .venv/bin/python bench/update.py [--rounds 3] [--hosts 10]
    .venv/bin/python bench/update.py --real-nodes [--rounds 5]   # a real node vs an SSH script, issue 31
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
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the e2e CAPI driver and the lab stand-ins live with the tests
sys.path.append(str(ROOT))  # bench.plays (appended: tests/playbooks must win over the playbooks/ directory)

from e2e.capi import NodeSpec, Polled, poll_update_machine  # noqa: E402
from e2e.service import Service, serve_argv  # noqa: E402
from hostlab.config import Config  # noqa: E402
from hostlab.inventory import render  # noqa: E402
from hostlab.lab import Lab  # noqa: E402
from playbooks.standins import install_standins, lab_run_on_host  # noqa: E402

from bench import nodes, plays  # noqa: E402
from bench.procs import MemorySampler, children_cpu_seconds, hosts_in, peak_rss_mb  # noqa: E402
from inplace_extension.inplace.plan import step_fingerprints  # noqa: E402
from inplace_extension.plays.ssh import close_control_masters  # noqa: E402

VERSION = "v1.30.2"


@dataclass
class Target:
    """One line of the report that has a target: the measured value, the limit, and whether it held."""

    label: str
    value: float
    unit: str
    limit: float
    note: str = ""

    @property
    def met(self) -> bool:
        return self.value <= self.limit

    def line(self) -> tuple[str, str]:
        fmt = f"{self.value:6.2f}{self.unit}"
        verdict = "met" if self.met else "MISSED"
        return self.label, f"{fmt:9} target <= {self.limit:g}{self.unit.strip()}  {verdict}  {self.note}"


def spec(tag: str, max_pods: int) -> NodeSpec:
    """A files + kubelet_args change; ``tag`` makes every round's content (and fingerprint) new."""
    file = {"owner": "root:root", "permissions": "0644"}
    files = [{**file, "path": f"/etc/bench/{n}.conf", "content": f"{n} {tag}\n"} for n in ("a", "b", "c")]
    args = {"nodeRegistration": {"kubeletExtraArgs": [{"name": "max-pods", "value": str(max_pods)}]}}
    return NodeSpec(VERSION, {"files": files, "joinConfiguration": args})


def all_five(tag: str) -> NodeSpec:
    """All five built-in capabilities: two users (keys, sudo), time servers, files, a kubelet flag and
    the version the stand-ins already have (kubernetes_version runs and finds it in place)."""
    node = spec(tag, 90)
    key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl bench@lab"
    users = [
        {"name": "ops", "groups": "adm", "sudo": "ALL=(ALL) NOPASSWD:ALL", "sshAuthorizedKeys": [key]},
        {"name": "audit", "gecos": "Read-only audit", "sshAuthorizedKeys": [key]},
    ]
    ntp = {"enabled": True, "servers": ["0.pool.ntp.org", "192.0.2.10"]}
    return NodeSpec(VERSION, {**node.kubeadm, "users": users, "ntp": ntp})


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

    def executions(self, name: str) -> dict[str, plays.Count]:
        """Module executions per role on ``name``'s host in the service's last attempt for ``name``."""
        _, meta = self._last_attempt(name)
        events = plays.read_events(Path(meta["batch_dir"]) / "artifacts" / meta["batch_ident"])
        return plays.count(events, meta["host"])

    def _last_attempt(self, name: str) -> tuple[Path, dict[str, Any]]:
        last = max(self.service.runs_dir.glob(f"e2e.{name}.*/attempt-*"), key=lambda p: p.stat().st_mtime)
        return last, json.loads((last / "meta.json").read_text())

    def raw(self, name: str, node: NodeSpec, tag: str) -> float:
        """The service's last inputs for ``name`` with this round's file content and kubelet flag, played
        by ``ansible-playbook`` directly (see ``raw_play``)."""
        last, _ = self._last_attempt(name)
        inputs = json.loads((last / "inputs.json").read_text())
        inputs["kubeadm_files"]["kubeadm_files_files"] = [
            {**f, "content": f"{Path(f['path']).stem} {tag}\n"}
            for f in inputs["kubeadm_files"]["kubeadm_files_files"]
        ]
        max_pods = node.kubeadm["joinConfiguration"]["nodeRegistration"]["kubeletExtraArgs"][0]["value"]
        for arg in inputs["kubelet_args"]["kubelet_args_extra_args"]:
            arg["value"] = max_pods
        fingerprint = hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()
        return self.raw_play(name, inputs, fingerprint)

    def again(self, name: str) -> float:
        """The service's last inputs for ``name`` unchanged, under a new fingerprint: the host's stamp shows
        every step applied with these inputs, so every role is skipped (the lock and the stamp remain)."""
        last, _ = self._last_attempt(name)
        inputs = json.loads((last / "inputs.json").read_text())
        return self.raw_play(name, inputs, hashlib.sha256(os.urandom(16)).hexdigest())

    def raw_play(self, name: str, inputs: dict[str, Any], fingerprint: str) -> float:
        """The same playbook, host variables and ansible.cfg as the service's last run for ``name``, started
        directly as ``ansible-playbook`` for that one host (what an operator would type)."""
        _, meta = self._last_attempt(name)
        batch_dir = Path(meta["batch_dir"])
        command = json.loads((batch_dir / "artifacts" / meta["batch_ident"] / "command").read_text())
        hosts = json.loads((batch_dir / "inventory" / "hosts.json").read_text())["all"]["hosts"]
        host_vars = {k: v for k, v in hosts[meta["host"]].items() if not k.startswith("update_machine_")}
        raw_dir = Path(tempfile.mkdtemp(prefix="bench-raw-ansible-", dir=self.work))
        inputs_file = raw_dir / "inputs.json"
        inputs_file.write_text(json.dumps(inputs))
        inventory = raw_dir / "hosts.json"
        inventory.write_text(json.dumps({"all": {"hosts": {name: host_vars}}}))
        extravars = {
            "update_machine_ident": f"raw.{name}.{fingerprint[:12]}",
            "update_machine_fingerprint": fingerprint,
            # as the service passes them (inplace_extension.plays.runner.run_parameters)
            "update_machine_step_fingerprints": step_fingerprints(inputs),
            "update_machine_capabilities": list(inputs),
            "update_machine_inputs_file": str(inputs_file),
        }
        argv = ["ansible-playbook", command["command"][1], "-i", str(inventory), "-e", json.dumps(extravars)]
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


def batch_cpu(hosts: int = 10) -> float:
    """Controller CPU per host update in one batch of ``hosts`` lab hosts (issue 31's third target): its
    own lab and service; a first batch (the hosts' first plays: every step runs) not counted, then the
    same files + kubelet_args change with new content on all of them at once, counted."""
    with lab_and_service(hosts) as bench:

        def batch(tag: str, max_pods: int) -> None:
            with ThreadPoolExecutor(len(bench.names)) as pool:
                list(pool.map(lambda n: bench.update(n, spec(tag, max_pods)), bench.names))

        batch("warm", 140)
        cpu = children_cpu_seconds(bench.service.proc.pid)
        batch("counted", 141)
        return (children_cpu_seconds(bench.service.proc.pid) - cpu) / len(bench.names)


def start(inventory: Path, lab: Lab, runs_dir: Path, log: Path) -> Service:
    flags = ("--max-parallel-runs", "10", "--log-level", "WARNING")
    return Service(serve_argv(inventory, str(lab.network), runs_dir, *flags), log, runs_dir)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3, help="alternating service/raw rounds (median)")
    parser.add_argument("--hosts", type=int, default=10, help="hosts for the many-at-once case (>= 2)")
    parser.add_argument(
        "--real-nodes",
        action="store_true",
        help="instead: files + kubelet_args on a real node against an SSH script, and issue 31's four "
        "targets (bench/nodes.py); exits 1 when one is missed",
    )
    parser.add_argument(
        "--retry-after-seconds",
        type=int,
        default=None,
        help="with --real-nodes: the service's --retry-after-seconds (default: its own, 10; the bench "
        "passed 1 before issue 31's item 3, for a before/after run of an older revision)",
    )
    opts = parser.parse_args()
    if opts.real_nodes:
        return nodes.main(opts.rounds, batch_cpu, opts.retry_after_seconds)
    load_before = os.getloadavg()[0]
    with lab_and_service(max(opts.hosts, 2)) as bench, MemorySampler() as memory:
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
        one_plays = bench.executions(one)

        # all five capabilities on hosts nothing has touched yet, then the same inputs again under a
        # new fingerprint (every role runs, finds its target in place)
        fresh = bench.names[1 : 1 + min(opts.rounds, len(bench.names) - 1)]
        scratch = [bench.update(name, all_five("scratch"))[0] for name in fresh]
        scratch_plays = bench.executions(fresh[-1])
        again = [bench.again(name) for name in fresh]

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
        work = bench.work
        restarted = start(work / "inventory.yaml", bench.lab, work / "runs-restarted", work / "restarted.log")
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
    runs = [kb / 1024 / hosts_in(key) for key, kb in memory.peaks.items() if not key.startswith("raw-")]
    batches = [kb / 1024 for key, kb in memory.peaks.items() if not key.startswith("raw-")]
    raws = [kb / 1024 for key, kb in memory.peaks.items() if key.startswith("raw-")]
    raw_times = [round(t, 2) for t in raw_times]
    listed = ", ".join
    targets = [
        Target(
            "one host, files+kubelet_args: service",
            svc,
            " s",
            1.5,
            f"median of {listed(f'{t:.2f}' for t in service_times)}",
        ),
        Target("  overhead service / raw ansible-playbook", svc / raw, "x", 1.15),
        Target(
            "all five capabilities from scratch",
            statistics.median(scratch),
            " s",
            2.5,
            f"median of {listed(f'{t:.2f}' for t in scratch)} (service)",
        ),
        Target(
            "same inputs, new fingerprint",
            statistics.median(again),
            " s",
            2.0,
            f"median of {listed(f'{t:.2f}' for t in again)} (raw play)",
        ),
        Target(
            "controller CPU per host, 10-host batch",
            cpu_many,
            " s",
            0.5,
            f"(alone: {statistics.median(cpu_one):.2f} s)",
        ),
        Target(f"{opts.hosts} hosts at once / one host", many / svc, "x", 1.5, f"({many:.2f} s)"),
        Target("no-op, fingerprint applied (memory)", noop_memory, " s", 2.0, f"{noop_polled.calls} call"),
    ]
    if runs:
        targets.append(
            Target("peak PSS per in-flight run", max(runs), " MB", 100, f"max over {len(runs)} plays")
        )
    report = [
        (
            f"bench/update.py: {opts.rounds} rounds, {opts.hosts} hosts",
            f"{os.cpu_count()} CPUs shared with the lab, load average {load_before:.1f} at the start",
        ),
        targets[0].line(),
        ("  UpdateMachine calls per update", f"{statistics.median(calls):6.0f}    (retryAfterSeconds 1)"),
        ("  raw ansible-playbook, same inputs", f"{raw:6.2f} s   median of {listed(map(str, raw_times))}"),
        targets[1].line(),
        ("  module executions, last round", "(per role; on host = SSH round trips)"),
        *((line, "") for line in plays.render(one_plays, indent="    ")),
        targets[2].line(),
        ("  module executions, last host", ""),
        *((line, "") for line in plays.render(scratch_plays, indent="    ")),
        targets[3].line(),
        targets[4].line(),
        targets[5].line(),
        targets[6].line(),
        ("no-op after restart, empty runs dir", f"{noop_stamp:6.2f} s   {noop_run.calls} calls (stamp)"),
        ("peak RSS, service process", f"{service_rss:6.1f} MB  (restarted service: {restarted_rss:.1f} MB)"),
        *(t.line() for t in targets[7:]),
    ]
    if batches:
        report.append(("peak PSS of one play (process tree)", f"{max(batches):6.1f} MB  (all its Machines)"))
    if raws:
        report.append(("peak PSS, raw ansible-playbook tree", f"{max(raws):6.1f} MB"))
    report.append(("load average at the end", f"{os.getloadavg()[0]:6.1f}"))
    for label, value in report:
        print(f"{label:<42} {value}".rstrip())
    print(f"targets met: {sum(t.met for t in targets)}/{len(targets)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
