"""The MCM agent against the kubelab's real apiserver, with MCM's real CRDs and hand-made MCM objects
(no MCM controllers here: tests/mcm_lab runs those) and a scripted executor instead of Ansible.

Checked: the desired state path (Node -> Machine -> MachineSet -> MachineDeployment -> current
MachineSet -> MachineClass), results as merge patches (and nothing else on the Node changed), the
retriable failure answered ``failed`` then recovered, Events, another replica's claim respected, the
critical-components taint removed once MCM is done, and the watch surviving an API outage.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from hostlab.proc import wait_until
from kubelab import objects
from kubelab.lab import Lab

from inplace_extension.kube.cluster import connect_control
from inplace_extension.mcm import node_state as ns
from inplace_extension.mcm.agent import AgentOptions
from inplace_extension.mcm.desired import parse_spec, plan_for
from inplace_extension.runs.model import Progress, ProgressState, RunRequest

from .lab_objects import NAMESPACE, NEW, WAIT, done_after_two, label, make_node, make_pool, node, unique
from .support import AgentThread, ScriptedRuns, StallingForwarder

pytestmark = pytest.mark.kube
WINDOW_MESSAGE = 'waiting for maintenance window "nights" (opens 2026-12-01T22:00Z)'


@pytest.fixture
def agent(kube: Lab) -> Iterator[tuple[AgentThread, ScriptedRuns]]:
    def answer(request: RunRequest, calls: int) -> Progress:
        if request.name.startswith("fail"):
            return Progress(ProgressState.FAILED, 'ntp: task "configure" failed on host')
        if request.name.startswith("flaky") and request.name not in runs.released:
            return Progress(
                ProgressState.IN_PROGRESS, "host unreachable, retrying (attempt 2)", 1, retrying=True
            )
        if request.name.startswith("held") and request.name not in runs.released:
            return Progress(ProgressState.IN_PROGRESS, WINDOW_MESSAGE, 1, waiting="window")
        return done_after_two(request, calls)

    runs = ScriptedRuns(answer)
    options = AgentOptions(namespace=NAMESPACE, poll_seconds=0.2, resync_seconds=1.0, claim_seconds=60)
    thread = AgentThread(kube.kubeconfig, options, runs)
    assert wait_until(lambda: thread.connected, WAIT, 0.1), "the agent lists and watches Nodes"
    yield thread, runs
    thread.stop()


def test_ready_node_is_updated_to_the_new_machine_sets_class(
    kube: Lab, agent: tuple[AgentThread, ScriptedRuns]
) -> None:
    _, runs = agent
    pool, machine = unique("pool"), unique("m")
    make_pool(kube, pool, machine)
    name = unique("ok")
    make_node(kube, name, machine, ns.READY_FOR_UPDATE, annotations={ns.FAILED_REASON_ANNOTATION: "old"})
    assert wait_until(lambda: label(kube, name) == ns.SUCCESSFUL, WAIT, 0.2)
    expected = plan_for(parse_spec({"providerSpec": {"inPlaceUpdate": NEW}}), NAMESPACE, name)
    assert {r.fingerprint for r in runs.seen(name)} == {expected.fingerprint}, "the NEW MachineSet's class"
    after = node(kube, name)
    annotations = ns.node_annotations(after)
    assert ns.FAILED_REASON_ANNOTATION not in annotations and ns.CLAIM_ANNOTATION not in annotations
    assert ns.node_labels(after)["keep"] == "me" and ns.CANDIDATE_LABEL in ns.node_labels(after)
    assert ns.in_place_reason(after) == ns.READY_FOR_UPDATE, "MCM's condition is never touched"
    assert wait_until(
        lambda: _events(kube, name) >= {"InPlaceUpdateStarted", "InPlaceUpdateSucceeded"}, WAIT, 0.2
    )


def _events(kube: Lab, node_name: str) -> set[str]:
    selector = f"involvedObject.name={node_name}"
    out = kube.kubectl(
        "get", "events", "-n", "default", "--field-selector", selector, "-o", "jsonpath={.items[*].reason}"
    ).stdout
    return set(out.split())


def test_task_failure_is_answered_failed_with_the_message(
    kube: Lab, agent: tuple[AgentThread, ScriptedRuns]
) -> None:
    pool, machine = unique("pool"), unique("m")
    make_pool(kube, pool, machine)
    name = unique("fail")
    make_node(kube, name, machine, ns.READY_FOR_UPDATE)
    assert wait_until(lambda: label(kube, name) == ns.FAILED, WAIT, 0.2)
    reason = ns.node_annotations(node(kube, name))[ns.FAILED_REASON_ANNOTATION]
    assert reason == 'ntp: task "configure" failed on host'
    assert wait_until(lambda: "InPlaceUpdateFailed" in _events(kube, name), WAIT, 0.2)


def test_retriable_failure_says_failed_then_recovers(
    kube: Lab, agent: tuple[AgentThread, ScriptedRuns]
) -> None:
    _, runs = agent
    pool, machine = unique("pool"), unique("m")
    make_pool(kube, pool, machine)
    name = unique("flaky")
    make_node(kube, name, machine, ns.READY_FOR_UPDATE)
    assert wait_until(lambda: label(kube, name) == ns.FAILED, WAIT, 0.1)
    assert "host unreachable" in ns.node_annotations(node(kube, name))[ns.FAILED_REASON_ANNOTATION]
    # MCM would now set UpdateFailed; the agent keeps going and, the host back, turns it successful
    make_node(kube, name, machine, ns.UPDATE_FAILED)
    runs.released.add(name)
    assert wait_until(lambda: label(kube, name) == ns.SUCCESSFUL, WAIT, 0.2)
    assert ns.FAILED_REASON_ANNOTATION not in ns.node_annotations(node(kube, name))


def test_outside_its_window_a_node_is_left_waiting_without_a_result(
    kube: Lab, agent: tuple[AgentThread, ScriptedRuns]
) -> None:
    _, runs = agent
    pool, machine = unique("pool"), unique("m")
    make_pool(kube, pool, machine)
    name = unique("held")
    make_node(kube, name, machine, ns.READY_FOR_UPDATE)
    assert wait_until(lambda: "InPlaceUpdateWaiting" in _events(kube, name), WAIT, 0.2)
    assert wait_until(lambda: len(runs.seen(name)) >= 3, WAIT, 0.1), "asked again after retryAfter"
    assert label(kube, name) is None, "no result: MCM keeps the Node waiting"
    assert "InPlaceUpdateStarted" not in _events(kube, name)
    runs.released.add(name)  # the window opened
    assert wait_until(lambda: label(kube, name) == ns.SUCCESSFUL, WAIT, 0.2)


def test_missing_desired_state_is_a_failure_naming_the_object(
    kube: Lab, agent: tuple[AgentThread, ScriptedRuns]
) -> None:
    name = unique("orphan")
    make_node(kube, name, "no-such-machine", ns.READY_FOR_UPDATE)
    assert wait_until(lambda: label(kube, name) == ns.FAILED, WAIT, 0.2)
    assert "no-such-machine" in ns.node_annotations(node(kube, name))[ns.FAILED_REASON_ANNOTATION]


def test_another_replicas_claim_is_respected(kube: Lab, agent: tuple[AgentThread, ScriptedRuns]) -> None:
    thread, runs = agent
    pool, machine = unique("pool"), unique("m")
    make_pool(kube, pool, machine)
    name = unique("claimed")
    claim = ns.claim_value("other-replica", 3600)
    make_node(kube, name, machine, ns.READY_FOR_UPDATE, annotations={ns.CLAIM_ANNOTATION: claim})
    other = unique("ok")
    make_node(kube, other, machine, ns.READY_FOR_UPDATE)
    assert wait_until(lambda: label(kube, other) == ns.SUCCESSFUL, WAIT, 0.2), "the agent is working"
    assert wait_until(lambda: thread.agent is not None, WAIT, 0.1)
    assert label(kube, name) is None and not runs.seen(name)
    assert ns.node_annotations(node(kube, name))[ns.CLAIM_ANNOTATION] == claim


def test_critical_taint_removed_once_mcm_is_done(kube: Lab, agent: tuple[AgentThread, ScriptedRuns]) -> None:
    name = unique("done")
    taints = [
        {"key": ns.CRITICAL_TAINT[0], "effect": "NoSchedule"},
        {"key": "someone.else/taint", "effect": "NoSchedule"},
    ]
    make_node(kube, name, "m", ns.READY_FOR_UPDATE, candidate=True)
    kube.kubectl(
        "patch",
        "node",
        name,
        "--type=merge",
        "-p",
        '{"spec": {"taints": ' + json.dumps(taints) + "}}",
    )

    def kept() -> list[str]:
        return [t["key"] for t in node(kube, name)["spec"].get("taints", [])]

    # still a candidate: MCM has not finished this Node, the taint stays
    assert kept() == [ns.CRITICAL_TAINT[0], "someone.else/taint"]
    kube.kubectl("label", "node", name, f"{ns.CANDIDATE_LABEL}-")
    make_node(kube, name, "m", "UpdateSuccessful", candidate=False)
    assert wait_until(lambda: kept() == ["someone.else/taint"], WAIT, 0.2)


def test_watch_recovers_from_an_api_outage(kube: Lab, agent: tuple[AgentThread, ScriptedRuns]) -> None:
    thread, _ = agent
    pool, machine = unique("pool"), unique("m")
    make_pool(kube, pool, machine)
    kube.stop_apiserver()
    try:
        assert wait_until(lambda: not thread.connected, WAIT, 0.2), "/healthz would say the watch is down"
    finally:
        kube.start_apiserver()
    assert wait_until(lambda: thread.connected, 60, 0.2), "the watch reconnects"
    name = unique("after")
    make_node(kube, name, machine, ns.READY_FOR_UPDATE)
    assert wait_until(lambda: label(kube, name) == ns.SUCCESSFUL, WAIT, 0.2)


def test_delete_pods_flag_deletes_the_pods_left_on_an_updated_node(kube: Lab) -> None:
    runs = ScriptedRuns(done_after_two)
    options = AgentOptions(namespace=NAMESPACE, poll_seconds=0.2, resync_seconds=1.0, delete_pods=True)
    thread = AgentThread(kube.kubeconfig, options, runs)
    try:
        assert wait_until(lambda: thread.connected, WAIT, 0.1)
        pool, machine = unique("pool"), unique("m")
        make_pool(kube, pool, machine)
        name = unique("pods")
        make_node(kube, name, machine, None)
        objects.create_pod(kube, "left-behind", "leftover", name, wait_running=False)
        make_node(kube, name, machine, ns.READY_FOR_UPDATE)
        assert wait_until(lambda: label(kube, name) == ns.SUCCESSFUL, WAIT, 0.2)
        pod = objects.get(kube, "pod", "leftover", "left-behind")
        # deleted: gone, or terminating (no kubelet behind this Node confirms the deletion)
        assert pod is None or pod["metadata"].get("deletionTimestamp")
    finally:
        thread.stop()


BURST_NODES = 20


def test_an_agent_stopped_while_its_requests_connect_leaves_no_socket_open(kube: Lab, tmp_path: Path) -> None:
    """With the API server's answers to new connections stalled, Nodes appear that each carry an
    annotation of ours left behind (the answered annotation, MCM done with them): the watch, connected
    before the stall, reports them, and each Node's task patches its annotation away on a new
    connection, which stays connecting. The agent told to stop then lets those requests end (the
    client's connect timeout closes their sockets) before it closes its clients. A request cancelled
    while connecting would leave its socket open until the garbage collector finds it."""
    group = unique("burst")
    nodes = [
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": f"{group}-{i}",
                "labels": {"burst": group},
                "annotations": {ns.ANSWERED_ANNOTATION: "left-behind"},
            },
        }
        for i in range(BURST_NODES)
    ]
    forwarder = StallingForwarder(urlsplit(kube.server).port or 443)
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        kube.kubeconfig.read_text().replace(kube.server, f"https://127.0.0.1:{forwarder.port}")
    )
    options = AgentOptions(namespace=NAMESPACE, poll_seconds=0.2, resync_seconds=0.05)
    thread = AgentThread(kubeconfig, options, ScriptedRuns(done_after_two))
    try:
        assert wait_until(lambda: thread.connected, WAIT, 0.1), "the agent lists and watches Nodes"
        forwarder.stall()
        objects.apply(kube, *nodes)  # straight to the API server; the agent hears of them on its watch
        assert wait_until(lambda: len(forwarder.held) >= BURST_NODES // 2, WAIT, 0.05), "a burst connects"
        thread.stop()
        assert not thread.running, "the agent stopped within its grace period"
        assert wait_until(lambda: forwarder.open_held() == 0, 5, 0.1), (
            f"{forwarder.open_held()} of {len(forwarder.held)} connections left open"
        )
    finally:
        thread.stop()
        forwarder.close()
        kube.kubectl("delete", "node", "-l", f"burst={group}", "--wait=false")


def test_the_control_cluster_reads_a_machine_classs_credentials_secret(kube: Lab) -> None:
    """An AWS MachineClass's credentials (mcm/aws_tags.py) come through the same control-cluster port as
    MCM's objects: a typed Secret of the API server, read as a plain dict, None when it does not exist."""
    name = unique("cloud")
    kube.kubectl(
        "create", "secret", "generic", name, "-n", NAMESPACE, "--from-literal=providerAccessKeyId=AKID"
    )

    async def read() -> tuple[Any, Any]:
        control = connect_control(kube.kubeconfig)
        try:
            return await control.get("Secret", NAMESPACE, name), await control.get(
                "Secret", NAMESPACE, "none"
            )
        finally:
            await control.close()

    secret, missing = asyncio.run(read())
    assert secret["data"] == {"providerAccessKeyId": base64.b64encode(b"AKID").decode()}
    assert missing is None
