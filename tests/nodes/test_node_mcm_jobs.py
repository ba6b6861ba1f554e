"""``mcm-agent --executor kubernetes`` under the real machine-controller-manager, each attempt a Job on the
node lab's real nodes.

The node lab's kubelab runs MCM v0.62.1 and the static-hosts machine controller (flavour ``mcm``, started
here and stopped again afterwards: the other node tests write MCM's objects by hand and must not meet its
controllers). A MachineDeployment of 3 is backed by three of the node lab's hosts: the driver picks a
host by address and makes the Machine's Node, named like the Machine as MCM requires, kept Ready by kwok
(the real kubelets register the hosts under their own names, so the Nodes MCM rolls out are kwok's).
The agent runs as two replicas sharing nothing but the API server, as the ServiceAccount of
deploy/mcm/rbac.yaml with its rights only (a bound token), its Jobs from the project's image in a
namespace of the test with that file's attempt ServiceAccount. The real Job
controller, kube-scheduler and kubelets run each Job on a real node (the kwok Nodes have no
``kubernetes.io/os`` label, which the Job selects), and its Pod plays over SSH to the host that backs the
Node, whatever real node that host also is: the update is a file, which no Pod minds.

Real: MCM and its machine-controller library (cordon, drain, the in-place states, the move to the new
MachineSet), the agent, the Jobs, their Pods and the play on the hosts. Stand-ins: the Machines' Nodes
(kwok), the machines' creation (the driver only picks a host).

A play is held in its health gate by a ``command`` check (``test -e <release file>`` on the host), so
the test acts while it is known to run. MCM hands the three Nodes over at once (``maxUnavailable: 3``);
on the first Node whose play is held the test deletes the Job's Pod, on the second it SIGKILLs the
replica that claimed the Node; the third goes through. Each host is updated once.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from hostlab.proc import wait_until
from kubelab import objects, reads
from kubelab.flavours import mcm
from kubelab.lab import Lab as KubeLab
from mcm_lab.agentproc import AgentProcess, Pool, agent_argv, write_inventory

from inplace_extension.kube.jobs import PHASE_ANNOTATION
from inplace_extension.kubejobs.manifest import MACHINE_LABEL
from inplace_extension.kubejobs.record import RECORD_ANNOTATION
from inplace_extension.mcm import node_state as ns
from inplace_extension.plays.ssh import close_control_masters

from .conftest import REPO, Cluster, capabilities
from .images import node_image
from .test_node_capabilities import on_node, stamp_writes

pytestmark = [pytest.mark.lab, pytest.mark.kube]

ATTEMPT_ACCOUNT = "inplace-extension-mcm-attempt"  # deploy/mcm/rbac.yaml
RELEASE_DIR = "/etc/nodes-test"
HELD = """\
health_checks:
  - name: release
    command: [test, -e, %s]
"""
# one step of the rollout: MCM's drain and hand-over, the Job's Pod on busy cores, the play over SSH (a
# Job took about 70 s from launch to outcome at a load average of 20, several minutes at 40)
WITHIN = 480.0
MCM_KINDS = (
    "machinedeployments.machine.sapcloud.io,machinesets.machine.sapcloud.io,machines.machine.sapcloud.io"
)


@pytest.fixture
def mcm_on_nodes(node_cluster: Cluster) -> Iterator[KubeLab]:
    """MCM's controllers on the node lab's kubelab for this test, stopped afterwards unless they ran
    before it (a serial run whose MCM lab tests came first shares the same kubelab)."""
    kube = node_cluster.kube
    ran = mcm.name in kube.state().flavours
    if not ran:
        # objects the other node tests wrote by hand in MCM's namespace: MCM would act on them
        kube.kubectl("delete", MCM_KINDS, "-n", mcm.NAMESPACE, "--all", "--wait=false", check=False)
        kube.ensure_flavour(mcm.name)
    try:
        yield kube
    finally:
        if not ran:
            kube.stop_flavour(mcm.name)
            stopped = (kube.state().component(c) for c in (mcm.CONTROLLER, mcm.MACHINE_CONTROLLER))
            assert not any(c is not None and c.running() for c in stopped), "MCM's controllers stopped"


AGENT_ACCOUNT = "inplace-extension-mcm-agent"  # deploy/mcm/rbac.yaml


def _deploy_rbac(namespace: str) -> list[dict[str, Any]]:
    """deploy/mcm/rbac.yaml moved into ``namespace`` (the agent's and its Jobs'): its namespaced objects
    there, its cluster-wide ones and the RoleBinding in MCM's namespace renamed after ``namespace``."""
    chosen = []
    for doc in yaml.safe_load_all((REPO / "deploy/mcm/rbac.yaml").read_text()):
        if not doc:
            continue
        meta = doc["metadata"]
        if doc["kind"] in ("ClusterRole", "ClusterRoleBinding") or meta.get("namespace") == mcm.NAMESPACE:
            meta["name"] = f"{meta['name']}-{namespace}"
        else:
            meta["namespace"] = namespace
        if doc["kind"] in ("ClusterRoleBinding", "RoleBinding") and doc["roleRef"]["kind"] == "ClusterRole":
            doc["roleRef"]["name"] = f"{doc['roleRef']['name']}-{namespace}"
        for subject in doc.get("subjects", []):
            subject["namespace"] = namespace
        chosen.append(doc)
    return chosen


@pytest.fixture
def jobs_namespace(node_cluster: Cluster) -> Iterator[str]:
    """The agent's namespace as an operator prepares it: deploy/mcm/rbac.yaml (the agent's ServiceAccount
    and rights, its Jobs' ServiceAccount and Role); deleted afterwards, its Jobs with it. No SSH Secret:
    the agent (a process here) copies each Job its host's key."""
    kube = node_cluster.kube
    name = f"mcm-jobs-{uuid.uuid4().hex[:8]}"
    objects.ensure_namespace(kube, name)
    objects.ensure_namespace(kube, mcm.NAMESPACE)
    chosen = _deploy_rbac(name)
    accounts = sorted(d["metadata"]["name"] for d in chosen if d["kind"] == "ServiceAccount")
    assert accounts == [AGENT_ACCOUNT, ATTEMPT_ACCOUNT]
    objects.apply(kube, *chosen)
    try:
        yield name
    finally:
        for doc in chosen:  # what the namespace's deletion does not take
            meta = doc["metadata"]
            if doc["kind"] in ("ClusterRole", "ClusterRoleBinding") or meta.get("namespace") == mcm.NAMESPACE:
                where = ["-n", meta["namespace"]] if "namespace" in meta else []
                kube.kubectl(
                    "delete", doc["kind"].lower(), meta["name"], *where, "--ignore-not-found", check=False
                )
        kube.kubectl("delete", "namespace", name, "--wait=false", check=False)


def agent_kubeconfig(kube: KubeLab, namespace: str, path: Path) -> Path:
    """A kubeconfig of the lab's API server as the agent's ServiceAccount (a bound token): the agent
    runs with the rights deploy/mcm/rbac.yaml gives it and nothing more."""
    token = kube.kubectl("create", "token", AGENT_ACCOUNT, "-n", namespace, "--duration=2h").stdout.strip()
    config = yaml.safe_load(kube.kubeconfig.read_text())
    config["users"] = [{"name": AGENT_ACCOUNT, "user": {"token": token}}]
    config["contexts"][0]["context"]["user"] = AGENT_ACCOUNT
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path


@dataclass
class Replicas:
    agents: dict[str, AgentProcess]

    def log(self) -> str:
        return "\n".join(
            f"--- {name}{_exited(agent)}\n{agent.log()[-3000:]}" for name, agent in self.agents.items()
        )

    def exited(self) -> dict[str, int]:
        """The replicas that ended, with their exit status (a crash is a signal's negative number)."""
        codes = {name: agent.proc.poll() for name, agent in self.agents.items()}
        return {name: code for name, code in codes.items() if code is not None}


def _exited(agent: AgentProcess) -> str:
    code = agent.proc.poll()
    return "" if code is None else f" (exited with status {code})"


@pytest.fixture
def replicas(
    node_cluster: Cluster, mcm_on_nodes: KubeLab, jobs_namespace: str, tmp_path: Path
) -> Iterator[tuple[Replicas, str]]:
    """Two agent replicas (``--agent-id a`` and ``b``) with the kubernetes executor, each with its own
    runs dir and log; and the release file the health check waits for on each host. Stopped by PID."""
    kube, lab = mcm_on_nodes, node_cluster.lab
    image = node_image(node_cluster)
    release = f"{RELEASE_DIR}/mcm-release-{uuid.uuid4().hex[:8]}"
    caps = tmp_path / "capabilities.yaml"
    caps.write_text(capabilities(node_cluster) + HELD % release)
    inventory = write_inventory(lab, tmp_path / "inventory.yaml")  # matched by the driver's host label
    executor = ["--executor", "kubernetes", "--job-namespace", jobs_namespace, "--job-image", image]
    executor += ["--job-service-account", ATTEMPT_ACCOUNT, "--job-deadline-seconds", "600"]
    # the default tick, after agent_argv's 0.5 s: longer than the end wait's look at the Job (once a
    # second, JOB_LOOK_SECONDS), so the agent's wait between its polls reads the Jobs on the real API
    # server (a 0.5 s wait ended before its first look)
    executor += ["--poll-seconds", "2"]
    # this agent runs from the worktree, its Jobs from the image: the image's playbooks
    executor += ["--job-playbooks-dir", "/opt/inplace-extension/playbooks"]
    account = agent_kubeconfig(kube, jobs_namespace, tmp_path / "agent.kubeconfig")
    started: dict[str, AgentProcess] = {}
    try:
        for name in ("a", "b"):
            runs, port = tmp_path / f"runs-{name}", kube.free_port()
            argv = agent_argv(kube, lab, inventory, runs, caps, port, [*executor, "--agent-id", name])
            argv += ["--target-kubeconfig", str(account)]  # after agent_argv's admin one: this one holds
            started[name] = AgentProcess(argv, tmp_path / f"agent-{name}.log", port, runs)
        yield Replicas(started), release
    finally:
        for agent in started.values():
            agent.stop()
            close_control_masters(agent.runs_dir)


def _pods(kube: KubeLab, namespace: str) -> list[dict[str, Any]]:
    return reads.list_objects(kube, "pods", namespace)


def _jobs(kube: KubeLab, namespace: str, node: str) -> list[dict[str, Any]]:
    items = reads.list_objects(kube, "jobs", namespace, f"{MACHINE_LABEL}={node}")
    return sorted(items, key=lambda job: job["metadata"]["name"])


def _active_jobs(kube: KubeLab, namespace: str) -> list[str]:
    listed = reads.list_objects(kube, "jobs", namespace)
    return [job["metadata"]["name"] for job in listed if job.get("status", {}).get("active")]


def _diagnosis(cluster: Cluster, namespace: str) -> str:
    """The Jobs' Pods (node, phase annotation, container states) and the end of their logs, read on the
    node (the API server cannot reach the lab's kubelets by name), for an assertion's message."""
    seen = []
    for pod in _pods(cluster.kube, namespace):
        name, node = pod["metadata"]["name"], pod["spec"].get("nodeName")
        hosts = [h for h in cluster.hosts if h.name == node]
        argv = ["sh", "-c", f"cat /var/log/pods/{namespace}_{name}_*/*/*.log"]
        log = cluster.lab.exec_in(hosts[0], argv).stdout[-2000:] if hosts else ""
        phase = pod["metadata"].get("annotations", {}).get(PHASE_ANNOTATION)
        states = [c.get("state") for c in pod.get("status", {}).get("containerStatuses", [])]
        seen.append({"pod": name, "node": node, "phase": phase, "states": states, "log": log})
    text = json.dumps(seen, indent=1)
    print(text)  # in full in pytest's captured output (the assertion's message is cut)
    return text


def _held(kube: KubeLab, namespace: str, done: set[str]) -> dict[str, Any] | None:
    """A running Job's Pod whose play waits in its health gate, for a Node not handled yet."""
    for pod in _pods(kube, namespace):
        node = pod["metadata"].get("labels", {}).get(MACHINE_LABEL)
        phase = pod["metadata"].get("annotations", {}).get(PHASE_ANNOTATION, "")
        if node not in done and pod["status"].get("phase") == "Running" and phase.startswith("health gate"):
            return pod
    return None


def _record(pool: Pool, node: str) -> dict[str, Any]:
    annotations = pool.node(node).get("metadata", {}).get("annotations", {})
    assert RECORD_ANNOTATION in annotations, annotations
    record: dict[str, Any] = json.loads(annotations[RECORD_ANNOTATION])
    return record


def test_an_mcm_rollout_with_two_agent_replicas_runs_its_attempts_as_jobs_on_real_nodes(
    node_cluster: Cluster,
    mcm_on_nodes: KubeLab,
    jobs_namespace: str,
    replicas: tuple[Replicas, str],
) -> None:
    kube = mcm_on_nodes
    agents, release = replicas
    hosts = node_cluster.hosts[:3]
    tag = uuid.uuid4().hex[:8]
    path, payload = f"{RELEASE_DIR}/mcm-jobs-{tag}", f"from a Job under MCM {tag}\n"
    v2 = {"kubeadmConfigSpec": {"files": [{"path": path, "content": payload, "permissions": "0644"}]}}
    stamps = {host.name: stamp_writes(node_cluster, host) for host in hosts}
    # maxUnavailable 3: MCM hands the three Nodes over at once, and their Jobs run side by side
    pool = Pool(kube, f"jobs-{tag}", hosts, {"v1": {}, "v2": v2}, max_unavailable=3)
    try:
        pool.switch("v2")
        handled: list[str] = []  # Nodes in the order MCM handed them over
        killed: str | None = None

        def next_held() -> dict[str, Any]:
            found: list[dict[str, Any]] = []

            def held() -> bool:
                pod = _held(kube, jobs_namespace, set(handled))
                if pod is not None:
                    found.append(pod)
                return pod is not None

            assert wait_until(held, WITHIN, 0.5), (
                f"no play held in its health gate: {pool.deployment().get('status')}\n{agents.log()}\n"
                f"{_diagnosis(node_cluster, jobs_namespace)}"
            )
            return found[-1]

        # the first Node: its Job's Pod deleted mid-play (waited for: in its grace period the play still
        # runs), then released; the next attempt's Job takes over the host lock at once
        pod = next_held()
        first = pod["metadata"]["labels"][MACHINE_LABEL]
        handled.append(first)
        kube.kubectl(
            "delete",
            "pod",
            pod["metadata"]["name"],
            "-n",
            jobs_namespace,
            "--wait=true",
            "--timeout=180s",
            timeout=200,
        )
        on_node(node_cluster, pool.host_of(pool.node(first)), "touch", release)

        # both replicas still run: none crashed launching two Jobs at once (tests/kube/test_models.py)
        assert not agents.exited(), agents.log()

        # the second Node: the replica that claimed it SIGKILLed mid-play; its Job goes on, and the other
        # replica takes the Node over once the dead one's claim expires (--claim-seconds)
        pod = next_held()
        second = pod["metadata"]["labels"][MACHINE_LABEL]
        handled.append(second)
        claim = ns.claim_of(pool.node(second))
        assert claim is not None and claim.holder in agents.agents, pool.node(second)["metadata"]
        killed = claim.holder
        agents.agents[killed].kill()
        on_node(node_cluster, pool.host_of(pool.node(second)), "touch", release)

        # the third Node goes through
        pod = next_held()
        third = pod["metadata"]["labels"][MACHINE_LABEL]
        handled.append(third)
        on_node(node_cluster, pool.host_of(pool.node(third)), "touch", release)

        assert wait_until(pool.finished, WITHIN, 0.5), f"{pool.deployment().get('status')}\n{agents.log()}"

        assert sorted(handled) == pool.initial
        # each host updated once: one stamp write, the file as the MachineClass says
        for host in hosts:
            assert stamp_writes(node_cluster, host) == stamps[host.name] + 1, host.name
            assert on_node(node_cluster, host, "cat", path) == payload
        # the first Node: one interrupted attempt (counted once), the next successful, its lock taken
        # over at once (not after the stale timeout); two Jobs
        interrupted, succeeded = _record(pool, first)["attempts"]
        assert interrupted["o"]["kind"] == "interrupted", interrupted
        assert succeeded["o"]["kind"] == "successful", succeeded
        assert succeeded["o"]["finished"] - succeeded["s"] < 120, succeeded
        jobs = _jobs(kube, jobs_namespace, first)
        assert {j["metadata"]["name"] for j in jobs} == {interrupted["j"], succeeded["j"]}
        # the second and third: one attempt, one Job each, whichever replica answered
        for node in (second, third):
            [attempt] = _record(pool, node)["attempts"]
            assert attempt["o"]["kind"] == "successful", (node, attempt)
            assert [j["metadata"]["name"] for j in _jobs(kube, jobs_namespace, node)] == [attempt["j"]]
        # every Job's Pod ran on a real node, none on the kwok Nodes MCM rolled out
        real = {host.name for host in node_cluster.hosts}
        assert {p["spec"].get("nodeName") for p in _pods(kube, jobs_namespace)} <= real
        # MCM took the answers: the rollout is done, and no annotation of ours but the record stays (the
        # dead replica's claim removed by the live one)
        for node in pool.nodes():
            annotations = ns.node_annotations(node)
            assert ns.CLAIM_ANNOTATION not in annotations and ns.ANSWERED_ANNOTATION not in annotations
            assert ns.RESULT_LABEL not in ns.node_labels(node)
        (live,) = set(agents.agents) - {killed}
        assert f"machine={mcm.NAMESPACE}/{third}" in agents.agents[live].log()
    finally:
        # a play still held (the test failed before releasing it) ends now: a Job deleted mid-play would
        # leave its host lock to the next test until it goes stale
        for host in hosts:
            node_cluster.lab.exec_in(host, ["sh", "-c", f"mkdir -p {RELEASE_DIR} && touch {release}"])
        wait_until(lambda: not _active_jobs(kube, jobs_namespace), WITHIN, 1.0)
        pool.delete()
