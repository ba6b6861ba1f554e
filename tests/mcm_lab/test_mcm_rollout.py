"""In-place rollouts of the real machine-controller-manager v0.62.1 with our agent as the node-side
updater: 3 Machines on 3 lab hosts (static-hosts machine controller), kwok Nodes and Pods, Ansible over
SSH through the same run service as the CAPI hooks.

Real: MCM and its machine-controller library, the apiserver, the agent, Ansible and SSH to the lab
hosts. Simulated: kubelets (kwok), the machines' creation (the driver only picks a host), Kubernetes
binaries on the hosts (stand-ins, see tests/e2e/conftest.py).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from e2e.conftest import NEXT_VERSION, START_VERSION
from e2e.hostcheck import run_on, stamp_writes
from hostlab import faults
from hostlab.lab import Host
from hostlab.lab import Lab as HostLab
from hostlab.proc import wait_until
from kubelab import objects, reads
from kubelab.flavours import mcm, mcm_objects
from kubelab.lab import Lab

from inplace_extension.mcm import node_state as ns
from inplace_extension.mcm.desired import InPlaceUpdateSpec, plan_for
from inplace_extension.runs.attempts import OutcomeKind
from inplace_extension.runs.policy import backoff_seconds, retry_token
from inplace_extension.runs.resolve import ADDRESS_ANNOTATION

from .agentproc import AgentProcess, Pool, attempts, play_started
from .conftest import StartAgent
from .evictions import Evictions
from .rollout_state import RERUN_ON_MOVE_RACE, SELECTED_LABEL, wait_on_mcm

pytestmark = [pytest.mark.kube, pytest.mark.mcm, pytest.mark.lab, RERUN_ON_MOVE_RACE]

HOST_NOT_FOUND = (  # the CAPI side's message (tests/runs/test_cluster_side.py), for a Node
    "HostNotFound: no inventory entry matches this Machine and it has no inplace-extension.io/address "
    "annotation, nor an InternalIP/ExternalIP address in its status"
)
RETRY_AFTER = 1  # the agents' --retry-after-seconds (agentproc.agent_argv): the first backoff
WORKLOAD = "mcm-workload"  # the namespace of the Pods MCM drains
ROLLOUT = 900.0  # 3 drains + 3 plays on 2 shared cores; measured times go to docs/development.md
# shell and Ansible syntax that must stay text (Jinja is refused up front: docs/install-mcm.md)
PAYLOAD = "hello `touch /tmp/mcm-pwned` $(touch /tmp/mcm-pwned2); touch /tmp/mcm-pwned3 ${HOME} %{x}\n"
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGV4YW1wbGUta2V5LWZvci1lMmUtdGVzdHMtb25seQ mcm@test"
V1: dict[str, Any] = {"kubernetesVersion": START_VERSION}
V2: dict[str, Any] = {
    "kubernetesVersion": NEXT_VERSION,
    "kubeadmConfigSpec": {
        "files": [
            {"path": "/etc/mcm/hello.conf", "content": PAYLOAD, "owner": "root:root", "permissions": "0640"}
        ],
        "users": [{"name": "mcmuser", "shell": "/bin/bash", "sshAuthorizedKeys": [KEY]}],
        "ntp": {"enabled": True, "servers": ["ntp1.example.org"]},
        "joinConfiguration": {
            "nodeRegistration": {"kubeletExtraArgs": [{"name": "max-pods", "value": "120"}]}
        },
    },
}
V2_FINGERPRINT = plan_for(InPlaceUpdateSpec.model_validate(V2), mcm.NAMESPACE, "any").fingerprint


@pytest.fixture
def pool_factory(kubelab_mcm: Lab, nodes: list[Host]) -> Any:
    pools: list[Pool] = []

    def make(name: str, **md: Any) -> Pool:
        pool = Pool(kubelab_mcm, name, nodes, {"v1": V1, "v2": V2}, **md)
        pools.append(pool)
        for node in pool.initial:  # workload for MCM to drain
            objects.create_pod(kubelab_mcm, WORKLOAD, f"{node}-app", node)
        return pool

    yield make
    for pool in pools:
        pool.delete()


def watch_rollout(pool: Pool, done: Any, within: float = ROLLOUT, agents: Sequence[AgentProcess] = ()) -> int:
    """Poll until ``done()``; return the most Nodes ever seen in update at once: selected for update by
    MCM and not yet answered successful. ``agents``: whose logs a failure shows.

    Not the cordoned Nodes: MCM v0.62.1 uncordons a Node with an Update of its cached copy after moving the
    Machine to the new MachineSet; when that Update meets a Conflict (the kubelet's, our answer's write) the
    Node stays cordoned until a later reconcile, while MCM already selects the next Node, so two cordoned
    Nodes were seen on a busy machine with only one of them being updated."""
    most = 0

    def in_update(node: Mapping[str, Any]) -> bool:
        labels = ns.node_labels(node)
        return SELECTED_LABEL in labels and labels.get(ns.RESULT_LABEL) != ns.SUCCESSFUL

    def check() -> bool:
        nonlocal most
        most = max(most, sum(1 for n in pool.nodes() if in_update(n)))
        return bool(done())

    wait_on_mcm(pool, check, within, "rollout not done", agents, 0.25)
    return most


def assert_host_updated(hostlab: HostLab, host: Host) -> None:
    assert stamp_writes(hostlab, host) == [V2_FINGERPRINT], "exactly one apply of the new desired state"
    assert NEXT_VERSION in run_on(hostlab, host, ["kubelet", "--version"])
    assert run_on(hostlab, host, ["cat", "/etc/mcm/hello.conf"]) == PAYLOAD, "the payload lands literally"
    assert run_on(hostlab, host, ["sh", "-c", "ls /tmp/mcm-pwned* 2>/dev/null || true"]) == ""
    assert "--max-pods=120" in run_on(hostlab, host, ["cat", "/etc/default/kubelet"])
    assert KEY in run_on(hostlab, host, ["cat", "/home/mcmuser/.ssh/authorized_keys"])


def find_by_status_address(lab: Lab, node: str, address: str | None) -> None:
    """The Node loses the static-hosts driver's address annotation and says where it is only in its
    status, as a kubelet would (kwok filled in an InternalIP of its own; it keeps what we set); with
    ``address`` None its status has no IP address at all, only its host name."""
    lab.kubectl("annotate", "node", node, f"{ADDRESS_ANNOTATION}-")
    addresses = [{"type": "Hostname", "address": node}]
    if address is not None:
        addresses.append({"type": "InternalIP", "address": address})
    patch = json.dumps({"status": {"addresses": addresses}})
    lab.kubectl("patch", "node", node, "--subresource=status", "--type=merge", "-p", patch)


def test_auto_rollout_updates_every_host_in_turn(
    kubelab_mcm: Lab, lab: HostLab, pool_factory: Any, start_agent: StartAgent
) -> None:
    """Also: MCM evicted each Node's workload before our play started on its host, and a Node that
    neither the annotation nor the inventory places is reached at the InternalIP of its status."""
    pool = pool_factory("auto")
    unlisted = pool.nodes()[0]
    unlisted_name, unlisted_host = unlisted["metadata"]["name"], pool.host_of(unlisted)
    find_by_status_address(kubelab_mcm, unlisted_name, unlisted_host.address)
    agent = start_agent(unlisted=[unlisted_host])
    evictions = Evictions(kubelab_mcm, WORKLOAD)
    try:
        pool.switch("v2")
        most = watch_rollout(pool, pool.finished, agents=[agent])
    finally:
        evictions.stop()
    asked = evictions.asked()
    for name in pool.initial:
        (attempt,) = attempts(agent.runs_dir, name, V2_FINGERPRINT)
        assert f"{name}-app" in asked, f"MCM drained Node {name}"
        assert asked[f"{name}-app"] < attempt.started, f"Node {name} was drained before the play started"
    assert ADDRESS_ANNOTATION not in ns.node_annotations(pool.node(unlisted_name))
    started = [line for line in agent.log().splitlines() if "state=started" in line]
    ours = [line for line in started if f"machine={mcm.NAMESPACE}/{unlisted_name} " in line]
    assert len(ours) == 1 and f"host={unlisted_host.address} source=machine status " in ours[0], started
    assert most == 1, "maxUnavailable 1: one Node at a time is drained and updated"
    assert sorted(m["metadata"]["name"] for m in pool.machines()) == pool.initial, "none replaced"
    new_sets = {m["metadata"]["ownerReferences"][0]["name"] for m in pool.machines()}
    classes = {
        ms["spec"]["template"]["spec"]["class"]["name"]
        for ms in mcm_objects.listed(kubelab_mcm, "machinesets.machine.sapcloud.io", "name=auto")
        if ms["metadata"]["name"] in new_sets
    }
    assert classes == {pool.classes["v2"]}, "all moved to the new MachineSet"
    for node in pool.nodes():
        assert_host_updated(lab, pool.host_of(node))
        assert not ns.has_critical_taint(node) and not node["spec"].get("unschedulable")
    assert not any(Path(f"/tmp/mcm-pwned{n}").exists() for n in ("", "2", "3"))
    assert all(objects.get(kubelab_mcm, "pod", f"{n}-app", WORKLOAD) is None for n in pool.initial), "drained"
    scrape = agent.get("/metrics").text
    assert 'inplace_extension_mcm_update_results_total{result="successful"} 3.0' in scrape
    assert "inplace_extension_mcm_nodes_updating 0.0" in scrape


def test_manual_rollout_updates_only_the_selected_node(
    kubelab_mcm: Lab, lab: HostLab, pool_factory: Any, start_agent: StartAgent
) -> None:
    """Also: a selected Node that neither the annotation, nor the inventory, nor an IP of its status
    places is answered failed with the stable HostNotFound message, and its host is never touched."""
    pool = pool_factory("manual", orchestration="Manual")
    chosen, nowhere, *others = pool.initial
    nowhere_host = pool.host_of(pool.node(nowhere))
    find_by_status_address(kubelab_mcm, nowhere, None)
    agent = start_agent(unlisted=[nowhere_host])
    pool.switch("v2")
    candidates = lambda: all(ns.CANDIDATE_LABEL in ns.node_labels(n) for n in pool.nodes())  # noqa: E731
    wait_on_mcm(pool, candidates, ROLLOUT, "MCM marks every Node a candidate", [agent])
    kubelab_mcm.kubectl("label", "node", chosen, f"{SELECTED_LABEL}=true")

    def chosen_done() -> bool:
        node = pool.node(chosen)
        return ns.CANDIDATE_LABEL not in ns.node_labels(node) and not ns.has_critical_taint(node)

    watch_rollout(pool, chosen_done, agents=[agent])
    assert_host_updated(lab, pool.host_of(pool.node(chosen)))
    for name in others:
        node = pool.node(name)
        assert ns.in_place_reason(node) == "CandidateForUpdate"
        assert stamp_writes(lab, pool.host_of(node)) == [], "an unselected host is never touched"
    kubelab_mcm.kubectl("label", "node", nowhere, "node.machine.sapcloud.io/selected-for-update=true")
    failed = lambda: ns.node_labels(pool.node(nowhere)).get(ns.RESULT_LABEL) == ns.FAILED  # noqa: E731
    wait_on_mcm(pool, failed, ROLLOUT, "a Node with no usable address is answered failed", [agent])
    assert ns.node_annotations(pool.node(nowhere))[ns.FAILED_REASON_ANNOTATION] == HOST_NOT_FOUND
    assert stamp_writes(lab, nowhere_host) == [], "no host was guessed"


BUDGET = 2  # the agent's --max-failed-attempts in the test of the retry budget
UNREACHABLE = "host unreachable"
BLOCKED = f"blocked after {BUDGET} failed attempts: {UNREACHABLE}"


def node_events(lab: Lab, node: str) -> list[tuple[str, str, str]]:
    """The Events about a Node: (type, reason, message)."""
    selector = f"involvedObject.kind=Node,involvedObject.name={node}"
    return [
        (e.get("type", ""), e.get("reason", ""), e.get("message", ""))
        for e in reads.list_objects(lab, "events", "default", fields=selector)
    ]


def test_task_failure_stalls_until_the_retry_annotation(
    kubelab_mcm: Lab, lab: HostLab, pool_factory: Any, start_agent: StartAgent
) -> None:
    """A task failure stalls the rollout until the retry annotation. Then the hosts not updated yet are
    unreachable (sshd stopped): the next Node MCM hands over is retried after a backoff until its retry
    budget (2) is spent, and answered blocked (the Node's reason, the Machine's last operation, a Warning
    Event, the agent's metric). With sshd back it stays blocked: the agent looks at it again and starts
    nothing. The retry annotation resets the budget: it is answered successful, the rollout completes."""
    pool = pool_factory("failing")
    agent = start_agent(extra=["--max-failed-attempts", str(BUDGET), "--log-level", "debug"])
    # a service restart fails once on every host; MCM's first Node (its order is its cache's) fails, and
    # the hosts it has not handed over yet have theirs taken back
    armed = [faults.fail_next(lab, each, "systemctl") for each in pool.hosts]
    pool.switch("v2")

    def failed_node() -> str | None:
        return next(
            (n for n in pool.initial if ns.node_labels(pool.node(n)).get(ns.RESULT_LABEL) == ns.FAILED), None
        )

    wait_on_mcm(pool, lambda: failed_node() is not None, ROLLOUT, "the first Node's task fails", [agent])
    name = failed_node()
    assert name is not None
    host = pool.host_of(pool.node(name))
    pending = {n: pool.host_of(pool.node(n)) for n in pool.initial if n != name}
    for program, each in zip(armed, pool.hosts, strict=True):
        assert each == host or faults.spare(lab, each, program), f"{each.name}: nothing ran on it yet"
    reason = ns.node_annotations(pool.node(name))[ns.FAILED_REASON_ANNOTATION]
    assert reason.endswith("failed on host") and '"' in reason, reason

    def machine_shows(node: str, message: str) -> bool:
        machine = next(m for m in pool.machines() if m["metadata"]["name"] == node)
        return message in machine.get("status", {}).get("lastOperation", {}).get("description", "")

    def machine_failed(node: str) -> bool:
        machine = next(m for m in pool.machines() if m["metadata"]["name"] == node)
        return mcm_objects.phase(machine) == "InPlaceUpdateFailed"

    wait_on_mcm(
        pool, lambda: machine_shows(name, reason), 60, "MCM shows our message on the Machine", [agent]
    )
    assert pool.deployment().get("status", {}).get("updatedReplicas", 0) < 3, "the rollout stalls"
    assert all(stamp_writes(lab, each) == [] for each in pool.hosts)
    # a retriable failure next, on the Node MCM hands over after the failed one
    for each in pending.values():
        faults.sshd(lab, each, running=False)

    def reason_of(node: str) -> str:
        return ns.node_annotations(pool.node(node)).get(ns.FAILED_REASON_ANNOTATION, "")

    def blocked_node() -> str | None:
        return next((n for n in pending if reason_of(n) == BLOCKED), None)

    try:
        kubelab_mcm.kubectl("annotate", "node", name, "inplace-extension.io/retry=1")
        wait_on_mcm(
            pool, lambda: blocked_node() is not None, ROLLOUT, "blocked after its budget", [agent], 0.25
        )
        blocked = blocked_node()
        assert blocked is not None
        assert ns.node_labels(pool.node(blocked)).get(ns.RESULT_LABEL) == ns.FAILED
        # MCM copies the Node's reason into the Machine once, when it turns InPlaceUpdateFailed: at the
        # first try's "retrying" answer unless MCM was slower than the second try; the blocked answer
        # keeps the label "failed", so MCM keeps the copy it made (docs/operator-controls.md)
        shown = lambda: machine_failed(blocked) and machine_shows(blocked, UNREACHABLE)  # noqa: E731
        wait_on_mcm(pool, shown, 60, "MCM shows the blocked Node's failure on its Machine", [agent])
        warning = ("Warning", "InPlaceUpdateFailed", BLOCKED)
        assert wait_until(lambda: warning in node_events(kubelab_mcm, blocked), 60, 0.5), "a Warning Event"
        assert "inplace_extension_updates_blocked 1.0" in agent.get("/metrics").text
    finally:
        for each in pending.values():
            faults.sshd(lab, each, running=True)
    tries = attempts(agent.runs_dir, blocked, V2_FINGERPRINT)
    assert [a.outcome.kind if a.outcome else None for a in tries] == [OutcomeKind.UNREACHABLE] * BUDGET
    first_try, second_try = tries
    assert first_try.outcome is not None and second_try.outcome is not None
    assert second_try.started >= first_try.outcome.finished + RETRY_AFTER, "retried after a backoff"
    # a third try would start a backoff after the second; the agent's first look after both (sshd back,
    # the backoff over) finds the Node answered and starts nothing: it stays blocked
    backoff_over = second_try.outcome.finished + backoff_seconds(BUDGET, RETRY_AFTER)
    assert wait_until(lambda: time.time() > backoff_over, 60, 0.1)
    offset = len(agent.log())
    looked = f"node {blocked}: answered failed already for this desired state"
    assert wait_until(lambda: looked in agent.log()[offset:], 60, 0.25), "the agent looks again (resync)"
    assert len(attempts(agent.runs_dir, blocked, V2_FINGERPRINT)) == BUDGET, "not retried by itself"
    assert reason_of(blocked) == BLOCKED and stamp_writes(lab, pool.host_of(pool.node(blocked))) == []

    kubelab_mcm.kubectl("annotate", "node", blocked, "inplace-extension.io/retry=1")  # a full budget again
    watch_rollout(pool, pool.finished, agents=[agent])
    for node in pool.nodes():
        assert_host_updated(lab, pool.host_of(node))
    *_, last = attempts(agent.runs_dir, blocked, V2_FINGERPRINT)
    assert last.outcome is not None and last.outcome.kind is OutcomeKind.SUCCESSFUL
    assert last.retry_token == retry_token("1") != first_try.retry_token
    said = f"node {blocked}: update-result="
    answers = [line.split(said, 1)[1].strip() for line in agent.log().splitlines() if said in line]
    assert answers[0] == f"{ns.FAILED} {UNREACHABLE}, retrying (attempt 2)", answers
    assert answers[-1] == ns.SUCCESSFUL, answers
    assert f"{ns.FAILED} {BLOCKED}" in answers, answers
    assert "inplace_extension_updates_blocked 0.0" in agent.get("/metrics").text


def test_a_replica_killed_mid_update_resumes_beside_the_other_without_a_second_apply(
    kubelab_mcm: Lab, lab: HostLab, pool_factory: Any, start_agent: StartAgent, tmp_path: Path
) -> None:
    """Two replicas (their Pod names as --agent-id); the one whose play runs is SIGKILLed once the play
    started and restarted as its Pod would be (same name, same runs volume): it resumes its own Node while
    the other's claims keep the other one out; every host is applied once."""
    pool = pool_factory("killed")
    # a claim that outlasts a slow restart here: the restarted replica must not need it to expire
    claim = ("--claim-seconds", "120")
    replicas = {name: tmp_path / f"runs-{name}" for name in ("replica-a", "replica-b")}
    agents = {
        name: start_agent(runs, name=name, extra=["--agent-id", name, *claim])
        for name, runs in replicas.items()
    }
    pool.switch("v2")

    def started() -> str | None:  # the replica whose play runs (the run's state "started" and beyond)
        return next((name for name, runs in replicas.items() if play_started(runs)), None)

    wait_on_mcm(pool, lambda: started() is not None, ROLLOUT, "a play started", list(agents.values()), 0.1)
    victim = started()
    assert victim is not None
    agents[victim].kill()  # its play goes on, detached, and releases the host lock when it ends
    (node,) = {p.name.split(".")[1] for p in replicas[victim].glob(f"{mcm.NAMESPACE}.*")}
    restarted = start_agent(
        replicas[victim], name=f"{victim}-restarted", extra=["--agent-id", victim, *claim]
    )
    watch_rollout(pool, pool.finished, agents=[*agents.values(), restarted])
    for each in pool.nodes():
        assert_host_updated(lab, pool.host_of(each))
        assert ns.node_labels(each).get(ns.RESULT_LABEL) is None, "MCM cleaned up after our result"
    (other,) = set(replicas) - {victim}
    assert attempts(replicas[other], node, V2_FINGERPRINT) == [], "the other replica kept out of its Node"
    assert len(attempts(replicas[victim], node, V2_FINGERPRINT)) >= 1


def outcomes(runs: Path) -> dict[str, list[str | None]]:
    """Run ident (one per Node and desired state) -> the outcome of each attempt on disk (None: running)."""
    found: dict[str, list[str | None]] = {}
    for attempt in sorted(runs.glob("*/attempt-*")):
        outcome = attempt / "outcome.json"
        kind = json.loads(outcome.read_text())["kind"] if outcome.exists() else None
        found.setdefault(attempt.parent.name, []).append(kind)
    return found


def ours(node: Mapping[str, Any]) -> list[str]:
    """The metadata the agent writes that is still on a Node: its result and its own annotations (the
    static-hosts driver's ``inplace-extension.io/address`` is the lab's, not the agent's)."""
    keys = [ns.RESULT_LABEL, ns.FAILED_REASON_ANNOTATION, ns.CLAIM_ANNOTATION, ns.ANSWERED_ANNOTATION]
    present = {**ns.node_labels(node), **ns.node_annotations(node)}
    return [key for key in keys if key in present]


def test_an_apiserver_restart_while_the_second_node_updates(
    kubelab_mcm: Lab, lab: HostLab, pool_factory: Any, start_agent: StartAgent
) -> None:
    """The kube-apiserver restarts while the second Node's play runs and the play ends during the outage:
    the agent's answer is written once the API is back, every host is updated once, MCM completes the
    rollout, and nothing of ours is left on the Nodes."""
    pool = pool_factory("outage")
    agent = start_agent()
    pool.switch("v2")
    second_run = lambda: len(outcomes(agent.runs_dir)) >= 2  # noqa: E731
    wait_on_mcm(pool, second_run, ROLLOUT, "the second run started", [agent], 0.1)
    (second,) = [ident for ident, kinds in outcomes(agent.runs_dir).items() if None in kinds]
    kubelab_mcm.stop_apiserver()
    try:
        assert wait_until(lambda: not agent.healthy(), 60, 0.2), "/healthz says the watch is down"
        ended = lambda: None not in outcomes(agent.runs_dir)[second]  # noqa: E731
        assert wait_until(ended, 120, 0.2), "the play ended during the outage"
    finally:
        kubelab_mcm.start_apiserver()
    assert wait_until(agent.healthy, 120, 0.5), "the watch reconnects"
    most = watch_rollout(pool, pool.finished, agents=[agent])
    assert most == 1, "one Node at a time"
    assert wait_until(lambda: not any(ours(n) for n in pool.nodes()), 60, 0.5), [
        ours(n) for n in pool.nodes()
    ]
    runs = outcomes(agent.runs_dir)
    assert len(runs) == 3 and all(kinds.count("successful") == 1 for kinds in runs.values()), runs
    for node in pool.nodes():
        assert_host_updated(lab, pool.host_of(node))
        assert not node["spec"].get("unschedulable") and not ns.has_critical_taint(node)
    scrape = agent.get("/metrics").text
    assert 'inplace_extension_mcm_update_results_total{result="successful"} 3.0' in scrape
    assert 'inplace_extension_mcm_update_results_total{result="failed"}' not in scrape


# from the agent's start, the first Node is drained and handed to it well inside this (10 s measured
# with a load average of 20 on 2 cores); the window opens at the first whole minute after it
WINDOW_LEAD = timedelta(seconds=30)
PAUSE = "inplace-extension.io/pause"


def node_event_messages(lab: Lab, node: str) -> list[str]:
    selector = f"involvedObject.kind=Node,involvedObject.name={node}"
    return [
        str(event.get("message", ""))
        for event in reads.list_objects(lab, "events", "default", fields=selector)
    ]


def test_a_window_a_pause_a_cancel_and_a_resume_in_one_rollout(
    kubelab_mcm: Lab,
    lab: HostLab,
    pool_factory: Any,
    start_agent: StartAgent,
    e2e_capabilities: Path,
    tmp_path: Path,
) -> None:
    """Every hold of docs/operator-controls.md in one rollout of 3 with the real MCM: the first Node waits
    for a maintenance window that opens during the test; a pause set while its run is in flight lets that
    run finish and holds the next Node MCM hands over (and MCM drains no third meanwhile); a cancel fails
    the held Node visibly in MCM; removing the annotation resumes and the rollout completes."""
    pool = pool_factory("held")
    opens = (datetime.now(UTC) + WINDOW_LEAD + timedelta(minutes=1)).replace(second=0, microsecond=0)
    capabilities = tmp_path / "capabilities.yaml"
    capabilities.write_text(
        e2e_capabilities.read_text()
        + f"maintenance_windows:\n  - name: held-nights\n    cron: '{opens.minute} {opens.hour} * * *'\n"
        + "    duration: 1h\n"
    )
    agent = start_agent(capabilities=capabilities, extra=("--log-level", "debug"))
    runs = agent.runs_dir

    def annotate(value: str) -> None:
        kubelab_mcm.kubectl(
            "annotate", mcm_objects.MACHINE_DEPLOYMENTS, "held", "-n", mcm.NAMESPACE, value, "--overwrite"
        )

    def told(message: str) -> set[str]:
        """The Nodes the agent logged ``message`` for (once per change of what a Node waits for)."""
        return set(re.findall(rf"node (\S+): {re.escape(message)}$", agent.log(), re.MULTILINE))

    def attempts(node: str) -> list[Path]:
        return sorted(runs.glob(f"{mcm.NAMESPACE}.{node}.*/attempt-*/meta.json"))

    pool.switch("v2")
    window = f'waiting for maintenance window "held-nights" (opens {opens:%Y-%m-%dT%H:%M}Z)'
    handed = lambda: bool(told(window))  # noqa: E731
    wait_on_mcm(
        pool, handed, WINDOW_LEAD.total_seconds(), "the first Node waits for the window", [agent], 0.25
    )
    assert datetime.now(UTC) < opens, "the wait was seen only after the opening: raise WINDOW_LEAD"
    (first,) = told(window)
    assert not list(runs.glob("*/attempt-*")), "nothing starts before the window opens"
    assert window in node_event_messages(kubelab_mcm, first)

    # the window opens: the first run starts; a pause set while it is in flight lets it finish
    until_open = (opens - datetime.now(UTC)).total_seconds()
    assert wait_until(lambda: bool(attempts(first)), until_open + 60, 0.1), agent.log()
    annotate(f"{PAUSE}=true")
    assert not (attempts(first)[0].parent / "outcome.json").exists(), "paused while the run is in flight"
    assert json.loads(attempts(first)[0].read_text())["started"] >= opens.timestamp()
    paused = f"paused by MachineDeployment {mcm.NAMESPACE}/held (annotation {PAUSE})"
    wait_on_mcm(
        pool, lambda: bool(told(paused)), ROLLOUT, "MCM hands over the next Node, held", [agent], 0.25
    )
    (second,) = told(paused)
    assert second != first and stamp_writes(lab, pool.host_of(pool.node(first))) == [V2_FINGERPRINT]
    # observed over the agent's own next looks at the held Node (it looks every resync, 2 s here)
    still = f"node {second}: still {paused}"
    assert wait_until(lambda: agent.log().count(still) >= 3, 60, 0.25), agent.log()
    held = pool.node(second)
    assert ns.in_place_reason(held) == ns.READY_FOR_UPDATE and ns.RESULT_LABEL not in ns.node_labels(held)
    assert not attempts(second) and stamp_writes(lab, pool.host_of(held)) == [], "nothing ran on it"
    (third,) = set(pool.initial) - {first, second}
    assert not pool.node(third).get("spec", {}).get("unschedulable"), "MCM drains no other Node"
    assert paused in node_event_messages(kubelab_mcm, second)
    assert 'inplace_extension_updates_waiting{reason="pause"} 1.0' in agent.get("/metrics").text

    annotate(f"{PAUSE}=cancel")
    cancelled = f"cancelled by MachineDeployment {mcm.NAMESPACE}/held (annotation {PAUSE}=cancel)"

    def mcm_shows_it() -> bool:
        machine = next(m for m in pool.machines() if m["metadata"]["name"] == second)
        operation = machine.get("status", {}).get("lastOperation", {})
        return mcm_objects.phase(machine) == "InPlaceUpdateFailed" and cancelled in str(
            operation.get("description", "")
        )

    wait_on_mcm(pool, mcm_shows_it, 120, "MCM shows the cancel on the Machine", [agent])
    assert ns.node_annotations(pool.node(second))[ns.FAILED_REASON_ANNOTATION] == cancelled
    assert pool.deployment().get("status", {}).get("updatedReplicas", 0) < 3, "the rollout stops"
    assert not attempts(second) and not pool.node(third).get("spec", {}).get("unschedulable")

    annotate(f"{PAUSE}-")  # resume: the cancelled Node starts, MCM goes on with the third
    watch_rollout(pool, pool.finished, agents=[agent])
    for node in pool.nodes():
        assert_host_updated(lab, pool.host_of(node))
    assert len(attempts(second)) == 1 and len(attempts(third)) == 1


LEFT = "/etc/mcm/left-by-a-failed-run.conf"
# the first file lands, the second cannot (its parent is a file): the run fails after writing one
FAILING_FILES: dict[str, Any] = {
    "kubernetesVersion": START_VERSION,
    "kubeadmConfigSpec": {
        "files": [
            {"path": LEFT, "content": "stale\n", "owner": "root:root", "permissions": "0644"},
            {
                "path": "/etc/passwd/cannot.conf",
                "content": "x\n",
                "owner": "root:root",
                "permissions": "0644",
            },
        ]
    },
}
FIXED_FILES: dict[str, Any] = {
    "kubernetesVersion": START_VERSION,
    "kubeadmConfigSpec": {
        "files": [
            {"path": "/etc/mcm/kept.conf", "content": "kept\n", "owner": "root:root", "permissions": "0644"}
        ]
    },
}


def test_a_later_desired_state_removes_the_files_of_a_failed_one(
    kubelab_mcm: Lab, lab: HostLab, nodes: list[Host], start_agent: StartAgent
) -> None:
    """As a user would: a desired state whose file step fails half-way, then the class fixed: the file
    the failed run wrote is gone once the fixed one completes (the failed run recorded it as ours)."""
    host = nodes[0]
    pool = Pool(kubelab_mcm, "leftover", [host], {"v1": V1, "v2": FAILING_FILES})
    try:
        agent = start_agent()
        (name,) = pool.initial
        pool.switch("v2")
        failed = lambda: ns.node_labels(pool.node(name)).get(ns.RESULT_LABEL) == ns.FAILED  # noqa: E731
        wait_on_mcm(pool, failed, ROLLOUT, "the file step fails", [agent])
        assert run_on(lab, host, ["cat", LEFT]) == "stale\n", "the first file was written before the failure"
        # the user fixes the class (the Machines keep it) and asks for a retry
        objects.apply(
            kubelab_mcm, mcm_objects.machine_class(pool.classes["v2"], {"inPlaceUpdate": FIXED_FILES})
        )
        kubelab_mcm.kubectl("annotate", "node", name, "inplace-extension.io/retry=1")
        watch_rollout(pool, pool.finished, agents=[agent])
        assert run_on(lab, host, ["cat", "/etc/mcm/kept.conf"]) == "kept\n"
        assert lab.exec_in(host, ["test", "-e", LEFT]).returncode != 0, "the failed run's file was removed"
    finally:
        pool.delete()


CEPH_GROUP, CEPH_KIND, CEPH_PLURAL = "lab.inplace-extension.io", "CephCluster", "cephclusters"
CEPH_HEALTH = 'object.status.health == "HEALTH_OK"'
PLAY_GATE = "/tmp/inplace-ceph-play-gate"  # the play's command check passes once the test creates it
# the check's timeout before the start: well beyond the test's look at the wait (two kubectl calls,
# seconds each on a loaded CI machine), short enough to cost the run little
HEALTH_TIMEOUT = 20


def test_a_kubernetes_health_check_holds_a_node_before_and_after_its_update(
    kubelab_mcm: Lab, lab: HostLab, nodes: list[Host], start_agent: StartAgent, e2e_capabilities: Path
) -> None:
    """docs/operator-controls.md, health checks on cluster objects, with the real MCM: a CRD-backed object
    (a CephCluster-like kind) that is not healthy holds the Node's update before it starts (no run, no
    result: MCM keeps it waiting); past the check's timeout the Node gets the failed result naming it
    (still nothing run; not final); once its status flips the update starts; made unhealthy while the
    play runs, it holds the result after the play until it flips back (the timeout is the start's
    only). A command check of the same file keeps the play on the host until the test has flipped the
    object (no race with the play's end)."""
    host = nodes[0]
    crd = objects.define_kind(kubelab_mcm, CEPH_GROUP, CEPH_KIND, CEPH_PLURAL)
    ceph_ns = f"rook-{datetime.now(UTC):%H%M%S}"
    objects.ensure_namespace(kubelab_mcm, ceph_ns)
    metadata = {"name": "ceph", "namespace": ceph_ns}
    objects.apply(kubelab_mcm, {"apiVersion": f"{CEPH_GROUP}/v1", "kind": CEPH_KIND, "metadata": metadata})

    def health(value: str) -> None:
        objects.set_status(kubelab_mcm, crd, "ceph", ceph_ns, {"health": value})

    health("HEALTH_WARN")
    lab.exec_in(host, ["rm", "-f", PLAY_GATE])
    capabilities = Path(str(e2e_capabilities) + ".ceph")
    capabilities.write_text(
        e2e_capabilities.read_text()
        + "health_checks:\n"
        + "  - name: play_gate\n"
        + f"    command: [test, -e, {PLAY_GATE}]\n"
        + "  - name: ceph\n"
        + "    kubernetes:\n"
        + f"      api_version: {CEPH_GROUP}/v1\n"
        + f"      kind: {CEPH_KIND}\n"
        + f"      namespace: {ceph_ns}\n"
        + "      name: ceph\n"
        + f"      expression: '{CEPH_HEALTH}'\n"
        + f"      timeout: {HEALTH_TIMEOUT}s\n"
    )
    pool = Pool(kubelab_mcm, "ceph", [host], {"v1": V1, "v2": FIXED_FILES})
    try:
        agent = start_agent(capabilities=capabilities)
        (name,) = pool.initial
        runs = agent.runs_dir
        pool.switch("v2")
        before = f'waiting for health check "ceph" ({CEPH_HEALTH} is false on {CEPH_KIND} {ceph_ns}/ceph)'
        waiting = lambda: f"node {name}: {before}" in agent.log()  # noqa: E731
        wait_on_mcm(pool, waiting, ROLLOUT, "the Node waits for the health check", [agent], 0.25)
        assert not list(runs.glob("*/attempt-*")), "nothing starts while the check does not hold"
        assert ns.RESULT_LABEL not in ns.node_labels(pool.node(name)), "no result: MCM keeps the Node waiting"
        assert before in node_event_messages(kubelab_mcm, name)

        # past the timeout: the failed result names the check (the Failure does not carry the reason)
        timed_out = (
            f'health check "ceph" did not hold within {HEALTH_TIMEOUT}s before the update '
            f"({CEPH_HEALTH} on {CEPH_KIND} {ceph_ns}/ceph)"
        )
        failed = f"node {name}: update-result={ns.FAILED} {timed_out}"
        assert wait_until(lambda: failed in agent.log(), HEALTH_TIMEOUT + 60, 0.25), agent.log()
        annotations = ns.node_annotations(pool.node(name))
        assert annotations[ns.FAILED_REASON_ANNOTATION] == timed_out
        assert ns.ANSWERED_ANNOTATION not in annotations, "not final: the agent looks again"
        assert timed_out in node_event_messages(kubelab_mcm, name)
        assert not list(runs.glob("*/attempt-*")), "nothing starts before the check holds"
        assert list(runs.glob("*/health-wait.json")), "the wait's clock is on disk"

        health("HEALTH_OK")  # the object flips: the update starts
        assert wait_until(lambda: bool(list(runs.glob("*/attempt-*"))), 120, 0.25), agent.log()
        health("HEALTH_ERR")  # the update made it unhealthy; the play is held on the host until now
        lab.exec_in(host, ["touch", PLAY_GATE])
        after = f"health gate: {before}"
        assert wait_until(lambda: f"node {name}: {after}" in agent.log(), 120, 0.25), agent.log()
        assert stamp_writes(lab, host) != [], "applied on the host"
        # no new result while the check waits: the Node still has the one from before the start
        held = pool.node(name)
        assert ns.node_labels(held)[ns.RESULT_LABEL] == ns.FAILED
        assert ns.node_annotations(held)[ns.FAILED_REASON_ANNOTATION] == timed_out

        health("HEALTH_OK")
        watch_rollout(pool, pool.finished, 300, [agent])
        assert run_on(lab, host, ["cat", "/etc/mcm/kept.conf"]) == "kept\n"
        assert len(list(runs.glob("*/attempt-*"))) == 1, "one run: the waits started nothing"
    finally:
        pool.delete()
        lab.exec_in(host, ["rm", "-f", PLAY_GATE])


FIXED_FILES_FINGERPRINT = plan_for(
    InPlaceUpdateSpec.model_validate(FIXED_FILES), mcm.NAMESPACE, "any"
).fingerprint


def test_a_node_whose_host_comes_back_during_the_backoff_completes_without_the_retry_annotation(
    kubelab_mcm: Lab, lab: HostLab, nodes: list[Host], start_agent: StartAgent
) -> None:
    """Natural recovery under the real MCM: the Node's host is unreachable (sshd stopped) when MCM hands
    it over; the agent answers the retriable failure and retries after the backoff. The host comes back
    meanwhile, and with no retry annotation (nobody touches the Node) the next attempt updates it, the
    successful result lets MCM finish the rollout, one stamp write."""
    host = nodes[0]
    pool = Pool(kubelab_mcm, "recover", [host], {"v1": V1, "v2": FIXED_FILES})
    try:
        agent = start_agent()
        (name,) = pool.initial
        retrying = f"node {name}: update-result={ns.FAILED} {UNREACHABLE}, retrying (attempt 2)"
        faults.sshd(lab, host, running=False)
        try:
            pool.switch("v2")
            retried = lambda: retrying in agent.log()  # noqa: E731
            wait_on_mcm(pool, retried, ROLLOUT, "the unreachable host's update is retried", [agent], 0.25)
        finally:
            faults.sshd(lab, host, running=True)  # back, within the backoff
        watch_rollout(pool, pool.finished, 300, [agent])
        tries = attempts(agent.runs_dir, name, FIXED_FILES_FINGERPRINT)
        kinds = [a.outcome.kind if a.outcome else None for a in tries]
        assert kinds[0] is OutcomeKind.UNREACHABLE and kinds[-1] is OutcomeKind.SUCCESSFUL, kinds
        assert all(a.retry_token == retry_token(None) for a in tries), "no retry annotation was needed"
        assert "inplace-extension.io/retry" not in ns.node_annotations(pool.node(name))
        assert stamp_writes(lab, host) == [FIXED_FILES_FINGERPRINT]
        assert run_on(lab, host, ["cat", "/etc/mcm/kept.conf"]) == "kept\n"
    finally:
        pool.delete()
