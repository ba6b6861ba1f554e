"""Small helpers tests use to put things into a lab: namespaces, kwok Nodes, Pods, evictions, waits.

kwok stands in for kubelets: a Node labelled ``type=kwok`` is made Ready by kwok, and a Pod bound to
such a Node (``spec.nodeName``) is made Running; an evicted or deleted Pod is removed by kwok. These
are real API objects in a real apiserver; only the kubelet behind them is simulated.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from hostlab.errors import LabError
from hostlab.proc import wait_until

from kubelab import manifests, reads
from kubelab.config import KWOK_NODE_LABEL

if TYPE_CHECKING:
    from kubelab.lab import Lab

WAIT = 60.0


def apply(lab: Lab, *objects: Mapping[str, Any]) -> None:
    """Server-side apply of the given objects (field manager ``kubelab``)."""
    body = "\n---\n".join(json.dumps(o) for o in objects)
    lab.kubectl("apply", "--server-side", "--field-manager=kubelab", "-f", "-", input=body)


def get(lab: Lab, kind: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
    """The object as JSON (as ``kubectl get -o json`` gives it), or None if it does not exist; read over
    the lab's HTTP client (:mod:`kubelab.reads`): the waits below poll it."""
    return reads.get(lab, kind, name, namespace)


def ensure_namespace(lab: Lab, name: str) -> None:
    apply(lab, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})


def condition(obj: Mapping[str, Any] | None, kind: str) -> Mapping[str, Any] | None:
    if obj is None:
        return None
    conditions = obj.get("status", {}).get("conditions", [])
    return next((c for c in conditions if c.get("type") == kind), None)


def create_kwok_node(
    lab: Lab,
    name: str,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    wait_ready: bool = True,
) -> dict[str, Any]:
    """A Node kwok manages (label ``type=kwok``); by default wait until kwok made it Ready."""
    key, value = KWOK_NODE_LABEL.split("=")
    apply(
        lab,
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "labels": {key: value, "kubernetes.io/hostname": name, **(labels or {})},
                "annotations": {"kwok.x-k8s.io/node": "fake", **(annotations or {})},
            },
        },
    )
    if wait_ready:
        wait_for(
            lab, "node", name, None, lambda n: (condition(n, "Ready") or {}).get("status") == "True", "Ready"
        )
    node = get(lab, "node", name)
    if node is None:
        raise LabError(f"kubelab: Node {name} vanished after creation")
    return node


def create_pod(
    lab: Lab,
    namespace: str,
    name: str,
    node: str,
    labels: Mapping[str, str] | None = None,
    owner: Mapping[str, Any] | None = None,
    volumes: list[dict[str, Any]] | None = None,
    wait_running: bool = True,
) -> dict[str, Any]:
    """A Pod bound to ``node`` (kwok runs it); ``owner`` is an ownerReference (e.g. a DaemonSet)."""
    ensure_namespace(lab, namespace)
    metadata: dict[str, Any] = {"name": name, "namespace": namespace, "labels": dict(labels or {})}
    if owner:
        metadata["ownerReferences"] = [dict(owner)]
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": {
            "nodeName": node,
            "containers": [{"name": "app", "image": "registry.invalid/kwok-stand-in:1"}],
            "volumes": volumes or [],
            "terminationGracePeriodSeconds": 1,
        },
    }
    apply(lab, pod)
    if wait_running:
        wait_for(
            lab, "pod", name, namespace, lambda p: p.get("status", {}).get("phase") == "Running", "Running"
        )
    result = get(lab, "pod", name, namespace)
    if result is None:
        raise LabError(f"kubelab: Pod {namespace}/{name} vanished after creation")
    return result


def create_pdb(lab: Lab, namespace: str, app: str, *, name: str | None = None, **budget: int | str) -> None:
    """A PodDisruptionBudget (named ``name``, else ``app``) over the Pods labelled ``app=<app>``, with
    ``budget`` as its spec (default ``maxUnavailable: 0``: every eviction refused); returns once the
    disruption controller observed it: until then the apiserver refuses every eviction it covers."""
    name = name or app
    apply(
        lab,
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {**(budget or {"maxUnavailable": 0}), "selector": {"matchLabels": {"app": app}}},
        },
    )
    observed = lambda pdb: pdb.get("status", {}).get("observedGeneration") == 1  # noqa: E731
    wait_for(lab, "pdb", name, namespace, observed, "observed")


def evict(lab: Lab, namespace: str, pod: str) -> int:
    """POST a policy/v1 Eviction for the Pod; return the HTTP status (201 evicted, 429 refused by a PDB)."""
    body = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": pod, "namespace": namespace}}
    with lab.http() as client:
        return client.post(f"/api/v1/namespaces/{namespace}/pods/{pod}/eviction", json=body).status_code


def wait_for(
    lab: Lab, kind: str, name: str, namespace: str | None, predicate: Any, what: str, timeout: float = WAIT
) -> None:
    """Poll the object until ``predicate(obj)`` holds (``obj`` may be None when it is gone)."""

    def holds() -> bool:
        return bool(predicate(get(lab, kind, name, namespace) or {}))

    if not wait_until(holds, timeout, 0.25):
        where = f"{namespace}/{name}" if namespace else name
        raise LabError(f"kubelab: {kind} {where} not {what} within {timeout:g}s")


def wait_gone(lab: Lab, kind: str, name: str, namespace: str | None = None, timeout: float = WAIT) -> None:
    if not wait_until(lambda: get(lab, kind, name, namespace) is None, timeout, 0.25):
        raise LabError(f"kubelab: {kind} {name} still exists after {timeout:g}s")


def define_kind(lab: Lab, group: str, kind: str, plural: str, namespaced: bool = True) -> str:
    """A small CRD of ``group``/v1 ``kind`` that keeps any field and has a status subresource (what an
    operator's kind such as Rook's CephCluster looks like to a reader); waits until it is Established.
    Its name (``<plural>.<group>``) for kubectl."""
    name = f"{plural}.{group}"
    schema = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    apply(
        lab,
        {
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": name},
            "spec": {
                "group": group,
                "scope": "Namespaced" if namespaced else "Cluster",
                "names": {
                    "kind": kind,
                    "plural": plural,
                    "singular": kind.lower(),
                    "listKind": f"{kind}List",
                },
                "versions": [
                    {
                        "name": "v1",
                        "served": True,
                        "storage": True,
                        "schema": {"openAPIV3Schema": schema},
                        "subresources": {"status": {}},
                    }
                ],
            },
        },
    )
    manifests.wait_established(lab, f"crd/{name}")
    return name


def set_status(lab: Lab, resource: str, name: str, namespace: str | None, status: Mapping[str, Any]) -> None:
    """Merge ``status`` into an object's status through its status subresource (as its controller would)."""
    where = ["-n", namespace] if namespace else []
    body = json.dumps({"status": status})
    lab.kubectl("patch", resource, name, *where, "--subresource=status", "--type=merge", "-p", body)
