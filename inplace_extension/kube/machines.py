"""CAPI Machines in the management cluster: the facts the service reads (addresses, nodeRef, cluster)
and the annotations it sets (``cluster.x-k8s.io/skip-remediation``, conditional on the resourceVersion read).

Machines are read as generic resources of ``cluster.x-k8s.io/v1beta2`` (the version CAPI v1.14 stores);
only the few fields below are looked at, so a newer Machine schema does not break us.
"""

from __future__ import annotations

from typing import Any, Final

from lightkube import Client
from lightkube.generic_resource import create_namespaced_resource
from lightkube.types import PatchType

from inplace_extension.kube.client import plain, translated
from inplace_extension.kube.errors import Conflict, KubeError, NotFound
from inplace_extension.kube.port import MachineFacts

MACHINE_API_VERSION: Final = "cluster.x-k8s.io/v1beta2"
MACHINE: Final = create_namespaced_resource("cluster.x-k8s.io", "v1beta2", "Machine", "machines")
SKIP_REMEDIATION: Final = "cluster.x-k8s.io/skip-remediation"
# set with SKIP_REMEDIATION by us (value: the run); only a Machine carrying it has the annotation removed
SKIP_REMEDIATION_BY: Final = "inplace-extension.io/skip-remediation-by"
MARK_TRIES: Final = 5  # reads and conditional writes before a Machine that keeps changing is an error


def get_machine(client: Client, namespace: str, name: str) -> MachineFacts | None:
    """The Machine's facts, or None when it does not exist."""
    try:
        with translated(f"get Machine {namespace}/{name}"):
            obj = client.get(MACHINE, name, namespace=namespace)
    except NotFound:
        return None
    return machine_facts(plain(obj))


def machine_facts(obj: dict[str, Any]) -> MachineFacts:
    metadata, spec, status = obj.get("metadata") or {}, obj.get("spec") or {}, obj.get("status") or {}
    addresses = tuple(
        (str(a.get("type", "")), str(a.get("address", "")))
        for a in status.get("addresses") or []
        if isinstance(a, dict) and a.get("address")
    )
    node_ref = status.get("nodeRef") or {}
    return MachineFacts(
        namespace=str(metadata.get("namespace", "")),
        name=str(metadata.get("name", "")),
        uid=metadata.get("uid"),
        cluster=str(spec.get("clusterName", "")),
        addresses=addresses,
        node_name=node_ref.get("name") or None,
        annotations=dict(metadata.get("annotations") or {}),
        resource_version=metadata.get("resourceVersion"),
    )


def set_annotation(client: Client, namespace: str, name: str, key: str, value: str | None) -> None:
    """Set (or with None remove) one annotation on the Machine: a merge patch touching only that key."""
    patch = {"metadata": {"annotations": {key: value}}}
    try:
        with translated(f"annotate Machine {namespace}/{name}"):
            client.patch(MACHINE, name, patch, namespace=namespace, patch_type=PatchType.MERGE)
    except NotFound:
        if value is not None:
            raise
        # the Machine is gone: nothing left to clean up


def _escape(key: str) -> str:
    return "/metadata/annotations/" + key.replace("~", "~0").replace("/", "~1")


def mark_skip_remediation(client: Client, machine: MachineFacts, owner: str) -> bool:
    """Set ``skip-remediation`` (and our marker) unless ``machine`` already has it; True when it is ours.

    A ``skip-remediation`` someone else set stays theirs: we neither mark nor later remove it. The patch
    carries the resourceVersion read with ``machine`` (a precondition): when the Machine changed since,
    it is read again and the decision made anew, so a ``skip-remediation`` set meanwhile is not taken.
    """
    for _ in range(MARK_TRIES):
        if SKIP_REMEDIATION in machine.annotations:
            return machine.annotations.get(SKIP_REMEDIATION_BY) == owner
        add = {
            "metadata": {
                "resourceVersion": machine.resource_version,
                "annotations": {SKIP_REMEDIATION: "", SKIP_REMEDIATION_BY: owner},
            }
        }
        try:
            with translated(f"annotate Machine {machine.namespace}/{machine.name}"):
                client.patch(
                    MACHINE, machine.name, add, namespace=machine.namespace, patch_type=PatchType.MERGE
                )
            return True
        except Conflict:
            fresh = get_machine(client, machine.namespace, machine.name)
            if fresh is None:
                return False
            machine = fresh
    raise Conflict(f"annotate Machine {machine.namespace}/{machine.name}: it kept changing", 409)


def unmark_skip_remediation(client: Client, machine: MachineFacts) -> bool:
    """Remove ``skip-remediation`` if (and only if) our marker is on ``machine``; True when this call did
    it. The patch tests the marker first, so of two callers exactly one succeeds."""
    owner = machine.annotations.get(SKIP_REMEDIATION_BY)
    if owner is None:
        return False
    patch = [
        {"op": "test", "path": _escape(SKIP_REMEDIATION_BY), "value": owner},
        {"op": "remove", "path": _escape(SKIP_REMEDIATION_BY)},
    ]
    if SKIP_REMEDIATION in machine.annotations:
        patch.append({"op": "remove", "path": _escape(SKIP_REMEDIATION)})
    try:
        with translated(f"annotate Machine {machine.namespace}/{machine.name}"):
            client.patch(MACHINE, machine.name, patch, namespace=machine.namespace, patch_type=PatchType.JSON)
    except KubeError as exc:
        if exc.status in (404, 422):  # gone, or removed meanwhile by another caller
            return False
        raise
    return True
