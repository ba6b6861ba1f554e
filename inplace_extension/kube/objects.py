"""Any object a user names (the ``kubernetes`` health checks): its kind resolved to a resource, then read
as the plain dict the API server sent, by name or by label selector.

Kinds lightkube ships (``apps/v1`` StatefulSet, ``v1`` ConfigMap ...) are its own typed resources; any
other (a CRD such as ``ceph.rook.io/v1`` CephCluster) is a lightkube generic resource whose plural is the
query's ``resource`` or, without one, the kind's plural as Kubernetes derives it when a CRD does not say
otherwise (lowercase; ``es`` after s, x, z, ch, sh; ``ies`` for a y after a consonant; else ``s``).
"""

from __future__ import annotations

import threading
from typing import Any, Final

from lightkube import Client
from lightkube.codecs import resource_registry
from lightkube.core import resource as lightkube_resource
from lightkube.core.exceptions import LoadResourceError
from lightkube.generic_resource import create_global_resource, create_namespaced_resource

from inplace_extension.kube.client import plain, translated
from inplace_extension.kube.errors import KubeError, NotFound
from inplace_extension.kube.port import ObjectQuery

VOWELS: Final = frozenset("aeiou")
_LOCK: Final = threading.Lock()  # lightkube's registry is process-wide; resolve one kind at a time


def plural_of(kind: str) -> str:
    """The resource name Kubernetes gives ``kind`` unless a CRD says otherwise: CephCluster ->
    cephclusters, Ingress -> ingresses, Policy -> policies."""
    lower = kind.lower()
    if lower.endswith(("s", "x", "z", "ch", "sh")):
        return lower + "es"
    if lower.endswith("y") and len(lower) > 1 and lower[-2] not in VOWELS:
        return lower[:-1] + "ies"
    return lower + "s"


def resource_of(query: ObjectQuery) -> Any:
    """The lightkube resource for the query's kind (KubeError when it clashes with a known one)."""
    namespaced = query.namespace is not None
    with _LOCK:
        resource = resource_registry.get(query.api_version, query.kind)
        if resource is None and query.resource is None:
            try:
                resource = resource_registry.load(query.api_version, query.kind)
            except LoadResourceError:
                resource = None
        if resource is None:
            group, _, version = query.api_version.rpartition("/")
            plural = query.resource or plural_of(query.kind)
            create = create_namespaced_resource if namespaced else create_global_resource
            try:
                resource = create(group, version, query.kind, plural)
            except ValueError as exc:  # registered already with another plural or scope
                raise KubeError(f"{query.kind} ({query.api_version}): {exc}") from None
    if issubclass(resource, lightkube_resource.NamespacedResource) != namespaced:
        scope = "namespaced: give its namespace" if not namespaced else "cluster-scoped: leave out namespace"
        raise KubeError(f"{query.kind} ({query.api_version}) is {scope}")
    return resource


def read(client: Client, query: ObjectQuery) -> list[dict[str, Any]]:
    """The named object (none when it does not exist) or every object carrying the selector's labels."""
    resource = resource_of(query)
    where = {"namespace": query.namespace} if query.namespace is not None else {}
    kube: Any = client  # one call for namespaced and cluster-scoped kinds: lightkube types them apart
    if query.name is not None:
        try:
            with translated(f"get {query.kind} {_in(query, query.name)}"):
                return [plain(kube.get(resource, query.name, **where))]
        except NotFound:
            return []
    labels = ",".join(f"{key}={value}" for key, value in query.selector)
    with translated(f"list {query.kind} {_in(query, labels)}"):
        return [plain(obj) for obj in kube.list(resource, labels=dict(query.selector), **where)]


def _in(query: ObjectQuery, what: str) -> str:
    return f"{query.namespace}/{what}" if query.namespace is not None else what
