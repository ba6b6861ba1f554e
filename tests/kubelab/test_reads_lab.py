"""kubelab.reads against the real apiserver: each read over the lab's HTTP client answers what
``kubectl get -o json`` answers for the same object, a kind installed after the first read included.

Real: etcd, kube-apiserver, kube-controller-manager; the Node is a kwok one (kwok stands in for its kubelet).
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import pytest
from kubelab import objects, reads
from kubelab.lab import Lab

pytestmark = pytest.mark.kube


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def _by_reader(lab: Lab, monkeypatch: pytest.MonkeyPatch, *args: Any, list_kind: bool = False) -> Any:
    """The reader's answer; kubectl may not run meanwhile (no fallback hides a wrong resolution)."""
    with monkeypatch.context() as m:
        m.setattr(lab, "kubectl", lambda *a, **k: pytest.fail(f"kubectl ran for a read: {a}"))
        return reads.list_objects(lab, *args) if list_kind else reads.get(lab, *args)


def _same_as_kubectl(lab: Lab, monkeypatch: pytest.MonkeyPatch, kind: str, name: str, ns: str | None) -> Any:
    """The reader's object equals kubectl's read of it (kwok and the controllers write the objects now
    and then: retried until two reads meet the same resourceVersion)."""
    deadline = time.monotonic() + 30
    while True:
        ours = _by_reader(lab, monkeypatch, kind, name, ns)
        theirs = json.loads(lab.kubectl("get", kind, name, *(["-n", ns] if ns else []), "-o", "json").stdout)
        if ours == theirs or time.monotonic() > deadline:
            assert ours == theirs
            return ours
        time.sleep(0.5)


def test_the_reader_answers_as_kubectl_get_for_a_node_a_pod_a_new_kind_and_a_missing_object(
    kubelab: Lab, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = _name("reads-node")
    objects.create_kwok_node(kubelab, node, wait_ready=False)
    assert _same_as_kubectl(kubelab, monkeypatch, "node", node, None)["kind"] == "Node"

    namespace = _name("reads")
    objects.ensure_namespace(kubelab, namespace)
    config = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c1", "namespace": namespace}}
    objects.apply(kubelab, {**config, "data": {"k": "v"}})
    assert _same_as_kubectl(kubelab, monkeypatch, "configmap", "c1", namespace)["data"] == {"k": "v"}

    # a kind the API did not serve at the reader's first read: found by the refresh on the miss
    group = f"{_name('reads')}.example.com"
    crd = objects.define_kind(kubelab, group, "Gadget", "gadgets")
    gadget = {
        "apiVersion": f"{group}/v1",
        "kind": "Gadget",
        "metadata": {"name": "g1", "namespace": namespace},
    }
    objects.apply(kubelab, {**gadget, "spec": {"size": 3}})
    for kind in (crd, "gadget", f"gadget.{group}"):
        assert _same_as_kubectl(kubelab, monkeypatch, kind, "g1", namespace)["spec"] == {"size": 3}

    assert _by_reader(kubelab, monkeypatch, "configmap", "absent", namespace) is None
    assert _by_reader(kubelab, monkeypatch, crd, "absent", namespace) is None
    assert objects.get(kubelab, "node", _name("absent")) is None

    listed = _by_reader(kubelab, monkeypatch, "gadgets", namespace, list_kind=True)
    kubectl_list = json.loads(kubelab.kubectl("get", "gadgets", "-n", namespace, "-o", "json").stdout)[
        "items"
    ]
    assert listed == kubectl_list
    assert [(g["apiVersion"], g["kind"]) for g in listed] == [(f"{group}/v1", "Gadget")]
