"""Benchmark: the two executors side by side, ten Machines updated at once with each, in one run.

Brings up its own labs: a kubelab (flavour ``nodes``: kube-scheduler and the Job controller), two real
nodes (hostlab nodes joined with ``kubeadm join``, the project's image and the stand-in pause image
imported into their containerd, as tests/nodes does) where the Jobs run, and ten lab SSH hosts (the
Kubernetes stand-ins of tests/playbooks/standins.py) that are the Machines' hosts. Each Machine is
written as CAPI's Machine controller leaves one (``status.addresses``, ``status.nodeRef``) and its Node is
a kwok Node (a stand-in: no kubelet behind it, kwok keeps it Ready and reports the stand-in kubelet's
version); kwok Nodes carry no ``kubernetes.io/os`` label, so the Jobs (``nodeSelector`` on it) land only
on the real nodes. The targets are the same ten hosts for both executors.

For each executor in turn, the real ``inplace-extension serve`` as a process in the Kubernetes-aware mode
(``--kubeconfig``: the ``kubernetes`` executor needs cluster access) with the same flags but
``--executor``: ``local`` (plays in worker threads of the service) and ``kubernetes`` (each attempt a Job
from the image, its record an annotation on the Machine). One warm-up update (not counted), then a
files update of all ten Machines at once, each polled like CAPI (retryAfterSeconds 1) until done. It
prints per executor:

- the service's CPU seconds (its own and its waited-for children's, the local executor's plays, from
  ``/proc/<pid>/stat``), its peak RSS (``VmHWM``) and the peak PSS of its whole process tree (sampled every
  100 ms) above the tree's PSS before the ten started, and both per in-flight update;
- for ``kubernetes``, the Jobs' cost apart, from each Job container's cgroup (:class:`JobsSampler`:
  CPU, its memory peak, the peak of all of them at once), the Pods Running at once and the Jobs' own
  API requests;
- the time to the last Machine done, and the UpdateMachine calls;
- the API requests the service made: the service authenticates as its own ServiceAccount, and a
  FlowSchema of the bench matches exactly that account (another the Jobs' account), so the API server's
  ``apiserver_flowcontrol_dispatched_requests_total`` of that FlowSchema, before and after, is the
  service's requests (watches counted once, at their start); beside it ``apiserver_request_total`` of
  all clients (controllers, kube-scheduler, kubelets, kwok) in the same window;
- the Events the updates posted, the objects left in the API (Jobs, their Pods and Secrets), the
  record's size on each Machine and the largest Job, Pod and Secret as JSON.

The Jobs' Pods reach the hosts' lab through a route in each node and a masquerade rule on this machine
(:func:`hostlab.routes.routed`). Exits 1 only when a run is broken (a Machine not updated, a lab or service
that does not start, the service's requests or a Job's cgroup not found). Needs root (the labs);
everything it started is stopped at the end (the services by PID, the labs, the rule, the work dir).

    .venv/bin/python bench/executors.py [--machines 10]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the CAPI driver, the labs' helpers and the stand-ins
sys.path.append(str(ROOT))  # bench.procs (appended: tests/playbooks must win over playbooks/)

from e2e.capi import NodeSpec, poll_update_machine  # noqa: E402
from e2e.service import Service, serve_argv  # noqa: E402
from hostlab.config import Config  # noqa: E402
from hostlab.errors import LabError  # noqa: E402
from hostlab.inventory import render  # noqa: E402
from hostlab.lab import Host  # noqa: E402
from hostlab.lab import Lab as HostLab  # noqa: E402
from hostlab.routes import routed  # noqa: E402
from hostlab.state import NODE  # noqa: E402
from kubelab import manifests, node_join, objects  # noqa: E402
from kubelab.flavours import capi_objects as co  # noqa: E402
from kubelab.lab import Lab as KubeLab  # noqa: E402
from nodes.conftest import Cluster  # noqa: E402
from nodes.images import import_pause, node_image  # noqa: E402
from nodes.operator import ATTEMPT_ACCOUNT, operator_objects  # noqa: E402
from nodes.test_node_jobs import _diagnosis  # noqa: E402
from playbooks.standins import install_standins, lab_run_on_host  # noqa: E402

from bench.procs import Sampler, TreeSampler, cpu_seconds, peak_rss_mb, tree_pss_kb  # noqa: E402
from inplace_extension.kubejobs.record import RECORD_ANNOTATION  # noqa: E402
from inplace_extension.plays.ssh import close_control_masters  # noqa: E402

VERSION = "v1.30.2"  # the stand-ins' kubelet on the hosts, and what their kwok Nodes report
NAMESPACE = "e2e"  # tests/e2e/capi.py's UpdateMachine requests name this namespace
JOB_NODES = 2
WITHIN = 900.0  # one Machine's polls: ten Jobs start on two busy cores
SERVICE_NAMESPACE = "bench-service"
SERVICE_ACCOUNT = "inplace-extension"
# cgroup v1: the nodes share this machine's hierarchies (systemd-nspawn, no cgroup namespace), and their
# containerd (cgroupfs driver, the kubelet without QoS cgroups) makes each container's cgroup
# k8s.io/<container id> below these roots (at most CGROUP_DEPTH levels down)
CGROUP_ROOTS = {"cpu": Path("/sys/fs/cgroup/cpuacct"), "memory": Path("/sys/fs/cgroup/memory")}
CGROUP_DEPTH = 4
CGROUP_SECONDS = 0.2  # a container's cgroup goes when it exits: its last value is read this often
LIST_SECONDS = 2.0  # the Jobs' Pods listed this often, for their containers' ids
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")  # /proc/<pid>/stat's unit of CPU time
ATTEMPT_ARGV = b"\0attempt\0"  # the Job's own process (the container's command), among its processes
FLOW_METRIC = re.compile(
    r'^apiserver_flowcontrol_dispatched_requests_total\{[^}]*flow_schema="([^"]+)"[^}]*\} ([0-9.e+]+)$'
)
REQUEST_METRIC = re.compile(r"^apiserver_request_total\{[^}]*\} ([0-9.e+]+)$")


def files_spec(tag: str) -> NodeSpec:
    """Three files; ``tag`` makes the content (and the fingerprint) new for each executor's run."""
    file = {"owner": "root:root", "permissions": "0644"}
    files = [{**file, "path": f"/etc/bench/{n}.conf", "content": f"{n} {tag}\n"} for n in ("a", "b", "c")]
    return NodeSpec(VERSION, {"files": files})


def flow_schema(name: str, account: str, namespace: str) -> dict[str, Any]:
    """A FlowSchema matching exactly one ServiceAccount's requests, so its dispatched count is theirs."""
    everything = {"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"], "clusterScope": True}
    subject = {"kind": "ServiceAccount", "serviceAccount": {"name": account, "namespace": namespace}}
    return {
        "apiVersion": "flowcontrol.apiserver.k8s.io/v1",
        "kind": "FlowSchema",
        "metadata": {"name": name},
        "spec": {
            "priorityLevelConfiguration": {"name": "workload-high"},
            "matchingPrecedence": 100,  # before the suggested schemas (service-accounts: 9000)
            "distinguisherMethod": {"type": "ByUser"},
            "rules": [
                {
                    "subjects": [subject],
                    "resourceRules": [{**everything, "namespaces": ["*"]}],
                    "nonResourceRules": [{"verbs": ["*"], "nonResourceURLs": ["*"]}],
                }
            ],
        },
    }


@dataclass(frozen=True)
class ApiCounts:
    flows: dict[str, float]  # dispatched requests per FlowSchema
    all_requests: float  # apiserver_request_total, every client

    def minus(self, before: ApiCounts, schema: str) -> int:
        return round(self.flows.get(schema, 0.0) - before.flows.get(schema, 0.0))


def api_counts(kube: KubeLab) -> ApiCounts:
    with kube.http() as client:
        text = client.get("/metrics").text
    flows: dict[str, float] = {}
    total = 0.0
    for line in text.splitlines():
        if match := FLOW_METRIC.match(line):
            flows[match.group(1)] = flows.get(match.group(1), 0.0) + float(match.group(2))
        elif match := REQUEST_METRIC.match(line):
            total += float(match.group(1))
    return ApiCounts(flows, total)


def _containerd_dirs(root: Path) -> list[Path]:
    """The ``k8s.io`` cgroups (containerd's namespace of the kubelet) below ``root``."""
    found, level = [], [root]
    for _ in range(CGROUP_DEPTH):
        found += [d / "k8s.io" for d in level if (d / "k8s.io").is_dir()]
        level = [child for d in level for child in _subdirs(d) if child.name != "k8s.io"]
    return found


def _subdirs(path: Path) -> list[Path]:
    """The cgroups right below ``path`` (none if it went meanwhile: other work makes and removes some)."""
    try:
        return [child for child in path.iterdir() if child.is_dir()]
    except OSError:
        return []


def _own_cpu_ns(pid: int) -> int | None:
    """CPU time of process ``pid`` itself (user + system, without its children), in nanoseconds."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) * 1_000_000_000 // CLOCK_TICKS  # utime, stime


def _attempt_pid(cgroup: Path) -> int | None:
    """The ``inplace-extension attempt`` process in a Job container's cgroup (its children beside it)."""
    try:
        pids = [int(line) for line in (cgroup / "cgroup.procs").read_text().split()]
    except (OSError, ValueError):
        return None
    for pid in pids:
        try:
            if ATTEMPT_ARGV in Path(f"/proc/{pid}/cmdline").read_bytes():
                return pid
        except OSError:
            continue
    return None


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


class JobsSampler(Sampler):
    """The Jobs' own cost, from their containers' cgroups: each container's CPU (``cpuacct.usage``, its
    last value before the cgroup goes at the exit), its memory peak (``memory.max_usage_in_bytes``, page
    cache included) and the peak of all of them at once (``memory.usage_in_bytes``, summed). Of each
    container's CPU, the ``attempt`` process's own (``/proc/<pid>/stat``, its last value before it exits:
    Python's start-up and imports, ansible-runner's handling of the play's events, the API calls); the rest
    is its children's (detach.py, ``ansible-playbook`` and its forks, ssh). The Jobs'
    Pods are listed from the API for their containers' ids (as admin: not the service's FlowSchema;
    counted in :attr:`requests`, to be taken off the all-clients count); the pause containers are left
    out."""

    seconds = CGROUP_SECONDS
    join_seconds = 30.0  # a Pods list may be under way when the block ends

    def __init__(self, kube: KubeLab, namespace: str) -> None:
        super().__init__()
        self.kube, self.namespace = kube, namespace
        self.requests = 0
        self.cpu_ns: dict[str, int] = {}
        self.attempt_cpu_ns: dict[str, int] = {}  # the attempt process's own, of each container
        self._attempt_pids: dict[str, int] = {}
        self.memory_peak: dict[str, int] = {}
        self.together_peak = 0
        self.running_peak = 0  # Pods Running at once
        self._ids: set[str] = set()
        self._roots = {kind: _containerd_dirs(root) for kind, root in CGROUP_ROOTS.items()}
        self._scanned = time.monotonic()

    def _loop(self) -> None:
        # its own loop on Sampler's thread: one API client for the thread's life, and a sample at once
        listed = 0.0
        with self.kube.http() as api:
            while True:
                if time.monotonic() - listed >= LIST_SECONDS:
                    self._list(api)
                    listed = time.monotonic()
                self.sample()
                if self._stop.wait(self.seconds):
                    return

    def _list(self, api: Any) -> None:
        pods = api.get(f"/api/v1/namespaces/{self.namespace}/pods").json().get("items", [])
        self.requests += 1
        running = [p for p in pods if p.get("status", {}).get("phase") == "Running"]
        self.running_peak = max(self.running_peak, len(running))
        for pod in pods:
            for status in pod.get("status", {}).get("containerStatuses") or []:
                if status.get("containerID", "").startswith("containerd://"):
                    self._ids.add(status["containerID"].removeprefix("containerd://"))

    def _find(self, kind: str, ident: str) -> Path | None:
        found = next((d / ident for d in self._roots[kind] if (d / ident).is_dir()), None)
        if found is None and time.monotonic() - self._scanned >= 1.0:
            # a containerd that made its first cgroup since (the memory hierarchy: one per process tree)
            self._roots = {kind: _containerd_dirs(root) for kind, root in CGROUP_ROOTS.items()}
            self._scanned = time.monotonic()
            found = next((d / ident for d in self._roots[kind] if (d / ident).is_dir()), None)
        return found

    def sample(self) -> None:
        together = 0
        for ident in self._ids:
            if (cpu := self._find("cpu", ident)) is not None:
                used = _read_int(cpu / "cpuacct.usage")
                if used is not None:
                    self.cpu_ns[ident] = max(self.cpu_ns.get(ident, 0), used)
                self._sample_attempt(ident, cpu)
            if (memory := self._find("memory", ident)) is not None:
                peak = _read_int(memory / "memory.max_usage_in_bytes")
                if peak is not None:
                    self.memory_peak[ident] = max(self.memory_peak.get(ident, 0), peak)
                together += _read_int(memory / "memory.usage_in_bytes") or 0
        self.together_peak = max(self.together_peak, together)

    def _sample_attempt(self, ident: str, cgroup: Path) -> None:
        pid = self._attempt_pids.get(ident) or _attempt_pid(cgroup)
        if pid is None:
            return
        self._attempt_pids[ident] = pid
        own = _own_cpu_ns(pid)
        if own is not None:
            self.attempt_cpu_ns[ident] = max(self.attempt_cpu_ns.get(ident, 0), own)


@dataclass
class Rig:
    kube: KubeLab
    hosts_lab: HostLab
    nodes_lab: HostLab
    job_nodes: list[Host]
    names: list[str]
    image: str
    jobs_namespace: str
    kubeconfig: Path  # the service's ServiceAccount
    work: Path

    def record_bytes(self) -> list[int]:
        """The size of the kubernetes executor's record annotation on each Machine."""
        sizes = []
        for name in self.names:
            machine = objects.get(self.kube, "machine.cluster.x-k8s.io", name, NAMESPACE) or {}
            annotations = machine.get("metadata", {}).get("annotations", {})
            sizes.append(len(annotations.get(RECORD_ANNOTATION, "").encode()))
        return sizes

    def count(self, kind: str, namespace: str) -> int:
        listed = self.kube.kubectl("get", kind, "-n", namespace, "-o", "name", check=False).stdout
        return len(listed.split())

    def largest_json(self, kind: str, namespace: str) -> int:
        """The largest object of ``kind`` in ``namespace`` as compact JSON, in bytes (etcd keeps the
        built-in kinds as protobuf, smaller)."""
        listed = self.kube.kubectl("get", kind, "-n", namespace, "-o", "json", check=False).stdout
        items = json.loads(listed or "{}").get("items", [])
        return max((len(json.dumps(item, separators=(",", ":"))) for item in items), default=0)


def _machine(kube: KubeLab, name: str, host: Host) -> None:
    """``name``: a Machine as CAPI leaves one, its Node a kwok Node reporting the stand-ins' version."""
    objects.create_kwok_node(kube, name)
    status = {"status": {"nodeInfo": {"kubeletVersion": VERSION}}}
    kube.kubectl("patch", "node", name, "--subresource=status", "--type=merge", "-p", json.dumps(status))
    addresses = [{"type": "Hostname", "address": name}, {"type": "InternalIP", "address": host.address}]
    co.machine_with_status(kube, NAMESPACE, name, addresses, name)


def _service_kubeconfig(kube: KubeLab, path: Path) -> None:
    """A kubeconfig of the service's own ServiceAccount (bound to cluster-admin: the bench measures
    requests, not rights), so that its FlowSchema counts its requests and nobody else's."""
    objects.ensure_namespace(kube, SERVICE_NAMESPACE)
    account = {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {"name": SERVICE_ACCOUNT, "namespace": SERVICE_NAMESPACE},
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": f"{SERVICE_NAMESPACE}-admin"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
        "subjects": [{"kind": "ServiceAccount", "name": SERVICE_ACCOUNT, "namespace": SERVICE_NAMESPACE}],
    }
    objects.apply(kube, account, binding)
    token = kube.kubectl(
        "create", "token", SERVICE_ACCOUNT, "-n", SERVICE_NAMESPACE, "--duration=4h"
    ).stdout.strip()
    config = yaml.safe_load(kube.kubeconfig.read_text())
    config["users"] = [{"name": "service", "user": {"token": token}}]
    for context in config["contexts"]:
        context["context"]["user"] = "service"
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)


@contextmanager
def rig(machines: int) -> Iterator[Rig]:
    kube = KubeLab("bench-executors")
    hosts_lab = HostLab("bench-exec-hosts", Config.from_env())
    nodes_lab = HostLab("bench-exec-nodes", Config.from_env())
    work = Path(tempfile.mkdtemp(prefix="bench-executors-"))
    try:
        kube.up(owner_pid=os.getpid(), progress=lambda _: None)
        kube.ensure_flavour("nodes")
        job_nodes = nodes_lab.up(JOB_NODES, owner_pid=os.getpid(), kind=NODE)
        for host in job_nodes:
            node_join.join(kube, nodes_lab, host)
        import_pause(nodes_lab, job_nodes)
        image = node_image(Cluster(kube, nodes_lab, job_nodes, release_url=""))
        hosts = hosts_lab.up(machines, owner_pid=os.getpid())
        for host in hosts:
            install_standins(lab_run_on_host(hosts_lab, host), version=VERSION)
        names = [f"bench-{n:02d}" for n in range(1, machines + 1)]
        crd_names = ("machines", "machinedeployments", "clusters")
        crds = [manifests.capi_crd(kube, f"cluster.x-k8s.io_{name}.yaml") for name in crd_names]
        manifests.install_crds(kube, crds, only_missing=True)
        objects.ensure_namespace(kube, NAMESPACE)
        for name, host in zip(names, hosts, strict=True):
            _machine(kube, name, host)
        # the Jobs' namespace as an operator prepares it: their account, rights and policies
        jobs_namespace = "bench-jobs"
        objects.ensure_namespace(kube, jobs_namespace)
        objects.apply(kube, *operator_objects(jobs_namespace))
        kubeconfig = work / "service.kubeconfig"
        _service_kubeconfig(kube, kubeconfig)
        objects.apply(
            kube,
            flow_schema("bench-service", SERVICE_ACCOUNT, SERVICE_NAMESPACE),
            flow_schema("bench-jobs", ATTEMPT_ACCOUNT, jobs_namespace),
        )
        with routed(nodes_lab, hosts_lab):
            yield Rig(kube, hosts_lab, nodes_lab, job_nodes, names, image, jobs_namespace, kubeconfig, work)
    finally:
        hosts_lab.down()
        nodes_lab.down()
        kube.down()
        shutil.rmtree(work, ignore_errors=True)  # the services' logs and runs dirs


def start_service(rig: Rig, executor: str) -> Service:
    """The real ``serve``, Kubernetes-aware, with ``executor``; the same flags for both but the Jobs'."""
    home = rig.work / executor
    home.mkdir()
    inventory = home / "inventory.yaml"
    inventory.write_text(render(rig.hosts_lab, "service", rig.names))
    runs = home / "runs"
    argv = serve_argv(inventory, str(rig.hosts_lab.network), runs, "--playbooks-dir", str(ROOT / "playbooks"))
    argv += ["--max-parallel-runs", "10", "--log-level", "INFO"]
    argv += ["--kubeconfig", str(rig.kubeconfig), "--workload-kubeconfig", "management"]
    argv += ["--executor", executor]
    if executor == "kubernetes":
        argv += ["--job-namespace", rig.jobs_namespace, "--job-image", rig.image]
        argv += ["--job-playbooks-dir", "/opt/inplace-extension/playbooks", "--job-deadline-seconds", "900"]
    return Service(argv, home / "service.log", runs)


@dataclass
class Figures:
    executor: str
    load_before: float
    load_after: float
    wall: float  # to the last Machine done
    calls: int  # UpdateMachine calls, all ten
    cpu: float  # the service's own + its waited-for children's
    rss_mb: float  # the service's peak RSS (VmHWM), whole life
    tree_mb: float  # peak PSS of the service's tree above its PSS before the ten
    requests: int  # the service's API requests (its FlowSchema)
    all_requests: int  # every client's, in the same window
    events: int  # Events the ten updates posted on their Machines
    job_requests: int = 0
    jobs_cpu: float | None = None
    attempts_cpu: float | None = None  # of jobs_cpu, the attempt processes' own
    jobs_memory_mb: list[float] | None = None  # one Job's peak, all Jobs' at once
    jobs_running: int = 0
    objects: dict[str, int] | None = None
    record_bytes: list[int] | None = None
    sizes: dict[str, int] | None = None  # the largest Job, Pod, Secret as JSON


def update(rig: Rig, service: Service, name: str, spec: NodeSpec) -> int:
    polled = poll_update_machine(service.client, name, spec, within=WITHIN)
    if (polled.status, polled.message) != ("Success", "update applied"):
        # the Jobs' Pods and their logs (printed in full), the service's log: what broke the run
        _diagnosis(Cluster(rig.kube, rig.nodes_lab, rig.job_nodes, release_url=""), rig.jobs_namespace)
        raise SystemExit(f"bench: {name} was not updated: {polled.messages}\n{service.log()[-4000:]}")
    calls: int = polled.calls
    return calls


def measure(rig: Rig, executor: str) -> Figures:
    service = start_service(rig, executor)
    try:
        update(rig, service, rig.names[0], files_spec(f"warm-{executor}"))  # not counted
        pid = service.proc.pid
        kubernetes = executor == "kubernetes"
        load_before = os.getloadavg()[0]
        cpu, tree_before, api = cpu_seconds(pid), tree_pss_kb(pid), api_counts(rig.kube)
        events = rig.count("events", NAMESPACE)
        spec = files_spec(f"ten-{executor}")
        started = time.monotonic()
        with (
            TreeSampler(pid) as tree,
            JobsSampler(rig.kube, rig.jobs_namespace) as jobs,
            ThreadPoolExecutor(len(rig.names)) as pool,
        ):
            calls = sum(pool.map(lambda name: update(rig, service, name, spec), rig.names))
            wall = time.monotonic() - started
        after = api_counts(rig.kube)
        if "bench-service" not in after.flows:  # the service's requests went uncounted: a broken run
            raise SystemExit("bench: the API server counted no request of the service's FlowSchema")
        figures = Figures(
            executor=executor,
            load_before=load_before,
            load_after=os.getloadavg()[0],
            wall=wall,
            calls=calls,
            cpu=cpu_seconds(pid) - cpu,
            rss_mb=peak_rss_mb(pid),
            tree_mb=max(0, tree.peak_kb - tree_before) / 1024,
            requests=after.minus(api, "bench-service"),
            all_requests=round(after.all_requests - api.all_requests) - jobs.requests,
            events=rig.count("events", NAMESPACE) - events,
        )
        if kubernetes:
            figures.job_requests = after.minus(api, "bench-jobs")
            if len(jobs.cpu_ns) < len(rig.names):  # a Job's cgroup never seen: its cost would be missing
                raise SystemExit(f"bench: the cgroups of {len(jobs.cpu_ns)} of the Jobs' Pods were found")
            figures.jobs_cpu = sum(jobs.cpu_ns.values()) / 1e9
            figures.attempts_cpu = sum(jobs.attempt_cpu_ns.values()) / 1e9
            figures.jobs_memory_mb = [max(jobs.memory_peak.values()) / 2**20, jobs.together_peak / 2**20]
            figures.jobs_running = jobs.running_peak
            figures.objects = {
                "Jobs": rig.count("jobs", rig.jobs_namespace),
                "Pods": rig.count("pods", rig.jobs_namespace),
                "Secrets": rig.count("secrets", rig.jobs_namespace) - 1,  # less the SSH key's
            }
            figures.record_bytes = rig.record_bytes()
            figures.sizes = {
                kind: rig.largest_json(kind, rig.jobs_namespace) for kind in ("jobs", "pods", "secrets")
            }
        return figures
    finally:
        service.stop()
        close_control_masters(service.runs_dir)


def report(machines: int, runs: list[Figures]) -> list[str]:
    lines = []
    for f in runs:
        n = machines
        lines += [
            f"{f.executor}   (load average {f.load_before:.1f} -> {f.load_after:.1f})",
            f"  time to the last Machine done        {f.wall:7.2f} s   ({f.calls} UpdateMachine calls)",
            f"  service CPU (own + plays)            {f.cpu:7.2f} s   {f.cpu / n:.2f} s per update in flight",
            f"  service peak RSS (VmHWM)             {f.rss_mb:7.1f} MB",
            f"  service tree peak PSS above idle     {f.tree_mb:7.1f} MB  {f.tree_mb / n:.1f} MB per update",
            f"  service API requests                 {f.requests:7d}     {f.requests / n:.1f} per update, "
            f"{f.requests / f.wall:.1f}/s",
            f"  all clients' API requests, same time {f.all_requests:7d}     {f.all_requests / f.wall:.1f}/s",
            f"  Events posted on the Machines        {f.events:7d}     {f.events / n:.1f} per update",
        ]
        if f.jobs_cpu is not None and f.attempts_cpu is not None and f.jobs_memory_mb is not None:
            one, together = f.jobs_memory_mb
            per_job = f.job_requests / n
            own, children = f.attempts_cpu, f.jobs_cpu - f.attempts_cpu
            lines += [
                f"  Jobs' CPU (their Pods' cgroups)      {f.jobs_cpu:7.2f} s   {f.jobs_cpu / n:.2f} s a Job",
                f"    the attempt process's own          {own:7.2f} s   {own / n:.2f} s a Job",
                f"    its children (ansible-playbook...) {children:7.2f} s   {children / n:.2f} s a Job",
                f"  Jobs' peak memory                    {one:7.1f} MB  one Job, {together:.0f} MB at once",
                f"  Jobs' Pods Running at once (peak)    {f.jobs_running:7d}",
                f"  Jobs' API requests                   {f.job_requests:7d}     {per_job:.1f} per Job",
            ]
        if f.objects:
            left = ", ".join(f"{k} {v}" for k, v in f.objects.items())
            lines.append(f"  objects left in the API              {left} (warm-up included)")
        if f.record_bytes:
            sizes = f.record_bytes
            lines.append(f"  record annotation per Machine        {min(sizes)}-{max(sizes)} bytes")
        if f.sizes:
            largest = ", ".join(f"{k} {v}" for k, v in f.sizes.items())
            lines.append(f"  largest object as JSON, bytes        {largest}")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--machines", type=int, default=10, help="Machines updated at once (1..50)")
    opts = parser.parse_args()
    if not 1 <= opts.machines <= 50:
        parser.error("--machines must be 1..50")
    started = time.monotonic()
    try:
        with rig(opts.machines) as bench:
            print(
                f"bench/executors.py: {opts.machines} Machines at once per executor, files update, "
                f"{os.cpu_count()} CPUs shared with the labs (and other work on the machine); "
                f"labs up in {time.monotonic() - started:.0f} s",
                flush=True,
            )
            for executor in ("local", "kubernetes"):  # each printed as soon as measured
                print("\n".join(report(opts.machines, [measure(bench, executor)])), flush=True)
    except LabError as exc:
        print(f"bench: a lab did not start: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
