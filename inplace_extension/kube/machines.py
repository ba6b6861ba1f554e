"""CAPI Machines in the management cluster: the facts the service reads (addresses, nodeRef, cluster)
and the annotations it sets (``cluster.x-k8s.io/skip-remediation``).

Machines are read as generic resources of ``cluster.x-k8s.io/v1beta2`` (the version CAPI v1.14 stores);
only the few fields below are looked at, so a newer Machine schema does not break us.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

import httpx2
from lightkube import ApiError, Client
from lightkube.generic_resource import create_namespaced_resource
from lightkube.types import PatchType

from inplace_extension.errors import ExtensionError

MACHINE_API_VERSION: Final = "cluster.x-k8s.io/v1beta2"
MACHINE: Final = create_namespaced_resource("cluster.x-k8s.io", "v1beta2", "Machine", "machines")
SKIP_REMEDIATION: Final = "cluster.x-k8s.io/skip-remediation"
# set with SKIP_REMEDIATION by us (value: the run); only a Machine carrying it has the annotation removed
SKIP_REMEDIATION_BY: Final = "inplace-extension.io/skip-remediation-by"


# lightkube's transport (httpx2) raises these when the API server cannot be reached at all; callers
# treat them as "try again later", never as a verdict
Unreachable: Final = httpx2.TransportError


class KubeError(ExtensionError):
    """A Kubernetes API call failed; the message names the object and the HTTP status, never a body."""

    reason = "KubeError"


def api_failure(what: str, exc: ApiError) -> KubeError:
    return KubeError(f"{what}: the API server answered {exc.response.status_code}")


@dataclass(frozen=True)
class MachineFacts:
    """What the live Machine says (CAPI strips ``status`` from UpdateMachine requests)."""

    namespace: str
    name: str
    uid: str | None
    cluster: str  # spec.clusterName
    addresses: tuple[tuple[str, str], ...]  # status.addresses as (type, address), in CAPI's order
    node_name: str | None  # status.nodeRef.name
    annotations: dict[str, str]


def get_machine(client: Client, namespace: str, name: str) -> MachineFacts | None:
    """The Machine's facts, or None when it does not exist."""
    try:
        obj = client.get(MACHINE, name, namespace=namespace)
    except ApiError as exc:
        if exc.response.status_code == 404:
            return None
        raise api_failure(f"get Machine {namespace}/{name}", exc) from None
    data: dict[str, Any] = obj.to_dict()  # type: ignore[no-untyped-call]  # lightkube leaves it untyped
    return machine_facts(data)


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
    )


def set_annotation(client: Client, namespace: str, name: str, key: str, value: str | None) -> None:
    """Set (or with None remove) one annotation on the Machine: a merge patch touching only that key."""
    patch = {"metadata": {"annotations": {key: value}}}
    try:
        client.patch(MACHINE, name, patch, namespace=namespace, patch_type=PatchType.MERGE)
    except ApiError as exc:
        if exc.response.status_code == 404 and value is None:
            return  # the Machine is gone: nothing left to clean up
        raise api_failure(f"annotate Machine {namespace}/{name}", exc) from None


def _escape(key: str) -> str:
    return "/metadata/annotations/" + key.replace("~", "~0").replace("/", "~1")


def mark_skip_remediation(client: Client, namespace: str, name: str, owner: str) -> bool:
    """Set ``skip-remediation`` (and our marker) unless the Machine already has it; True when we set it.

    A ``skip-remediation`` someone else set stays theirs: we neither mark nor later remove it.
    """
    facts = get_machine(client, namespace, name)
    if facts is None or SKIP_REMEDIATION in facts.annotations:
        return facts is not None and facts.annotations.get(SKIP_REMEDIATION_BY) == owner
    add = {"metadata": {"annotations": {SKIP_REMEDIATION: "", SKIP_REMEDIATION_BY: owner}}}
    try:
        client.patch(MACHINE, name, add, namespace=namespace, patch_type=PatchType.MERGE)
    except ApiError as exc:
        raise api_failure(f"annotate Machine {namespace}/{name}", exc) from None
    return True


def unmark_skip_remediation(client: Client, namespace: str, name: str) -> bool:
    """Remove ``skip-remediation`` if (and only if) our marker is there; True when this call did it."""
    facts = get_machine(client, namespace, name)
    if facts is None or SKIP_REMEDIATION_BY not in facts.annotations:
        return False
    owner = facts.annotations[SKIP_REMEDIATION_BY]
    patch = [
        {"op": "test", "path": _escape(SKIP_REMEDIATION_BY), "value": owner},
        {"op": "remove", "path": _escape(SKIP_REMEDIATION_BY)},
    ]
    if SKIP_REMEDIATION in facts.annotations:
        patch.append({"op": "remove", "path": _escape(SKIP_REMEDIATION)})
    try:
        client.patch(MACHINE, name, patch, namespace=namespace, patch_type=PatchType.JSON)
    except ApiError as exc:
        if exc.response.status_code in (404, 422):  # gone, or removed meanwhile by another caller
            return False
        raise api_failure(f"annotate Machine {namespace}/{name}", exc) from None
    return True
