"""The ``kubernetes`` executor under the real CAPI v1.14.2 controllers, with the service at two replicas:
each attempt a real Job on a real node joined to the CAPI lab's kube-apiserver.

Real: kube-apiserver, CAPI core/KCP/CABPK/CAPD, the Job controller, the TTL-after-finished controller
and kube-scheduler (kubelab flavour ``nodes`` added to the CAPI lab), one hostlab node (systemd,
containerd, a kubelet joined with ``kubeadm join``), the project's own image imported into it, two
``inplace-extension serve --executor --kubernetes`` processes (each with its own empty runs dir:
they share nothing but the API server and their configuration files, as two Pods of the Deployment
share a ConfigMap), the play over SSH from the Job's Pod to the hostlab hosts the Machines map to.

Stand-ins: the Service in front of the replicas is :class:`balancer.Balancer` (a round-robin TCP
forwarder, the one URL of the ExtensionConfig); the node's pause image and kube-proxy, as in
tests/nodes; the machines' cloud is CAPD's in-memory backend, their Nodes are Node objects in the
management cluster named like the Machines' ``status.nodeRef`` (``--workload-kubeconfig management``,
as tests/capi_lab/kube_aware_rollout.py), made Ready at the Machines' version; the Kubernetes binaries on
the hosts are tests/playbooks/standins.py's. The node lab's /24 reaches the host lab's through
:func:`hostlab.routes.routed`.

One node join and one image import for the module; the tests run one after the other on its two
clusters (a MachineDeployment of 3, and a MachineDeployment of 1 held by a maintenance window).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast

import pytest
import yaml
from deploy.image import missing_tools
from e2e.conftest import START_VERSION
from e2e.hostcheck import run_on, stamp_writes
from e2e.service import Service
from hostlab import prereqs
from hostlab.config import Config as HostConfig
from hostlab.errors import LabError
from hostlab.inventory import service_inventory
from hostlab.lab import Host
from hostlab.lab import Lab as HostLab
from hostlab.pytest_plugin import unavailable
from hostlab.routes import routed
from hostlab.state import NODE
from kubelab import node_join, objects
from kubelab.flavours import capi_objects as co
from kubelab.lab import Lab
from nodes.images import import_pause, import_service_image
from nodes.operator import jobs_namespace

from inplace_extension.kubejobs.manifest import (
    ATTEMPT_LABEL,
    DEPLOYMENT_LABEL,
    MACHINE_LABEL,
    NAMESPACE_LABEL,
)
from inplace_extension.kubejobs.record import RECORD_ANNOTATION
from inplace_extension.runs.ssh import close_control_masters
from inplace_extension.runs.windows import WINDOW_RETRY_CAP_SECONDS

from .balancer import Balancer
from .conftest import SELECTOR_KEY, Extension, registered, serve_argv, worker_id
from .rollout import (
    HOST_FILE,
    MACHINES,
    ROLLOUT_TIMEOUT,
    Cluster,
    create_cluster,
    files_and_user,
    rolled_out,
    wait,
)

pytestmark = [pytest.mark.kube, pytest.mark.capi, pytest.mark.lab]

EXTENSION = "capi-jobs"
TTL_SECONDS = 3600  # --job-ttl-seconds: long enough that the tests count every Job they made
DEADLINE_SECONDS = 600  # --job-deadline-seconds
WINDOW = "jobs-window"
WINDOW_CLUSTER = "jobwin"
# a rollout of 3 Jobs: each Pod starts on busy cores (minutes at a load average of 30), plays over SSH
JOBS_TIMEOUT = 900.0
# a file whose parent is a regular file: the files capability fails on every host, a terminal failure
BROKEN_FILE = "/etc/hostname/in-place.conf"


def ready_node(name: str) -> list[str]:
    """kubectl arguments that make Node ``name`` Ready at the Machines' version (its status subresource)."""
    status = {
        "status": {
            "nodeInfo": {"kubeletVersion": START_VERSION},
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "lab"}],
        }
    }
    return ["patch", "node", name, "--subresource=status", "--type=merge", "-p", json.dumps(status)]


@dataclass
class JobNode:
    """The real node the Jobs run on (a node lab of one), and the project's image in its containerd."""

    lab: HostLab
    host: Host
    image: str


@pytest.fixture(scope="module")
def job_node(kubelab_capi: Lab, lab: HostLab) -> Iterator[JobNode]:
    """One node joined to the CAPI lab (flavour ``nodes``), the pause and project images imported, its
    /24 routed to the host lab's; the Node deleted and the node lab down afterwards."""
    why = prereqs.missing(HostConfig.from_env(), NODE) or missing_tools()  # podman builds the images
    if why:
        unavailable(why)
    nodes = HostLab(f"pytest-{os.getpid()}-capi-jobs")
    joined: list[str] = []
    try:
        kubelab_capi.ensure_flavour("nodes")
        [host] = nodes.up(1, owner_pid=os.getpid(), kind=NODE)
        joined.append(host.name)
        node_join.join(kubelab_capi, nodes, host)
        import_pause(nodes, [host])
        image = import_service_image(nodes, [host])
        with routed(nodes, lab):
            yield JobNode(nodes, host, image)
    except LabError as exc:
        pytest.fail(f"the Jobs' node did not start: {exc}", pytrace=False)
    finally:
        for name in joined:
            kubelab_capi.kubectl("delete", "node", name, "--ignore-not-found", check=False)
        nodes.down()


@dataclass
class Replicas:
    """The service's replicas behind the balancer, registered with CAPI through one ExtensionConfig."""

    kube: Lab
    hosts: HostLab
    balancer: Balancer
    namespace: str  # of the Jobs
    image: str
    work: Path
    capabilities: Path
    inventory: Path
    running: dict[str, Service] = field(default_factory=dict)
    gone: list[Service] = field(default_factory=list)

    def argv(self, name: str) -> list[str]:
        runs = self.work / name / "runs"  # new and empty: nothing of another replica
        argv = serve_argv(
            self.kube, f"{EXTENSION}-{name}", self.inventory, self.hosts.network, runs, self.capabilities
        )
        argv += ["--kubeconfig", str(self.kube.kubeconfig), "--workload-kubeconfig", "management"]
        argv += ["--executor", "kubernetes", "--job-namespace", self.namespace, "--job-image", self.image]
        # the Jobs run the image's playbooks (this service runs the worktree's)
        argv += ["--job-playbooks-dir", "/opt/inplace-extension/playbooks"]
        argv += ["--job-deadline-seconds", str(DEADLINE_SECONDS), "--job-ttl-seconds", str(TTL_SECONDS)]
        return argv

    def serve(self, *names: str) -> list[Service]:
        """Start replicas ``names`` (new ones, empty runs dirs); the balancer sends to them from now on."""
        started = []
        for name in names:
            assert not (self.work / name).exists(), f"replica {name} ran before: its runs dir is not empty"
            (self.work / name).mkdir(parents=True)
            runs = self.work / name / "runs"
            service = Service(self.argv(name), self.work / f"service-{name}.log", runs, self.kube.ca)
            self.running[name] = service
            started.append(service)
        self.balancer.set_backends([self.port(s) for s in self.running.values()])
        return started

    @staticmethod
    def port(service: Service) -> int:
        return int(service.url.rsplit(":", 1)[1])

    def kill(self, name: str) -> None:
        """SIGKILL replica ``name`` (by PID), as an OOM kill or a node's loss would end its Pod."""
        service = self.running.pop(name)
        service.kill()
        self.gone.append(service)
        self.balancer.set_backends([self.port(s) for s in self.running.values()])

    def stop_all(self) -> None:
        for service in [*self.running.values(), *self.gone]:
            service.stop()
            close_control_masters(service.runs_dir)
        self.gone += self.running.values()
        self.running.clear()

    def log(self, name: str) -> str:
        path = self.work / f"service-{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""


@dataclass
class Module:
    """What the tests of this module share: the replicas, the Extension view the rollout helpers use,
    and the opening of the window cluster's maintenance window."""

    replicas: Replicas
    ext: Extension
    window_opens: datetime
    node: str  # the real node the Jobs run on (job_node's)


@pytest.fixture(scope="module")
def module(
    job_node: JobNode,
    kubelab_capi: Lab,
    lab: HostLab,
    e2e_capabilities: Path,
    tmp_path_factory: pytest.TempPathFactory,
    request: pytest.FixtureRequest,
) -> Iterator[Module]:
    worker = worker_id(request.config)
    name, selector = f"{EXTENSION}-{worker}", {SELECTOR_KEY: f"{worker}-jobs"}
    # short: ssh's ControlPath socket lives under each replica's runs dir (108-byte limit)
    work = tmp_path_factory.mktemp("cj")
    inventory = work / "inventory.yaml"
    inventory.write_text("hosts: []\n")
    # a window of the window cluster only, hours away: closed during the whole module
    opens = (datetime.now(UTC) + timedelta(hours=6)).replace(second=0, microsecond=0)
    capabilities = work / "capabilities.yaml"
    capabilities.write_text(
        e2e_capabilities.read_text() + "maintenance_windows:\n"
        f"  - name: {WINDOW}\n"
        f"    cron: '{opens.minute} {opens.hour} * * *'\n"
        "    duration: 1h\n"
        f"    labels: {{cluster.x-k8s.io/cluster-name: {WINDOW_CLUSTER}}}\n"
    )
    balancer = Balancer()
    with jobs_namespace(kubelab_capi) as namespace:
        replicas = Replicas(
            kubelab_capi, lab, balancer, namespace, job_node.image, work, capabilities, inventory
        )
        try:
            first, _ = replicas.serve("a", "b")
            ext = Extension(
                kubelab_capi,
                lab,
                [],
                kubelab_capi.ca,
                inventory,
                work / "a" / "runs",
                work,
                first,
                name,
                selector,
            )
            with registered(kubelab_capi, balancer.url, name, selector):
                yield Module(replicas, ext, opens, job_node.host.name)
        finally:
            replicas.stop_all()
            balancer.close()


def with_nodes(cluster: Cluster) -> Cluster:
    """The Machines' Nodes (``status.nodeRef``) as Ready Node objects in the management cluster."""
    for machine in co.machines(cluster.lab, cluster.namespace):
        node = machine["status"]["nodeRef"]["name"]
        objects.apply(cluster.lab, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}})
        cluster.lab.kubectl(*ready_node(node))
    return cluster


@pytest.fixture(scope="module")
def md(module: Module) -> Cluster:
    """A MachineDeployment of 3 (the rollouts), created while replicas a and b serve."""
    return with_nodes(create_cluster(module.ext, "jobs", START_VERSION, md_replicas=3))


@pytest.fixture(scope="module")
def held(module: Module) -> Cluster:
    """A MachineDeployment of 1 whose Machine the module's maintenance window holds: its new template is
    given at once, so it waits through the whole module. A wait is answered with retryAfterSeconds up to
    the opening, at most 300 s (``WINDOW_RETRY_CAP_SECONDS``), and CAPI calls no sooner: started first,
    its next call falls sooner into the test that replaces the replicas."""
    cluster = with_nodes(create_cluster(module.ext, WINDOW_CLUSTER, START_VERSION, md_replicas=1))
    cluster.new_bootstrap_template(files_and_user("in its window", "capiwin"))
    return cluster


def jobs(kube: Lab, namespace: str, selector: str) -> list[dict[str, Any]]:
    """The Jobs ``kubectl get jobs -l <selector>`` lists, by attempt."""
    listed = kube.kubectl("get", "jobs", "-n", namespace, "-l", selector, "-o", "json")
    items: list[dict[str, Any]] = json.loads(listed.stdout)["items"]
    return sorted(items, key=lambda job: int(job["metadata"]["labels"][ATTEMPT_LABEL]))


def job_names(replicas: Replicas, selector: str) -> list[str]:
    """The names of the Jobs (any replica's) that ``selector`` lists, by attempt."""
    return [j["metadata"]["name"] for j in jobs(replicas.kube, replicas.namespace, selector)]


def record(cluster: Cluster, machine: str) -> dict[str, Any] | None:
    """The executor's record on the Machine (None before its first attempt)."""
    found = objects.get(cluster.lab, MACHINES, machine, cluster.namespace) or {}
    value = found.get("metadata", {}).get("annotations", {}).get(RECORD_ANNOTATION)
    return json.loads(value) if value else None


def failed_events(cluster: Cluster, machine: str) -> list[str]:
    """The messages of the Machine's ``Failed`` Events (the service's failure message, in words)."""
    listed = json.loads(cluster.lab.kubectl("get", "events", "-n", cluster.namespace, "-o", "json").stdout)
    return [
        e["message"]
        for e in listed["items"]
        if e["involvedObject"].get("name") == machine and e["reason"] == "Failed"
    ]


def hook_calls(log: str, cluster: Cluster, machine: str) -> list[str]:
    """The decisions of the UpdateMachine calls one replica answered for ``machine``."""
    pattern = (
        rf"hook=UpdateMachine machine={re.escape(cluster.namespace)}/{re.escape(machine)} .*decision=(\w+)"
    )
    return re.findall(pattern, log)


def explain(replicas: Replicas, *clusters: Cluster) -> Callable[[], str]:
    def text() -> str:
        machines = [m for c in clusters for m in co.machines(c.lab, c.namespace)]
        listed = replicas.kube.kubectl(
            "get", "jobs,pods", "-n", replicas.namespace, "-o", "wide", check=False
        )
        logs = {n: replicas.log(n)[-2000:] for n in replicas.running}
        return f"{co.conditions_text(machines)}\n{listed.stdout}\n{json.dumps(logs, indent=1)}"

    return text


def test_a_rollout_of_3_through_2_replicas_survives_one_sigkilled_and_updates_each_host_once(
    module: Module, md: Cluster, held: Cluster, hosts: list[Host], lab: HostLab
) -> None:
    """(``held`` is made here: its Machine starts waiting for its window while this test runs.)"""
    replicas = module.replicas
    names = sorted(md.identities(md.md_machines()))
    md.ext.map_machines(names)
    template = md.new_bootstrap_template(files_and_user("from a Job", "capijobs"))
    selector = f"{DEPLOYMENT_LABEL}={md.md}"
    why = explain(replicas, md)

    # mid-rollout: the first Machine's Job exists; the replica that answered CAPI last is killed
    wait(lambda: bool(jobs(md.lab, replicas.namespace, selector)), ROLLOUT_TIMEOUT, "a first Job", why)
    answering = max(replicas.running, key=lambda n: replicas.log(n).count("hook=UpdateMachine"))
    survivor = next(n for n in replicas.running if n != answering)
    answered_before = len(re.findall("hook=UpdateMachine", replicas.log(survivor)))
    replicas.kill(answering)

    wait(lambda: rolled_out(md, template), JOBS_TIMEOUT, "the rollout finished through one replica", why)

    # the other replica answered CAPI after the kill (and said done)
    assert len(re.findall("hook=UpdateMachine", replicas.log(survivor))) > answered_before
    assert any("decision=done" in line for line in replicas.log(survivor).splitlines()), why()
    # each host updated exactly once (one stamp write), by one successful attempt: its last. An attempt
    # before it may have ended unreachable (SSH timing out on a busy machine): retried, nothing applied
    listed = jobs(md.lab, replicas.namespace, selector)
    node = replicas_node(module)
    per_machine: set[str] = set()
    for name, host in zip(names, hosts, strict=True):
        assert run_on(lab, host, ["cat", HOST_FILE]) == "from a Job\n", name
        assert len(stamp_writes(lab, host)) == 1, name
        found = record(md, name)
        assert found is not None, name
        attempts = found["attempts"]
        assert [a["o"]["kind"] for a in attempts][-1] == "successful", attempts
        assert all(a["o"]["kind"] == "unreachable" for a in attempts[:-1]), attempts
        # per Machine: `kubectl get jobs -l inplace-extension.io/machine=<name>`, as docs/operations.md says:
        # one Job per attempt, named in the record
        machine_jobs = jobs(md.lab, replicas.namespace, f"{MACHINE_LABEL}={name}")
        assert [j["metadata"]["name"] for j in machine_jobs] == [a["j"] for a in attempts]
        per_machine.update(j["metadata"]["name"] for j in machine_jobs)
        for number, job in enumerate(machine_jobs, start=1):
            labels = job["metadata"]["labels"]
            assert labels["app.kubernetes.io/name"] == "inplace-extension", labels
            assert labels["app.kubernetes.io/component"] == "attempt", labels
            assert (labels[NAMESPACE_LABEL], labels[ATTEMPT_LABEL]) == (md.namespace, str(number)), labels
            assert labels[DEPLOYMENT_LABEL] == md.md, labels
            assert job["spec"]["ttlSecondsAfterFinished"] == TTL_SECONDS, job["spec"]
            assert job["spec"]["activeDeadlineSeconds"] == DEADLINE_SECONDS, job["spec"]
            assert objects.condition(job, "Complete"), job.get("status")
            pods = md.lab.kubectl(
                "get",
                "pods",
                "-n",
                replicas.namespace,
                "-l",
                f"job-name={job['metadata']['name']}",
                "-o",
                "json",
            )
            [pod] = json.loads(pods.stdout)["items"]
            assert pod["spec"]["nodeName"] == node, pod["spec"].get("nodeName")
    # per MachineDeployment: `-l inplace-extension.io/machine-deployment=<md>` lists exactly those Jobs
    assert {j["metadata"]["name"] for j in listed} == per_machine


def replicas_node(module: Module) -> str:
    """The real node the Jobs' Pods run on (the Machines' Nodes have no capacity), by its name: other
    modules on the shared CAPI lab add kwok Nodes of their own, which report capacity."""
    node = json.loads(module.replicas.kube.kubectl("get", "node", module.node, "-o", "json").stdout)
    assert node.get("status", {}).get("allocatable"), node.get("status")
    return module.node


def test_fresh_replicas_with_empty_state_keep_a_failed_machine_blocked_and_a_held_one_waiting(
    module: Module, md: Cluster, held: Cluster, hosts: list[Host], lab: HostLab
) -> None:
    replicas = module.replicas
    replicas.serve("c", "d")  # whatever ran before (a killed replica's pair): two fresh ones from here
    for name in [n for n in replicas.running if n not in ("c", "d")]:
        replicas.kill(name)
    names = sorted(md.identities(md.md_machines()))
    [waiting] = held.identities(held.md_machines())
    # the MachineDeployment's Machines on the three hosts; the held Machine on the first (it never plays)
    inventory = service_inventory(lab, names)
    inventory["hosts"].append({**inventory["hosts"][0], "match": {"name": waiting}})
    replicas.inventory.write_text(yaml.safe_dump(inventory, sort_keys=False))
    stamps = {host.name: len(stamp_writes(lab, host)) for host in hosts}
    before_jobs = {n: job_names(replicas, f"{MACHINE_LABEL}={n}") for n in names}
    # the users and the file of the earlier template kept (dropping either is a rollout by replacement, not
    # in place: the file capability never removes a file), a file that cannot be written added
    broken = files_and_user("never written", "capijobs")
    broken["files"] = [*cast(list[object], broken["files"]), {"path": BROKEN_FILE, "content": "x\n"}]
    md.new_bootstrap_template(broken)
    expected_wait = f'waiting for maintenance window "{WINDOW}" (opens {module.window_opens:%Y-%m-%dT%H:%M}Z)'
    why = explain(replicas, md, held)

    def failed_machine() -> str | None:
        for name in names:
            found = record(md, name)
            attempts = found["attempts"] if found else []
            ended = (attempts[-1].get("o") or {}).get("kind") if attempts else None
            if ended == "task_failed" and failed_events(md, name):
                return name
        return None

    def held_waiting() -> bool:
        machine = held.md_machines()[0]
        return expected_wait in str((objects.condition(machine, "Updating") or {}).get("message", ""))

    wait(lambda: failed_machine() is not None, JOBS_TIMEOUT, "a Machine failed terminally", why)
    wait(held_waiting, ROLLOUT_TIMEOUT, f"{waiting} shows: {expected_wait}", why)
    blocked = failed_machine()
    assert blocked is not None
    before = record(md, blocked)
    assert before is not None
    [message] = set(failed_events(md, blocked))
    blocked_jobs = job_names(replicas, f"{MACHINE_LABEL}={blocked}")
    # its failed attempts, each one Job of its own (the Jobs of an earlier test's rollout stay too)
    assert len(blocked_jobs) - len(before_jobs[blocked]) == len(before["attempts"]) >= 1, before

    # every replica replaced by a fresh one with an empty runs dir (a rolling replacement of the Pods)
    replicas.serve("e", "f")
    replicas.kill("c")
    replicas.kill("d")

    def answered_by_fresh(decision: str, cluster: Cluster, machine: str) -> bool:
        return any(decision in hook_calls(replicas.log(n), cluster, machine) for n in ("e", "f"))

    wait(lambda: answered_by_fresh("failed", md, blocked), ROLLOUT_TIMEOUT, "a fresh replica answered", why)
    # CAPI asks about the held Machine again when the last answer's retryAfterSeconds (at most 300 s) ends
    wait(
        lambda: answered_by_fresh("in_progress", held, waiting),
        WINDOW_RETRY_CAP_SECONDS + 60,
        "a fresh replica answered the held Machine",
        why,
    )
    # blocked: the same failure, the same record, no new attempt or Job; the same message told again
    assert record(md, blocked) == before
    assert set(failed_events(md, blocked)) == {message}, failed_events(md, blocked)
    assert job_names(replicas, f"{MACHINE_LABEL}={blocked}") == blocked_jobs
    assert held_waiting(), why()
    # the held Machine: never an attempt, never a Job; no host was written by either
    assert record(held, waiting) is None
    assert jobs(held.lab, replicas.namespace, f"{MACHINE_LABEL}={waiting}") == []
    assert {host.name: len(stamp_writes(lab, host)) for host in hosts} == stamps
    for host in hosts:
        assert lab.exec_in(host, ["cat", HOST_FILE]).stdout != "in its window\n", host.name
    # the others of the MachineDeployment never got a Job for it (CAPI stops at the failed one)
    for name in names:
        if name != blocked:
            assert job_names(replicas, f"{MACHINE_LABEL}={name}") == before_jobs[name], name
