"""Cordon, drain and uncordon a workload Node through the eviction API (kubectl drain's rules).

- **Cordon** marks the Node unschedulable and records who did it in the Node annotation
  ``inplace-extension.io/cordoned-by`` (the Machine, ``namespace/name``). A Node someone else cordoned
  is drained but never uncordoned by us.
- **Drain** evicts every Pod bound to the Node through ``pods/eviction`` (PodDisruptionBudgets are
  honoured: a refused eviction, HTTP 429, is tried again, unless the budget can never allow it:
  then the drain fails at once naming it, see budgets.py), skipping mirror Pods, DaemonSet Pods and
  finished Pods; Pods with emptyDir volumes only when allowed (their data is lost). Each eviction
  carries the configured grace period (else the Pod's own). Progress ``draining: N pods left`` is
  reported whenever N changes; past the timeout a :class:`DrainError` says how many Pods are left and
  which evictions a PodDisruptionBudget refused.
- **The service's own attempts** (Pods with the policy's ``attempt_labels``: Jobs of the
  ``kubernetes`` executor updating other Machines, kept off their own Node but free to land on this
  one) are not a user's workload: never evicted (that would interrupt another update) and never
  refused for their emptyDir scratch. The drain waits for them to end (their Job's deadline bounds
  them), except for one that waits at its own drain point (its phase annotation says ``draining``):
  that one may be waiting for a Pod on its Node, maybe this drain's own, so it is left where it is
  and the drain goes on (two Machines updated at once never wait for each other). Past the timeout
  with only such Pods left the :class:`DrainError` is retriable.
- **Uncordon** is one JSON patch that first *tests* that our annotation is still there, so only a Node
  we cordoned is uncordoned, and of two callers (the run that drained, a restarted service cleaning up)
  exactly one succeeds.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, Final

from lightkube import ALL_NS, AsyncClient, Client
from lightkube.models.meta_v1 import DeleteOptions, ObjectMeta
from lightkube.resources.core_v1 import Node, Pod
from lightkube.types import PatchType

from inplace_extension.kube.budgets import blocking_budget
from inplace_extension.kube.client import translated
from inplace_extension.kube.errors import Conflict, KubeError, NotFound
from inplace_extension.kube.jobs import PHASE_ANNOTATION
from inplace_extension.kube.port import DrainError, DrainPolicy

__all__ = [
    "CORDONED_BY",
    "DrainError",
    "DrainPolicy",
    "cordon",
    "cordoned_by",
    "drain",
    "plan_drain",
    "uncordon",
]

CORDONED_BY: Final = "inplace-extension.io/cordoned-by"
_CORDONED_BY_PATH: Final = "/metadata/annotations/" + CORDONED_BY.replace("~", "~0").replace("/", "~1")
MIRROR_ANNOTATION: Final = "kubernetes.io/config.mirror"
DRAINING_PHASE: Final = "draining"  # an attempt's phase while its play waits at its drain point


def cordon(client: Client, node: str, owner: str) -> bool:
    """Make the Node unschedulable; True when it is cordoned by ``owner`` (now or before a restart).

    False when someone else had already cordoned it: then it stays theirs to uncordon.
    """
    for _ in range(5):  # optimistic concurrency: the resourceVersion in the patch is a precondition
        obj = _get_node(client, node)
        annotations = obj.metadata.annotations or {} if obj.metadata else {}
        if obj.spec is not None and obj.spec.unschedulable:
            return annotations.get(CORDONED_BY) == owner
        version = obj.metadata.resourceVersion if obj.metadata else None
        patch = {
            "metadata": {"resourceVersion": version, "annotations": {CORDONED_BY: owner}},
            "spec": {"unschedulable": True},
        }
        try:
            with translated(f"cordon Node {node}"):
                client.patch(Node, node, patch, patch_type=PatchType.MERGE)
            return True
        except Conflict:
            continue
    raise DrainError(f"drain: Node {node} kept changing while it was being cordoned")


def uncordon(client: Client, node: str, owner: str) -> bool:
    """Uncordon the Node if (and only if) ``owner`` cordoned it; True when this call did it."""
    patch = [
        {"op": "test", "path": _CORDONED_BY_PATH, "value": owner},
        {"op": "remove", "path": _CORDONED_BY_PATH},
        {"op": "replace", "path": "/spec/unschedulable", "value": False},
    ]
    try:
        with translated(f"uncordon Node {node}"):
            client.patch(Node, node, patch, patch_type=PatchType.JSON)
    except KubeError as exc:
        if exc.status in (404, 422):  # gone, or not (any longer) cordoned by us
            return False
        raise
    return True


def cordoned_by(client: Client, node: str) -> str | None:
    """Who cordoned the Node according to our annotation (None: not us, or no such Node)."""
    try:
        with translated(f"get Node {node}"):
            obj = client.get(Node, node)
    except NotFound:
        return None
    return ((obj.metadata.annotations or {}) if obj.metadata else {}).get(CORDONED_BY)


def drain(client: Client, node: str, policy: DrainPolicy, report: Callable[[int], None]) -> None:
    """Evict the Node's Pods until none is left (the service's own attempts: until they ended or wait
    at their drain point), or raise :class:`DrainError` past the timeout."""
    deadline = time.monotonic() + policy.timeout_seconds
    refused: set[str] = set()
    while True:
        with translated(f"list Pods on Node {node}"):
            on_node = list(client.list(Pod, namespace=ALL_NS, fields={"spec.nodeName": node}))
        pods, attempts = plan_drain(on_node, node, policy)
        report(len(pods) + len(attempts))
        if not pods and not attempts:
            return
        if time.monotonic() >= deadline:
            count = len(pods) + len(attempts)
            left = f"{count} pod{'s' if count != 1 else ''} left"
            message = f"drain: timed out after {policy.timeout_seconds:g}s with {left} on Node {node}"
            blocked = sorted(refused & {_key(pod) for pod in pods})
            if blocked:
                message += "; evictions refused by a PodDisruptionBudget: " + ", ".join(blocked)
            if attempts:
                message += "; still running: the attempts of other updates " + ", ".join(
                    sorted(_key(pod) for pod in attempts)
                )
            raise DrainError(message, retriable=not pods)
        for pod in pods:
            if pod.metadata is not None and pod.metadata.deletionTimestamp is None:
                if _evict(client, pod, policy.grace_seconds):
                    refused.discard(_key(pod))
                    continue
                refused.add(_key(pod))
                blocker = None if policy.wait_for_blocking_budgets else blocking_budget(client, pod)
                if blocker is not None:
                    raise DrainError(
                        f"drain: PodDisruptionBudget {blocker[0]} can never allow evicting Pod {_key(pod)} "
                        f"from Node {node} ({blocker[1]}); --drain-wait-for-blocking-pdbs waits instead"
                    )
        time.sleep(max(0.0, min(policy.poll_seconds, deadline - time.monotonic())))


def plan_drain(pods: Sequence[Pod], node: str, policy: DrainPolicy) -> tuple[list[Pod], list[Pod]]:
    """Of the Pods on ``node``: those the drain must evict, and the service's own attempts it waits
    for (each sorted by namespace/name: deterministic progress). Pure."""
    running = [pod for pod in pods if _must_evict(pod)]
    attempts = [pod for pod in running if _is_attempt(pod, policy)]
    chosen = [pod for pod in running if not _is_attempt(pod, policy)]
    waited = [pod for pod in attempts if not _at_own_drain_point(pod)]
    if not policy.delete_empty_dir_data:
        with_data = sorted(_key(pod) for pod in chosen if _uses_empty_dir(pod))
        if with_data:
            raise DrainError(
                f"drain: Pods with emptyDir data on Node {node}: {', '.join(with_data)} "
                "(--drain-delete-emptydir-data allows evicting them)"
            )
    return sorted(chosen, key=_key), sorted(waited, key=_key)


def _is_attempt(pod: Pod, policy: DrainPolicy) -> bool:
    """One of the service's own attempt Pods (all of the policy's attempt labels)."""
    labels = (pod.metadata.labels or {}) if pod.metadata else {}
    return bool(policy.attempt_labels) and all(labels.get(k) == v for k, v in policy.attempt_labels)


def _at_own_drain_point(pod: Pod) -> bool:
    """An attempt Pod whose play waits for its own Node's drain (its published phase)."""
    annotations = (pod.metadata.annotations or {}) if pod.metadata else {}
    phase = annotations.get(PHASE_ANNOTATION)
    return isinstance(phase, str) and phase.startswith(DRAINING_PHASE)


def _must_evict(pod: Pod) -> bool:
    metadata, status = pod.metadata, pod.status
    if metadata is None:
        return False
    if MIRROR_ANNOTATION in (metadata.annotations or {}):
        return False  # static Pods: the kubelet owns them, the API server cannot evict them
    if any(ref.kind == "DaemonSet" and ref.controller for ref in metadata.ownerReferences or []):
        return False  # the DaemonSet controller would recreate them on the cordoned Node anyway
    return not (status is not None and status.phase in ("Succeeded", "Failed"))


def _uses_empty_dir(pod: Pod) -> bool:
    return any(volume.emptyDir is not None for volume in (pod.spec.volumes or [] if pod.spec else []))


def _key(pod: Pod) -> str:
    metadata = pod.metadata or ObjectMeta()
    return f"{metadata.namespace}/{metadata.name}"


def _evict(client: Client, pod: Pod, grace_seconds: int | None) -> bool:
    """POST the eviction; False when a PodDisruptionBudget refused it (429), True otherwise."""
    metadata = pod.metadata or ObjectMeta()
    name, namespace = str(metadata.name), str(metadata.namespace)
    options = DeleteOptions(gracePeriodSeconds=grace_seconds) if grace_seconds is not None else None
    eviction = Pod.Eviction(metadata=ObjectMeta(name=name, namespace=namespace), deleteOptions=options)
    try:
        with translated(f"evict Pod {namespace}/{name}"):
            client.create(eviction, name=name, namespace=namespace)
    except KubeError as exc:
        if exc.status == 429:
            return False
        if exc.status == 404:
            return True  # already gone
        raise
    return True


def _get_node(client: Client, node: str) -> Any:
    try:
        with translated(f"get Node {node}"):
            return client.get(Node, node)
    except NotFound:
        raise DrainError(f"drain: Node {node} not found in the workload cluster") from None


async def delete_pods_on_node(client: AsyncClient, node: str, keep_kinds: frozenset[str]) -> int:
    """Delete the Pods bound to ``node`` except those owned by ``keep_kinds`` (e.g. DaemonSet)."""
    deleted = 0
    with translated(f"list Pods on Node {node}"):
        pods = [pod async for pod in client.list(Pod, namespace=ALL_NS, fields={"spec.nodeName": node})]
    for pod in pods:
        owners = {ref.kind for ref in (pod.metadata.ownerReferences or [])} if pod.metadata else set()
        if owners & keep_kinds or pod.metadata is None or pod.metadata.name is None:
            continue
        try:
            with translated(f"delete Pod {pod.metadata.namespace}/{pod.metadata.name}"):
                await client.delete(Pod, pod.metadata.name, namespace=pod.metadata.namespace)
            deleted += 1
        except NotFound:
            pass
    return deleted
