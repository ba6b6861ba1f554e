"""The Kubernetes-aware mode around a run: RunService with KubeClusterSide against the kubelab's real API
server (CAPI's Machine CRD, kwok Nodes and Pods, the real disruption controller). Only the play is a
fake (tests/runs/fakes.py): these tests are about what happens in the cluster around it.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from hostlab.proc import wait_until
from kubelab import objects
from kubelab.lab import Lab
from run_deps import run_service
from runs.cluster_settings import cluster_side_settings
from runs.fakes import FP, FakeRunner

from inplace_extension.inplace.custom import NO_CUSTOM
from inplace_extension.kube.cluster import connect_management
from inplace_extension.kube.drain import CORDONED_BY
from inplace_extension.kube.machines import SKIP_REMEDIATION, SKIP_REMEDIATION_BY
from inplace_extension.kubeaware.cluster_side import KubeClusterSide
from inplace_extension.runs.model import Progress, ProgressState, RunRequest
from inplace_extension.runs.service import RunService

from .conftest import annotations_of, create_machine, unschedulable

pytestmark = [pytest.mark.kube, pytest.mark.anyio]


@pytest.fixture
def service(
    with_machines: Lab, fake: FakeRunner, tmp_path: Path
) -> Iterator[tuple[RunService, KubeClusterSide]]:
    settings = cluster_side_settings(
        tmp_path,
        kubeconfig=with_machines.kubeconfig,
        workload_kubeconfig="management",  # the kwok Nodes live in the lab's own API server
        drain_timeout_seconds=4,
        health_gate_timeout_seconds=3,
    )
    side = KubeClusterSide(connect_management(with_machines.kubeconfig, "management"), settings, NO_CUSTOM)
    svc = run_service(settings, cluster=side)
    yield svc, side
    assert fake.gate is not None
    fake.gate.set()
    svc.close()
    side.close()


def machine_with_node(lab: Lab, ready: bool = True) -> tuple[str, str, str]:
    ns, name, node = f"ka-{uuid.uuid4().hex[:6]}", f"md-0-{uuid.uuid4().hex[:5]}", f"n-{uuid.uuid4().hex[:6]}"
    if ready:
        objects.create_kwok_node(lab, node)
    else:  # not kwok's: nothing ever reports it Ready
        objects.apply(lab, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}})
    create_machine(lab, ns, name, [{"type": "InternalIP", "address": "10.79.9.31"}], node)
    return ns, name, node


def request(ns: str, name: str, capabilities: tuple[str, ...]) -> RunRequest:
    inputs: dict[str, dict[str, Any]] = {
        "users": {"users_users": []},
        "kubernetes_version": {
            "kubernetes_version_target": "v1.30.2",
            "kubernetes_version_control_plane": False,
        },
        "kubelet_args": {"kubelet_args_extra_args": [{"name": "v", "value": "2"}]},
    }
    return RunRequest(ns, name, FP, capabilities, {c: inputs[c] for c in capabilities})


async def answer(svc: RunService, req: RunRequest, within: float = 30.0) -> Progress:
    """Poll like CAPI until the answer is final (done or failed)."""
    deadline = time.monotonic() + within
    while True:
        progress = await svc.poll(req)
        if progress.state is not ProgressState.IN_PROGRESS:
            return progress
        assert time.monotonic() < deadline, f"still {progress.message}"
        await anyio.sleep(0.1)


def events(lab: Lab, ns: str) -> list[tuple[str, str]]:
    listed = json.loads(lab.kubectl("get", "events", "-n", ns, "-o", "json").stdout)["items"]
    ordered = sorted(listed, key=lambda e: (e["firstTimestamp"], e["metadata"]["creationTimestamp"]))
    return [(e["reason"], e["message"]) for e in ordered]


async def test_a_kubelet_restart_drains_marks_the_machine_and_cleans_up(
    with_machines: Lab,
    service: tuple[RunService, KubeClusterSide],
    fake: FakeRunner,
) -> None:
    svc, _ = service
    ns, name, node = machine_with_node(with_machines)
    for pod in ("web-1", "web-2"):
        objects.create_pod(with_machines, ns, pod, node, labels={"app": "web"})
    req = request(ns, name, ("users", "kubelet_args"))
    await svc.poll(req)
    assert wait_until(lambda: len(fake.started) == 1, 30, 0.1)  # the play is running (held by the gate)
    assert fake.started[0].target.address == "10.79.9.31"  # from the Machine's status.addresses
    assert fake.started[0].drain_before == "kubelet_args"  # users first, on a schedulable Node
    # drained at the drain point, then the play enters kubelet_args and marks the Machine
    marked = lambda: SKIP_REMEDIATION in annotations_of(with_machines, "machine.cluster.x-k8s.io", name, ns)  # noqa: E731
    assert wait_until(marked, 30, 0.1)
    machine = annotations_of(with_machines, "machine.cluster.x-k8s.io", name, ns)
    assert machine[SKIP_REMEDIATION] == "" and machine[SKIP_REMEDIATION_BY] == req.ident
    assert unschedulable(with_machines, node)
    assert annotations_of(with_machines, "node", node)[CORDONED_BY] == req.machine
    assert json.loads(with_machines.kubectl("get", "pods", "-n", ns, "-o", "json").stdout)["items"] == []
    assert fake.gate is not None
    fake.gate.set()
    done = await answer(svc, req)
    assert (done.state, done.message) == (ProgressState.DONE, "update applied")
    assert not unschedulable(with_machines, node) and CORDONED_BY not in annotations_of(
        with_machines, "node", node
    )
    assert SKIP_REMEDIATION not in annotations_of(with_machines, "machine.cluster.x-k8s.io", name, ns)
    expected = [
        ("Queued", "queued"),
        ("Started", "started on host 10.79.9.31 (machine status)"),
        ("Drained", f"drained Node {node}"),
        ("Running", "running: users"),
        ("Running", "running: kubelet_args"),
        ("Uncordoned", f"uncordoned Node {node}"),
        ("Done", "update applied"),
    ]
    assert wait_until(lambda: sorted(events(with_machines, ns)) == sorted(expected), 10, 0.2), events(
        with_machines, ns
    )
    machine_uid = (objects.get(with_machines, "machine.cluster.x-k8s.io", name, ns) or {})["metadata"]["uid"]
    listed = json.loads(with_machines.kubectl("get", "events", "-n", ns, "-o", "json").stdout)["items"]
    assert {e["involvedObject"].get("uid") for e in listed} == {machine_uid}  # kubectl describe finds them


async def test_a_users_only_change_neither_drains_nor_marks(
    with_machines: Lab,
    service: tuple[RunService, KubeClusterSide],
    fake: FakeRunner,
) -> None:
    svc, _ = service
    ns, name, node = machine_with_node(with_machines)
    req = request(ns, name, ("users",))
    await svc.poll(req)
    assert wait_until(lambda: len(fake.started) == 1, 30, 0.1)
    assert not unschedulable(with_machines, node)
    assert SKIP_REMEDIATION not in annotations_of(with_machines, "machine.cluster.x-k8s.io", name, ns)
    assert fake.gate is not None
    fake.gate.set()
    assert (await answer(svc, req)).state is ProgressState.DONE
    assert wait_until(lambda: ("Done", "update applied") in events(with_machines, ns), 10, 0.2)
    assert not any(reason in ("Drained", "Uncordoned") for reason, _ in events(with_machines, ns))


async def test_a_pdb_blocks_the_drain_the_update_fails_and_the_node_is_uncordoned(
    with_machines: Lab,
    service: tuple[RunService, KubeClusterSide],
    fake: FakeRunner,
) -> None:
    svc, _ = service
    ns, name, node = machine_with_node(with_machines)
    objects.create_pod(with_machines, ns, "guarded", node, labels={"app": "guarded"})
    objects.create_pdb(with_machines, ns, "guarded")
    req = request(ns, name, ("users", "kubelet_args"))
    failed = await answer(svc, req)
    # maxUnavailable 0 can never allow the eviction: at once, not after the 4 s drain timeout
    message = (
        f"drain: PodDisruptionBudget {ns}/guarded can never allow evicting Pod {ns}/guarded from Node "
        f"{node} (maxUnavailable is 0); --drain-wait-for-blocking-pdbs waits instead; "
        "applied before the drain: users"
    )
    assert (failed.state, failed.message) == (ProgressState.FAILED, message)
    assert (await svc.poll(req)).message == message  # remembered: the same Failure on every call
    assert len(fake.started) == 1  # one play: users applied, stopped at the drain point
    assert not unschedulable(with_machines, node)
    assert wait_until(lambda: ("Failed", message) in events(with_machines, ns), 10, 0.2)


async def test_a_node_that_stays_not_ready_fails_the_health_gate(
    with_machines: Lab,
    service: tuple[RunService, KubeClusterSide],
    fake: FakeRunner,
) -> None:
    svc, _ = service
    ns, name, node = machine_with_node(with_machines, ready=False)
    assert fake.gate is not None
    fake.gate.set()
    req = request(ns, name, ("users",))
    waiting = await svc.poll(req)
    deadline = time.monotonic() + 30
    while not waiting.message.startswith("health gate:"):
        assert time.monotonic() < deadline, waiting.message
        await anyio.sleep(0.1)
        waiting = await svc.poll(req)
    assert (waiting.state, waiting.message) == (
        ProgressState.IN_PROGRESS,
        f"health gate: waiting for Node {node} to be Ready",
    )
    failed = await answer(svc, req)
    message = "health gate: the Node was not Ready within 3s after the update"
    assert (failed.state, failed.message) == (ProgressState.FAILED, message)
    assert wait_until(lambda: ("Failed", message) in events(with_machines, ns), 10, 0.2)


@pytest.mark.parametrize(("reported", "drains"), [("v1.30.2", False), ("v1.29.9", True)])
async def test_a_version_step_drains_only_when_the_node_runs_another_version(
    with_machines: Lab,
    service: tuple[RunService, KubeClusterSide],
    fake: FakeRunner,
    reported: str,
    drains: bool,
) -> None:
    """UpdateMachine plans kubernetes_version whenever the Machine has a version; the Node says whether
    the kubelet will restart (the role does nothing at the target)."""
    svc, _ = service
    ns, name, node = machine_with_node(with_machines)
    status = {"status": {"nodeInfo": {"kubeletVersion": reported}}}
    with_machines.kubectl(
        "patch", "node", node, "--subresource=status", "--type=merge", "-p", json.dumps(status)
    )
    req = request(ns, name, ("users", "kubernetes_version"))
    await svc.poll(req)
    assert wait_until(lambda: len(fake.started) == 1, 30, 0.1)  # the play runs, held by the gate
    assert fake.started[0].drain_before == ("kubernetes_version" if drains else None)
    assert (
        wait_until(lambda: unschedulable(with_machines, node), 30, 0.1)
        if drains
        else not unschedulable(with_machines, node)
    )
    if drains:  # from the moment the play enters kubernetes_version

        def marked() -> bool:
            return SKIP_REMEDIATION in annotations_of(with_machines, "machine.cluster.x-k8s.io", name, ns)

        assert wait_until(marked, 10, 0.1)
    assert fake.gate is not None
    fake.gate.set()
    assert wait_until(lambda: any(r == "Running" for r, _ in events(with_machines, ns)), 10, 0.2)
    assert any(r == "Drained" for r, _ in events(with_machines, ns)) is drains
    machine = annotations_of(with_machines, "machine.cluster.x-k8s.io", name, ns)
    assert SKIP_REMEDIATION not in machine or drains  # never set for a step that does not disrupt
