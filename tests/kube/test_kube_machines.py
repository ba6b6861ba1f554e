"""inplace_extension.kube.machines, .events and .workload against the kubelab's real API server with
CAPI's Machine CRD (from the pinned module): the live Machine's facts, its annotations, Events that
``kubectl describe machine`` shows, and a workload client from a ``<cluster>-kubeconfig`` Secret.
"""

from __future__ import annotations

import base64
import json
import uuid
from typing import Any

import pytest
from hostlab.proc import wait_until
from kubelab import objects
from kubelab.lab import Lab

from inplace_extension.kube import events, machines, update_condition, workload
from inplace_extension.kube.errors import KubeError
from inplace_extension.kube.nodes import node_health

from .conftest import create_machine

pytestmark = pytest.mark.kube
MACHINE = "machine.cluster.x-k8s.io"


def test_the_live_machine_gives_addresses_node_and_cluster(with_machines: Lab, client: Any) -> None:
    ns, name = f"m-{uuid.uuid4().hex[:6]}", "md-0-abc"
    addresses = [
        {"type": "ExternalIP", "address": "203.0.113.7"},
        {"type": "InternalIP", "address": "10.0.0.7"},
        {"type": "Hostname", "address": "md-0-abc"},
    ]
    create_machine(with_machines, ns, name, addresses, "node-abc")
    facts = machines.get_machine(client, ns, name)
    assert facts is not None
    assert facts.addresses == (
        ("ExternalIP", "203.0.113.7"),
        ("InternalIP", "10.0.0.7"),
        ("Hostname", "md-0-abc"),
    )
    assert (facts.node_name, facts.cluster) == ("node-abc", "c1")
    assert machines.get_machine(client, ns, "no-such-machine") is None


def test_skip_remediation_is_set_and_removed_without_touching_other_annotations(
    with_machines: Lab, client: Any
) -> None:
    ns, name = f"m-{uuid.uuid4().hex[:6]}", "md-0-def"
    create_machine(with_machines, ns, name, [], None)
    with_machines.kubectl("annotate", "machine.cluster.x-k8s.io", name, "-n", ns, "keep=me")
    machines.set_annotation(client, ns, name, machines.SKIP_REMEDIATION, "")
    facts = machines.get_machine(client, ns, name)
    assert facts is not None and facts.annotations == {"keep": "me", machines.SKIP_REMEDIATION: ""}
    machines.set_annotation(client, ns, name, machines.SKIP_REMEDIATION, None)
    facts = machines.get_machine(client, ns, name)
    assert facts is not None and facts.annotations == {"keep": "me"}
    machines.set_annotation(client, ns, "gone-machine", machines.SKIP_REMEDIATION, None)  # no error


def test_events_are_one_per_state_change_and_kubectl_describe_shows_them(
    with_machines: Lab, client: Any
) -> None:
    ns, name = f"m-{uuid.uuid4().hex[:6]}", "md-0-ghi"
    machine = create_machine(with_machines, ns, name, [], None)
    uid = machine["metadata"]["uid"]
    started = events.machine_event(ns, name, uid, "run-1", "Normal", "Started", "started on host 10.0.0.7")
    failed = events.machine_event(ns, name, uid, "run-1", "Warning", "Failed", "drain: timed out after 3s")
    recorder = events.EventRecorder(client)
    try:
        assert recorder.post(started) is True
        assert recorder.post(started) is False  # the same state again: the same Event, not a new one
        for _ in range(3):
            recorder.record(failed)  # from a poll loop: queued, posted by the background thread
    finally:
        recorder.close()
    listed = json.loads(with_machines.kubectl("get", "events", "-n", ns, "-o", "json").stdout)["items"]
    assert sorted((e["reason"], e["count"]) for e in listed) == [("Failed", 1), ("Started", 1)]
    assert {e["involvedObject"]["uid"] for e in listed} == {uid}
    described = with_machines.kubectl("describe", "machine.cluster.x-k8s.io", name, "-n", ns).stdout
    assert "started on host 10.0.0.7" in described and "drain: timed out after 3s" in described


def test_a_workload_client_comes_from_the_cluster_kubeconfig_secret(with_machines: Lab, client: Any) -> None:
    ns = f"w-{uuid.uuid4().hex[:6]}"
    objects.ensure_namespace(with_machines, ns)
    node = f"node-{uuid.uuid4().hex[:6]}"
    objects.create_kwok_node(with_machines, node)
    value = base64.b64encode(with_machines.kubeconfig.read_bytes()).decode()
    objects.apply(
        with_machines,
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "c1-kubeconfig", "namespace": ns},
            "data": {"value": value},
        },
    )
    clients = workload.WorkloadClients(client, workload.FROM_SECRET)
    try:
        assert wait_until(lambda: node_health(clients.get(ns, "c1"), node).ready, 30, 0.2)
        with pytest.raises(KubeError, match=rf"get Secret {ns}/c2-kubeconfig: the API server answered 404"):
            clients.get(ns, "c2")
    finally:
        clients.close()
    assert workload.WorkloadClients(client, workload.FROM_MANAGEMENT).get(ns, "any") is client
    with pytest.raises(KubeError, match="use secret, management or an absolute path"):
        workload.WorkloadClients(client, "relative/path")


def test_skip_remediation_is_marked_only_on_the_machine_as_read(with_machines: Lab, client: Any) -> None:
    ns, name = f"m-{uuid.uuid4().hex[:6]}", "md-0-rv"
    create_machine(with_machines, ns, name, [], None)
    stale = machines.get_machine(client, ns, name)
    assert stale is not None and stale.resource_version
    # someone else marks the Machine after our read: the resourceVersion precondition makes us read again

    def annotate(change: str) -> None:
        with_machines.kubectl("annotate", MACHINE, name, "-n", ns, change)

    annotate(f"{machines.SKIP_REMEDIATION}=")
    assert not machines.mark_skip_remediation(client, stale, "run-1")
    facts = machines.get_machine(client, ns, name)
    assert facts is not None and facts.annotations == {machines.SKIP_REMEDIATION: ""}
    assert not machines.unmark_skip_remediation(client, facts)  # theirs: never removed by us
    annotate(f"{machines.SKIP_REMEDIATION}-")
    assert machines.mark_skip_remediation(client, stale, "run-1")  # stale again: read again, then marked
    marked = machines.get_machine(client, ns, name)
    assert marked is not None
    assert marked.annotations == {machines.SKIP_REMEDIATION: "", machines.SKIP_REMEDIATION_BY: "run-1"}
    # two clean-ups from the same read (a run ending, a restarted service): exactly one removes it
    assert [machines.unmark_skip_remediation(client, marked) for _ in range(2)] == [True, False]


def node_conditions(lab: Lab, node: str) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in (objects.get(lab, "node", node) or {})["status"]["conditions"]}


def test_the_in_place_update_condition_is_set_and_cleared_once_beside_the_kubelets(
    kubelab: Lab, client: Any
) -> None:
    node = f"cond-{uuid.uuid4().hex[:6]}"
    objects.apply(kubelab, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}})
    ready = {"status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}]}}
    kubelab.kubectl("patch", "node", node, "--subresource=status", "--type=merge", "-p", json.dumps(ready))
    try:
        assert update_condition.show_updating(client, node, "kubelet_args runs")
        assert not update_condition.show_updating(client, node, "kubelet_args runs")  # already says so
        conditions = node_conditions(kubelab, node)
        assert conditions["Ready"]["status"] == "True"  # the kubelet's condition stays as it was
        shown = conditions[update_condition.CONDITION]
        assert (shown["status"], shown["reason"], shown["message"]) == (
            "True",
            update_condition.RUNNING,
            "kubelet_args runs",
        )
        assert [update_condition.clear_updating(client, node) for _ in range(2)] == [True, False]
        conditions = node_conditions(kubelab, node)
        assert conditions[update_condition.CONDITION]["status"] == "False"
        assert conditions["Ready"]["status"] == "True"
        assert not update_condition.show_updating(client, "no-such-node", "x")
    finally:
        kubelab.kubectl("delete", "node", node, "--ignore-not-found", check=False)
