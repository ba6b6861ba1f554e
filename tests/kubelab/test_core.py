"""The kubelab core against itself: a real apiserver at the pinned version, kwok Nodes and Pods,
evictions judged by the real disruption controller, an API outage a client survives.

Real: etcd, kube-apiserver, kube-controller-manager. Simulated: the kubelets (kwok).
"""

from __future__ import annotations

import uuid

import httpx
import pytest
from kubelab import build, objects
from kubelab.lab import Lab

pytestmark = pytest.mark.kube


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def test_the_apiserver_is_the_pinned_version(kubelab: Lab) -> None:
    with kubelab.http() as client:
        version = client.get("/version").json()
    assert version["gitVersion"] == build.KUBERNETES_VERSION
    assert (version["major"], version["minor"]) == ("1", "36")


def test_a_kwok_node_goes_ready_and_a_bound_pod_runs(kubelab: Lab) -> None:
    node = _name("node")
    objects.create_kwok_node(kubelab, node)
    pod = objects.create_pod(kubelab, "kwok-pods", _name("pod"), node)
    assert pod["status"]["phase"] == "Running"
    assert pod["spec"]["nodeName"] == node
    assert pod["status"].get("podIP"), "kwok gives a running Pod an IP"


def test_evictions_are_judged_by_the_disruption_controller(kubelab: Lab) -> None:
    node, namespace = _name("node"), _name("pdb")
    objects.create_kwok_node(kubelab, node)
    guarded = objects.create_pod(kubelab, namespace, "guarded", node, labels={"app": "guarded"})
    objects.create_pod(kubelab, namespace, "free", node, labels={"app": "free"})
    objects.create_pdb(kubelab, namespace, "guarded", name="guard")
    assert objects.evict(kubelab, namespace, "guarded") == 429
    assert objects.evict(kubelab, namespace, "free") == 201
    objects.wait_gone(kubelab, "pod", "free", namespace)
    still = objects.get(kubelab, "pod", "guarded", namespace)
    assert still is not None and still["metadata"]["uid"] == guarded["metadata"]["uid"]


def test_an_api_outage_is_reported_and_a_client_reconnects(kubelab: Lab) -> None:
    with kubelab.http() as client:
        assert client.get("/readyz").status_code == 200
        kubelab.stop_apiserver()
        try:
            assert not kubelab.apiserver_running()
            status = {c["name"]: c["running"] for c in kubelab.status()["components"]}
            assert status["kube-apiserver"] is False and status["etcd"] is True
            with pytest.raises(httpx.ConnectError):
                client.get("/readyz")
        finally:
            kubelab.start_apiserver()
        assert kubelab.apiserver_running()
        # the same client (same server URL, same credentials) works again, and the data survived
        assert client.get("/api/v1/namespaces/default").status_code == 200
