"""One annotation on the object an update is for (a CAPI Machine or a Node), read with the object's
resourceVersion and written only if the object is still at it: the ``kubernetes`` executor keeps its
record of attempts there, so any replica reads the same record and two replicas never both write
over what the other wrote (the loser gets Conflict, reads again and decides again)."""

from __future__ import annotations

from typing import Any

from lightkube import Client
from lightkube.resources.core_v1 import Node
from lightkube.types import PatchType

from inplace_extension.kube.client import plain, translated
from inplace_extension.kube.errors import KubeError, NotFound
from inplace_extension.kube.machines import MACHINE
from inplace_extension.kube.port import Annotation, RecordRef


def _resource(ref: RecordRef) -> Any:
    if ref.kind == "Machine":
        return MACHINE
    if ref.kind == "Node":
        return Node
    raise KubeError(f"no record can be kept on a {ref.kind}")


def read(client: Client, ref: RecordRef, key: str) -> Annotation | None:
    kube: Any = client  # one call for the namespaced Machine and the cluster-scoped Node
    where = {"namespace": ref.namespace} if ref.namespace else {}
    try:
        with translated(f"get {ref}"):
            obj = plain(kube.get(_resource(ref), ref.name, **where))
    except NotFound:
        return None
    metadata = obj.get("metadata") or {}
    value = (metadata.get("annotations") or {}).get(key)
    if ref.kind == "Node":
        node: str | None = ref.name
    else:
        node = ((obj.get("status") or {}).get("nodeRef") or {}).get("name") or None
    return Annotation(
        value if isinstance(value, str) else None, str(metadata.get("resourceVersion", "")), node
    )


def write(client: Client, ref: RecordRef, key: str, value: str | None, resource_version: str) -> None:
    kube: Any = client
    where = {"namespace": ref.namespace} if ref.namespace else {}
    patch = {"metadata": {"resourceVersion": resource_version, "annotations": {key: value}}}
    with translated(f"annotate {ref}"):
        kube.patch(_resource(ref), ref.name, patch, patch_type=PatchType.MERGE, **where)
