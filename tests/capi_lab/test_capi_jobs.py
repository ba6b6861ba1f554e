"""The ``kubernetes`` executor under the real CAPI v1.14.2 controllers, with the service at two replicas:
each attempt a real Job on a real node joined to the CAPI lab's kube-apiserver.

Real: kube-apiserver, CAPI core/KCP/CABPK/CAPD, the Job controller, the TTL-after-finished controller
and kube-scheduler (kubelab flavour ``nodes`` added to the CAPI lab), one hostlab node (systemd,
containerd, a kubelet joined with ``kubeadm join``), the project's own image imported into it, two
``inplace-extension serve --executor --kubernetes`` processes (each with its own empty runs dir:
they share nothing but the API server and their configuration files, as two Pods of the Deployment
share a ConfigMap), the play over SSH from the Job's Pod to the hostlab hosts the Machines map to.

The one URL of the ExtensionConfig is :class:`front.Front`, which hands CAPI's requests to the replicas
in turn and asks each of the other replica too, to compare the answers (a test harness). Stand-ins: the
node's pause image and kube-proxy, as in tests/nodes; the machines' cloud is CAPD's in-memory backend,
their Nodes are Node objects in the management cluster named like the Machines' ``status.nodeRef``
(``--workload-kubeconfig management``, as tests/capi_lab/kube_aware_rollout.py), made Ready at the
Machines' version; the Kubernetes binaries on the hosts are tests/playbooks/standins.py's. The node
lab's /24 reaches the host lab's through :func:`hostlab.routes.routed`. Except in the pair test: there
the Machines' Nodes are real nodes of the module's node lab joined under the Machines' Node names (a
self-managed cluster's workers), and the hosts the play reaches are those nodes.

One node join and one image import for the module (two more for the pair test); the tests run one after
the other on their clusters (a MachineDeployment of 3, one of 1 held by a maintenance window, and the
pair of real nodes).
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
from e2e.hostcheck import lock_events, run_on, stamp_writes
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
from kubelab.flavours import nodes as node_flavour
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
from inplace_extension.plays.ssh import close_control_masters
from inplace_extension.runs.windows import WINDOW_RETRY_CAP_SECONDS

from .conftest import SELECTOR_KEY, Extension, registered, serve_argv, worker_id
from .front import Exchange, Front
from .rollout import (
    HOST_FILE,
    MACHINES,
    MD,
    ROLLOUT_TIMEOUT,
    Cluster,
    create_cluster,
    files_and_user,
    owned_by_template,
    rolled_out,
    updated_in_place,
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
    """The service's replicas behind the front, registered with CAPI through one ExtensionConfig."""

    kube: Lab
    hosts: HostLab
    front: Front
    namespace: str  # of the Jobs
    image: str
    work: Path
    capabilities: Path
    inventory: Path
    node_network: str  # the Jobs' node lab's, whose nodes are also Machines' hosts (the pair test)
    running: dict[str, Service] = field(default_factory=dict)
    gone: list[Service] = field(default_factory=list)
    names: dict[int, str] = field(default_factory=dict)  # port -> replica

    def argv(self, name: str) -> list[str]:
        runs = self.work / name / "runs"  # new and empty: nothing of another replica
        argv = serve_argv(
            self.kube, f"{EXTENSION}-{name}", self.inventory, self.hosts.network, runs, self.capabilities
        )
        cidrs = argv.index("--allowed-cidrs") + 1
        argv[cidrs] = f"{argv[cidrs]},{self.node_network}"
        argv += ["--kubeconfig", str(self.kube.kubeconfig), "--workload-kubeconfig", "management"]
        argv += ["--executor", "kubernetes", "--job-namespace", self.namespace, "--job-image", self.image]
        # the Jobs run the image's playbooks (this service runs the worktree's)
        argv += ["--job-playbooks-dir", "/opt/inplace-extension/playbooks"]
        argv += ["--job-deadline-seconds", str(DEADLINE_SECONDS), "--job-ttl-seconds", str(TTL_SECONDS)]
        return argv

    def serve(self, *names: str) -> list[Service]:
        """Start replicas ``names`` (new ones, empty runs dirs); the front sends to them from now on."""
        started = []
        for name in names:
            assert not (self.work / name).exists(), f"replica {name} ran before: its runs dir is not empty"
            (self.work / name).mkdir(parents=True)
            runs = self.work / name / "runs"
            service = Service(self.argv(name), self.work / f"service-{name}.log", runs, self.kube.ca)
            self.running[name] = service
            self.names[self.port(service)] = name
            started.append(service)
        self.front.set_backends([self.port(s) for s in self.running.values()])
        return started

    @staticmethod
    def port(service: Service) -> int:
        return int(service.url.rsplit(":", 1)[1])

    def name_of(self, port: int) -> str:
        """The replica (running or gone) that listens or listened on ``port``."""
        return self.names[port]

    def kill(self, name: str) -> None:
        """SIGKILL replica ``name`` (by PID), as an OOM kill or a node's loss would end its Pod."""
        service = self.running.pop(name)
        service.kill()
        self.gone.append(service)
        self.front.set_backends([self.port(s) for s in self.running.values()])

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
    job_node: JobNode


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
    cert = kubelab_capi.pki.issue_server(f"{name}-front")
    front = Front(cert.cert, cert.key, kubelab_capi.ca)
    with jobs_namespace(kubelab_capi) as namespace:
        replicas = Replicas(
            kubelab_capi,
            lab,
            front,
            namespace,
            job_node.image,
            work,
            capabilities,
            inventory,
            str(job_node.lab.network),
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
            with registered(kubelab_capi, front.url, name, selector):
                yield Module(replicas, ext, opens, job_node.host.name, job_node)
        finally:
            replicas.stop_all()
            front.close()


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
        # each attempt's outcome (a failure's words are there, the log's tail may have lost them)
        ended = {
            name: [a.get("o") for a in (record(c, name) or {}).get("attempts", [])]
            for c in clusters
            for name in c.identities(c.md_machines())
        }
        return (
            f"{co.conditions_text(machines)}\n{listed.stdout}\n{json.dumps(ended, indent=1)}\n"
            f"{json.dumps(logs, indent=1)}"
        )

    return text


def test_a_rollout_of_3_through_2_replicas_survives_one_sigkilled_and_updates_each_host_once(
    module: Module,
    md: Cluster,
    held: Cluster,
    hosts: list[Host],
    lab: HostLab,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """(``held`` is made here: its Machine starts waiting for its window while this test runs.)

    Two replicas are one service (issue 38 item 4): CAPI's requests go to the replicas in turn, one
    request each, and each is asked of the other replica too (front.py); half-way the replica that
    answered CAPI last is SIGKILLed and a fresh one (empty runs dir) takes its place. Every request both
    replicas answered got answers of one class from both, and every Event on the Machines is there once."""
    replicas = module.replicas
    front = replicas.front
    names = sorted(md.identities(md.md_machines()))
    md.ext.map_machines(names)
    seen = len(front.exchanges)
    template = md.new_bootstrap_template(files_and_user("from a Job", "capijobs"))
    selector = f"{DEPLOYMENT_LABEL}={md.md}"
    why = explain(replicas, md)

    # mid-rollout: the first Machine's Job exists; the replica that answered CAPI last is killed, and a
    # fresh one serves in its place (a Pod of the Deployment replaced)
    wait(lambda: bool(jobs(md.lab, replicas.namespace, selector)), ROLLOUT_TIMEOUT, "a first Job", why)
    assert front.last_first is not None
    answering = replicas.name_of(front.last_first)
    survivor = next(n for n in replicas.running if n != answering)
    answered_before = len(re.findall("hook=UpdateMachine", replicas.log(survivor)))
    replicas.serve("fresh")
    replicas.kill(answering)
    replaced = len(front.exchanges)

    wait(lambda: rolled_out(md, template), JOBS_TIMEOUT, "the rollout finished through one replica", why)

    # the other replica answered CAPI after the kill (and said done)
    assert len(re.findall("hook=UpdateMachine", replicas.log(survivor))) > answered_before
    assert any("decision=done" in line for line in replicas.log(survivor).splitlines()), why()
    summary = assert_one_service(replicas, front.exchanges[seen:], replaced - seen, names)
    with capsys.disabled():
        print(summary)
    for name in names:
        assert posted_once(md, name), name
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


def assert_one_service(replicas: Replicas, exchanges: list[Exchange], replaced: int, names: list[str]) -> str:
    """Every UpdateMachine request of ``names`` that two replicas answered got answers of one class from
    both (front.py); CAPI's requests went to each replica in turn, to the fresh one from the ``replaced``-th
    on, and each Machine's were compared."""
    updates = [e for e in exchanges if e.hook == "updatemachine" and e.machine in names]
    compared = [e for e in updates if e.compared()]
    differing = [
        (e.machine, replicas.name_of(e.first.port), e.first.body, e.shadow.body, e.again.body)  # type: ignore[union-attr]
        for e in compared
        if not e.consistent()
    ]
    assert differing == [], "\n".join(repr(d) for d in differing)  # whole: pytest's own diff cuts the bodies
    # the few not compared: the killed replica's last calls (its connection refused or cut)
    assert len(compared) >= len(updates) - 4, (len(compared), len(updates))
    for name in names:
        assert len([e for e in compared if e.machine == name]) >= 2, name
    # after the replacement, CAPI's requests went to the survivor and the fresh one in turn, and each was
    # the other's shadow
    after = [e for e in exchanges[replaced:] if e.hook == "updatemachine"]
    firsts = {replicas.name_of(e.first.port) for e in after}
    shadows = {replicas.name_of(e.shadow.port) for e in after if e.compared() and e.shadow is not None}
    assert "fresh" in firsts and len(firsts) == 2, firsts
    assert shadows == firsts, (firsts, shadows)
    with_hooks = [e for e in exchanges if e.hook != "updatemachine" and e.compared()]
    assert all(e.consistent() for e in with_hooks), [e.path for e in with_hooks if not e.consistent()]
    moved = len([e for e in compared if e.moved()])
    return (
        f"\n{len(compared)} of {len(updates)} UpdateMachine requests compared ({moved} with the cluster "
        f"changing between the calls; {len(with_hooks)} requests of other hooks), {len(after)} after the "
        f"replacement, answered first by {sorted(firsts)}"
    )


def posted_once(cluster: Cluster, machine: str) -> bool:
    """Each of the service's Events on ``machine`` (its reason and message) is one Event, counted once."""
    listed = json.loads(cluster.lab.kubectl("get", "events", "-n", cluster.namespace, "-o", "json").stdout)
    ours = [
        e
        for e in listed["items"]
        if e["involvedObject"].get("name") == machine
        and e.get("reportingComponent", (e.get("source") or {}).get("component")) == "inplace-extension"
    ]
    keys = [(e["reason"], e["message"]) for e in ours]
    assert ours, f"no Event of ours on {machine}"
    assert len(keys) == len(set(keys)) and all(e.get("count", 1) == 1 for e in ours), keys
    return True


def test_status_reads_the_kubernetes_executors_record_as_a_rollout_moves_to_done(
    module: Module, md: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    """``inplace-extension status md/NAME -o json`` polled while the real controllers roll the
    MachineDeployment of 3 out again through the replicas' Jobs: each Machine is seen not done, then
    done, its attempt and host read from the record annotation on the Machine, with the service's
    message. Self-contained: a new template of the same file and user (in place), after the rollout
    above."""
    from inplace_extension.cli import main  # the command as a user runs it, in this process

    names = sorted(md.identities(md.md_machines()))
    md.ext.map_machines(names)
    flags = [f"md/{md.md}", "-n", md.namespace, "--kubeconfig", str(md.lab.kubeconfig), "-o", "json"]

    def status() -> dict[str, Any]:
        assert main(["status", *flags]) == 0
        document: dict[str, Any] = json.loads(capsys.readouterr().out)
        return document

    seen: dict[str, list[str]] = {name: [] for name in names}
    template = ""

    def polled() -> bool:
        for machine in status()["machines"]:
            states = seen.setdefault(machine["name"].rpartition("/")[2], [])
            if not states or states[-1] != machine["state"]:
                states.append(machine["state"])
        return rolled_out(md, template)

    template = md.new_bootstrap_template(files_and_user("status of Jobs", "capijobs"))
    wait(
        polled,
        JOBS_TIMEOUT,
        "the rollout, polled with status",
        lambda: f"{explain(module.replicas, md)()}\n{seen}",
    )
    last = status()
    assert last["summary"]["done"] == 3, last
    for machine in last["machines"]:
        name = machine["name"].rpartition("/")[2]
        found = record(md, name)
        assert found is not None, name
        attempt = found["attempts"][-1]
        assert attempt["o"]["kind"] == "successful", found
        # what status shows is the record's: the last attempt's number and host, done, the service's words
        assert (machine["state"], machine["message"]) == ("done", "update applied"), machine
        assert machine["attempt"] == len(found["attempts"]), (machine, found)
        assert machine["host"] == attempt.get("a"), (machine, attempt)
    for name in names:
        states = seen[name]
        if states[-1] != "done":
            states.append("done")  # the last poll read it before it ended; `last` saw it done
        assert set(states) - {"done"}, f"{name} was never seen updating: {states}"


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


PAIR_FILE = "/etc/capi-lab/pair.conf"
PAIR_FLAG = "max-pods"


@dataclass
class Pair:
    """A MachineDeployment of two whose Machines are real nodes of the management cluster (a
    self-managed cluster's workers): each Machine's Node (its ``status.nodeRef``, named by CAPD) is a
    node-lab node joined under that name, which is also the host its inventory entry reaches."""

    cluster: Cluster
    hosts: dict[str, Host]  # Machine -> its node
    nodes: dict[str, str]  # Machine -> its Node's name


@pytest.fixture
def pair(module: Module, kubelab_capi: Lab) -> Iterator[Pair]:
    """The pair (:class:`Pair`) at the nodes' kubelet version (the update plans no version change), with
    ``maxUnavailable: 2``; the Jobs' own node cordoned meanwhile, so the two nodes are the only ones a
    Job's Pod may run on. Afterwards the Jobs' node uncordoned, the two Nodes deleted and their nodes
    stopped."""
    nodes_lab, job_host = module.job_node.lab, module.job_node.host
    cluster = create_cluster(module.ext, "pair", node_flavour.START_VERSION, md_replicas=2)
    rolling = {"strategy": {"rollingUpdate": {"maxSurge": 0, "maxUnavailable": 2}}}
    cluster.patch(MD, cluster.md, {"spec": {"rollout": rolling}})
    machines = {m["metadata"]["name"]: m["status"]["nodeRef"]["name"] for m in cluster.md_machines()}
    joined: list[str] = []
    kubelab_capi.kubectl("cordon", job_host.name)
    try:
        started = nodes_lab.up(1 + len(machines), owner_pid=os.getpid(), kind=NODE)
        hosts = dict(zip(sorted(machines), [h for h in started if h.name != job_host.name], strict=True))
        for machine, host in hosts.items():
            joined.append(machines[machine])
            node_join.join(kubelab_capi, nodes_lab, host, node_name=machines[machine])
        import_pause(nodes_lab, list(hosts.values()))
        import_service_image(nodes_lab, list(hosts.values()))
        yield Pair(cluster, hosts, machines)
    except LabError as exc:
        pytest.fail(f"the pair's nodes did not start: {exc}", pytrace=False)
    finally:
        kubelab_capi.kubectl("uncordon", job_host.name, check=False)
        try:  # the pair's nodes stopped first (a running kubelet registers its Node again), the Jobs' kept
            nodes_lab.up(1, owner_pid=os.getpid(), kind=NODE)
        finally:
            for name in joined:
                kubelab_capi.kubectl("delete", "node", name, "--ignore-not-found", check=False)


def kubelet_flags(lab: HostLab, host: Host) -> list[str]:
    """The running kubelet's own command line (the host's truth, not a file that says what it should be)."""
    pid = run_on(lab, host, ["systemctl", "show", "-p", "MainPID", "--value", "kubelet"]).strip()
    return run_on(lab, host, ["cat", f"/proc/{pid}/cmdline"]).split("\0")


def test_two_machines_updated_at_once_each_drained_while_the_others_job_runs_on_its_node(
    module: Module, pair: Pair
) -> None:
    """Issue 38 item 5: CAPI updates both Machines at once (``maxUnavailable: 2``); each Machine's Job
    runs on the other Machine's Node (the only other node) and drains its own Node, where the other
    Machine's Job runs. Neither drain is refused for that Pod's emptyDir scratch nor blocked: both hosts
    end with the file and the kubelet flag (read on the host), each stamped once, no Node cordoned,
    nothing of the service left on the Machines, the Nodes or the hosts' locks."""
    replicas, cluster, lab = module.replicas, pair.cluster, module.job_node.lab
    names = sorted(pair.hosts)
    inventory = yaml.safe_load(replicas.inventory.read_text()) or {}
    entries = {e["match"]["name"]: e for e in service_inventory(lab)["hosts"]}
    inventory["hosts"] = [
        *(e for e in inventory.get("hosts") or [] if e["match"]["name"] not in names),
        *({**entries[host.name], "match": {"name": name}} for name, host in pair.hosts.items()),
    ]
    replicas.inventory.write_text(yaml.safe_dump(inventory, sort_keys=False))
    stamps = {name: len(stamp_writes(lab, host)) for name, host in pair.hosts.items()}
    spec = {
        "format": "cloud-config",
        "files": [
            {"path": PAIR_FILE, "content": "both at once\n", "owner": "root:root", "permissions": "0644"}
        ],
        "joinConfiguration": {"nodeRegistration": {"kubeletExtraArgs": [{"name": PAIR_FLAG, "value": "77"}]}},
    }
    template = cluster.new_bootstrap_template(spec)
    why = explain(replicas, cluster)

    wait(lambda: pair_rolled_out(cluster, template), JOBS_TIMEOUT, "both Machines updated in place", why)

    for name, host in pair.hosts.items():
        # the host's truth: the file, the running kubelet's flag, one stamp write, the host lock released
        assert run_on(lab, host, ["cat", PAIR_FILE]) == "both at once\n", name
        flags = kubelet_flags(lab, host)
        assert f"--{PAIR_FLAG}=77" in flags, (name, flags)
        assert len(stamp_writes(lab, host)) - stamps[name] == 1, name
        assert lock_events(lab, host)[-1] == "released", lock_events(lab, host)
        # one successful attempt (an earlier one may have ended unreachable: retried, nothing applied)
        found = record(cluster, name)
        assert found is not None, name
        kinds = [a["o"]["kind"] for a in found["attempts"]]
        assert kinds[-1] == "successful" and set(kinds[:-1]) <= {"unreachable"}, kinds
        # each Job's Pod ran on the other Machine's Node
        [other] = [pair.nodes[n] for n in names if n != name]
        for job in jobs(cluster.lab, replicas.namespace, f"{MACHINE_LABEL}={name}"):
            [pod] = pods_of(replicas, job["metadata"]["name"])
            assert pod["spec"]["nodeName"] == other, (name, pod["spec"].get("nodeName"))
        # no drain refused or blocked, nothing left on the Machine or its Node
        events = [
            (e["reason"], e["message"]) for e in machine_events(cluster, name) if e["reason"] == "DrainFailed"
        ]
        assert events == [], events
        machine = objects.get(cluster.lab, MACHINES, name, cluster.namespace)
        assert machine is not None
        left = {
            k for k in machine["metadata"].get("annotations", {}) if k.startswith("inplace-extension.io/")
        }
        assert left == {RECORD_ANNOTATION}, left
        assert "cluster.x-k8s.io/skip-remediation" not in machine["metadata"].get("annotations", {})
        node = objects.get(cluster.lab, "node", pair.nodes[name])
        assert node is not None
        assert not node["spec"].get("unschedulable"), node["spec"]
        marks = {k for k in node["metadata"].get("annotations", {}) if k.startswith("inplace-extension.io/")}
        assert marks == set(), marks
        assert (objects.condition(node, "DisruptiveInPlaceUpdate") or {}).get("status") != "True", node
    assert_no_empty_dir_refusal(cluster)
    # at once: each Machine's Node was drained while the other Machine's successful attempt ran on it
    for name in names:
        [other] = [n for n in names if n != name]
        [drained] = [e for e in machine_events(cluster, name) if e["reason"] == "Drained"]
        at = stamp(drained.get("firstTimestamp") or drained["eventTime"])
        last = jobs(cluster.lab, replicas.namespace, f"{MACHINE_LABEL}={other}")[-1]
        [pod] = pods_of(replicas, last["metadata"]["name"])
        [state] = [c["state"]["terminated"] for c in pod["status"]["containerStatuses"]]
        began, ended = stamp(state["startedAt"]), stamp(state["finishedAt"])
        assert pod["spec"]["nodeName"] == pair.nodes[name], pod["spec"]
        # Event times are whole seconds
        assert began - 1 <= at <= ended + 1, (name, drained, state)


def stamp(text: str) -> float:
    """A Kubernetes timestamp (RFC 3339, ``Z`` or an offset, maybe with fractions) in seconds."""
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def pods_of(replicas: Replicas, job: str) -> list[dict[str, Any]]:
    listed = replicas.kube.kubectl(
        "get", "pods", "-n", replicas.namespace, "-l", f"job-name={job}", "-o", "json"
    )
    items: list[dict[str, Any]] = json.loads(listed.stdout)["items"]
    return items


def machine_events(cluster: Cluster, machine: str) -> list[dict[str, Any]]:
    listed = json.loads(cluster.lab.kubectl("get", "events", "-n", cluster.namespace, "-o", "json").stdout)
    return [e for e in listed["items"] if e["involvedObject"].get("name") == machine]


def assert_no_empty_dir_refusal(cluster: Cluster) -> None:
    """No Event of the namespace says a drain met Pods with emptyDir data."""
    listed = json.loads(cluster.lab.kubectl("get", "events", "-n", cluster.namespace, "-o", "json").stdout)
    refused = [e["message"] for e in listed["items"] if "emptyDir" in e.get("message", "")]
    assert refused == [], refused


def pair_rolled_out(cluster: Cluster, template: str) -> bool:
    status = cluster.deployment().get("status", {})
    return (
        owned_by_template(cluster, template)
        and updated_in_place(cluster.md_machines(), 2)
        and status.get("upToDateReplicas") == 2
    )
