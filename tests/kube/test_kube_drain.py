"""inplace_extension.kube.drain against the kubelab's real API server (kwok Nodes and Pods, the real
disruption controller judging PodDisruptionBudgets): cordon, drain, uncordon, and the rules around them.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from typing import Any

import pytest
from hostlab.proc import wait_until
from kubelab import objects, reads
from kubelab.lab import Lab

from inplace_extension.kube import drain
from inplace_extension.kube.jobs import PHASE_ANNOTATION
from inplace_extension.kube.nodes import node_health
from inplace_extension.kubejobs.manifest import ATTEMPT_POD_LABELS

from .conftest import annotations_of, unschedulable

pytestmark = pytest.mark.kube

OWNER = "default/md-0-abc"


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def test_drain_evicts_workloads_skips_daemonset_and_mirror_pods_and_uncordons_once(
    kubelab: Lab, client: Any
) -> None:
    node, ns = _name("node"), _name("drain")
    objects.create_kwok_node(kubelab, node)
    for pod in ("web-1", "web-2", "web-3"):
        objects.create_pod(kubelab, ns, pod, node, labels={"app": "web"})
    # a DaemonSet's Pod (the lab runs no DaemonSet controller: the Pod is created here, owned by the real
    # DaemonSet so the garbage collector keeps it) and a mirror Pod (as a kubelet posts a static Pod)
    objects.apply(
        kubelab,
        {
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "metadata": {"name": "agent", "namespace": ns},
            "spec": {
                "selector": {"matchLabels": {"app": "agent"}},
                "template": {
                    "metadata": {"labels": {"app": "agent"}},
                    "spec": {"containers": [{"name": "a", "image": "registry.invalid/kwok-stand-in:1"}]},
                },
            },
        },
    )
    daemonset = objects.get(kubelab, "daemonset", "agent", ns)
    assert daemonset is not None
    owner = {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "agent", "controller": True}
    objects.create_pod(kubelab, ns, "agent-x", node, owner={**owner, "uid": daemonset["metadata"]["uid"]})
    objects.apply(
        kubelab,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": "static-x",
                "namespace": ns,
                "annotations": {"kubernetes.io/config.mirror": "x", "kubernetes.io/config.source": "file"},
            },
            "spec": {
                "nodeName": node,
                "containers": [{"name": "s", "image": "registry.invalid/kwok-stand-in:1"}],
            },
        },
    )

    assert drain.cordon(client, node, OWNER) is True
    assert unschedulable(kubelab, node) and annotations_of(kubelab, "node", node)[drain.CORDONED_BY] == OWNER
    reports: list[int] = []
    drain.drain(client, node, drain.DrainPolicy(timeout_seconds=60, poll_seconds=0.2), reports.append)
    assert reports[0] == 3 and reports[-1] == 0 and reports == sorted(reports, reverse=True)
    left = {p["metadata"]["name"] for p in _pods(kubelab, ns)}
    assert left == {"agent-x", "static-x"}

    assert drain.uncordon(client, node, OWNER) is True
    assert drain.uncordon(client, node, OWNER) is False  # already done: never twice
    assert not unschedulable(kubelab, node) and drain.CORDONED_BY not in annotations_of(kubelab, "node", node)
    assert node_health(client, node).ready


def _pods(lab: Lab, namespace: str) -> list[dict[str, Any]]:
    return reads.list_objects(lab, "pods", namespace)


def test_a_node_cordoned_by_someone_else_is_drained_but_never_uncordoned(kubelab: Lab, client: Any) -> None:
    node = _name("node")
    objects.create_kwok_node(kubelab, node)
    kubelab.kubectl("cordon", node)
    assert drain.cordon(client, node, OWNER) is False
    assert drain.uncordon(client, node, OWNER) is False
    assert unschedulable(kubelab, node)


def test_a_pdb_that_can_never_allow_the_eviction_waits_for_the_timeout_when_told_to(
    kubelab: Lab, client: Any
) -> None:
    node, ns = _name("node"), _name("pdb")
    objects.create_kwok_node(kubelab, node)
    objects.create_pod(kubelab, ns, "guarded", node, labels={"app": "guarded"})
    objects.create_pod(kubelab, ns, "free", node, labels={"app": "free"})
    objects.create_pdb(kubelab, ns, "guarded")
    assert drain.cordon(client, node, OWNER)
    reports: list[int] = []
    waiting = drain.DrainPolicy(timeout_seconds=3, poll_seconds=0.2, wait_for_blocking_budgets=True)
    with pytest.raises(drain.DrainError) as failure:
        drain.drain(client, node, waiting, reports.append)
    assert str(failure.value) == (
        f"drain: timed out after 3s with 1 pod left on Node {node}; "
        f"evictions refused by a PodDisruptionBudget: {ns}/guarded"
    )
    assert reports[0] == 2 and reports[-1] == 1
    assert drain.uncordon(client, node, OWNER) is True
    assert not unschedulable(kubelab, node)


@pytest.mark.parametrize(
    ("budget", "reason"),
    [
        ({"maxUnavailable": 0}, "maxUnavailable is 0"),
        ({"maxUnavailable": "0%"}, "maxUnavailable is 0"),
        # both of its Pods healthy, both required: nothing else can become ready first
        ({"minAvailable": 2}, "it allows no disruption with all of its Pods healthy"),
    ],
)
def test_a_pdb_that_can_never_allow_the_eviction_fails_the_drain_at_once_naming_it(
    kubelab: Lab, client: Any, budget: dict[str, Any], reason: str
) -> None:
    node, other, ns = _name("node"), _name("node"), _name("pdb")
    objects.create_kwok_node(kubelab, node)
    objects.create_kwok_node(kubelab, other)
    objects.create_pod(kubelab, ns, "guarded-1", node, labels={"app": "guarded"})
    objects.create_pod(kubelab, ns, "guarded-2", other, labels={"app": "guarded"})
    objects.create_pdb(kubelab, ns, "guarded", **budget)
    if "minAvailable" in budget:  # judged from the status: wait until the controller counted both Pods
        healthy = lambda pdb: pdb.get("status", {}).get("currentHealthy") == 2  # noqa: E731
        objects.wait_for(kubelab, "pdb", "guarded", ns, healthy, "both Pods healthy")
    assert drain.cordon(client, node, OWNER)
    policy = drain.DrainPolicy(timeout_seconds=120, poll_seconds=0.2)
    started = time.monotonic()
    with pytest.raises(drain.DrainError) as failure:
        drain.drain(client, node, policy, lambda _: None)
    assert time.monotonic() - started < 10, "failed fast, not after the 120 s drain timeout"
    assert str(failure.value) == (
        f"drain: PodDisruptionBudget {ns}/guarded can never allow evicting Pod {ns}/guarded-1 from Node "
        f"{node} ({reason}); --drain-wait-for-blocking-pdbs waits instead"
    )
    assert drain.uncordon(client, node, OWNER) is True


def test_a_pdb_that_allows_the_eviction_does_not_stop_the_drain(kubelab: Lab, client: Any) -> None:
    node, other, ns = _name("node"), _name("node"), _name("pdb")
    objects.create_kwok_node(kubelab, node)
    objects.create_kwok_node(kubelab, other)
    objects.create_pod(kubelab, ns, "guarded-1", node, labels={"app": "guarded"})
    objects.create_pod(kubelab, ns, "guarded-2", other, labels={"app": "guarded"})
    objects.create_pdb(kubelab, ns, "guarded", minAvailable=1)
    allowed = lambda pdb: pdb.get("status", {}).get("disruptionsAllowed") == 1  # noqa: E731
    objects.wait_for(kubelab, "pdb", "guarded", ns, allowed, "one disruption allowed")
    assert drain.cordon(client, node, OWNER)
    drain.drain(client, node, drain.DrainPolicy(timeout_seconds=60, poll_seconds=0.2), lambda _: None)
    assert objects.get(kubelab, "pod", "guarded-1", ns) is None
    assert drain.uncordon(client, node, OWNER) is True


def test_pods_with_emptydir_data_are_refused_unless_allowed(kubelab: Lab, client: Any) -> None:
    node, ns = _name("node"), _name("scratch")
    objects.create_kwok_node(kubelab, node)
    objects.create_pod(kubelab, ns, "cache", node, volumes=[{"name": "tmp", "emptyDir": {}}])
    with pytest.raises(drain.DrainError, match=rf"emptyDir data on Node {node}: {ns}/cache"):
        drain.drain(client, node, drain.DrainPolicy(timeout_seconds=5), lambda n: None)
    policy = drain.DrainPolicy(
        timeout_seconds=30, delete_empty_dir_data=True, poll_seconds=0.2, grace_seconds=0
    )
    drain.drain(client, node, policy, lambda n: None)
    assert _pods(kubelab, ns) == []


def test_another_updates_attempt_pod_is_waited_for_and_never_evicted(kubelab: Lab, client: Any) -> None:
    """The service's own attempt Pods (the kubernetes executor's Jobs of other Machines) on the Node:
    one still playing is waited for (its emptyDir scratch is no user's data), never evicted, and the
    drain ends once it is gone; one waiting at its own drain point is left where it is."""
    node, ns = _name("node"), _name("attempts")
    objects.create_kwok_node(kubelab, node)
    scratch = [{"name": "tmp", "emptyDir": {}}]
    objects.create_pod(kubelab, ns, "web-1", node, labels={"app": "web"})
    objects.create_pod(kubelab, ns, "playing", node, labels=dict(ATTEMPT_POD_LABELS), volumes=scratch)
    objects.create_pod(kubelab, ns, "waiting", node, labels=dict(ATTEMPT_POD_LABELS), volumes=scratch)
    kubelab.kubectl("annotate", "pod", "-n", ns, "waiting", f"{PHASE_ANNOTATION}=draining: 1 pod left")
    policy = drain.DrainPolicy(
        timeout_seconds=60, poll_seconds=0.2, grace_seconds=0, attempt_labels=ATTEMPT_POD_LABELS
    )
    reports: list[int] = []
    ended = threading.Event()

    def its_job_ends() -> None:  # the playing attempt's Job ends (its Pod goes with its Job)
        # the drain looked three times with the playing attempt left, and waited on
        assert wait_until(lambda: reports[-3:] == [1, 1, 1], 30)
        assert {p["metadata"]["name"] for p in _pods(kubelab, ns)} == {"playing", "waiting"}
        kubelab.kubectl("delete", "pod", "-n", ns, "playing", "--wait=true")
        ended.set()

    ender = threading.Thread(target=its_job_ends, daemon=True)
    ender.start()
    drain.drain(client, node, policy, reports.append)
    ender.join(30)
    assert ended.is_set() and reports[0] == 2 and reports[-1] == 0
    assert {p["metadata"]["name"] for p in _pods(kubelab, ns)} == {"waiting"}, "never evicted, left in place"


KILLED_CORDON = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from inplace_extension.kube import drain
    from inplace_extension.kube.client import connect
    client = connect(Path(sys.argv[1]))
    assert drain.cordon(client, sys.argv[2], sys.argv[3])
    print("cordoned", flush=True)
    time.sleep(600)  # killed here, between cordon and uncordon
    """
)


def test_a_process_killed_between_cordon_and_uncordon_is_cleaned_up_exactly_once(
    kubelab: Lab, client: Any
) -> None:
    node = _name("node")
    objects.create_kwok_node(kubelab, node)
    proc = subprocess.Popen(
        [sys.executable, "-c", KILLED_CORDON, str(kubelab.kubeconfig), node, OWNER],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "cordoned"
    finally:
        os.kill(proc.pid, signal.SIGKILL)  # by PID: the process this test started
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
    assert unschedulable(kubelab, node)
    # what a restarted service finds on the Node, and two cleanups racing (a poll and a run): one wins
    assert drain.cordoned_by(client, node) == OWNER
    results: list[bool] = []
    threads = [
        threading.Thread(target=lambda: results.append(drain.uncordon(client, node, OWNER))) for _ in range(2)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(results) == [False, True]
    assert wait_until(lambda: not unschedulable(kubelab, node), 10, 0.2)
    assert drain.cordoned_by(client, node) is None
