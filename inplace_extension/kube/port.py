"""The adapter's face: the clusters as the engine's callers see them, and the values they exchange.

Four typed ports, one per role a cluster plays; :mod:`inplace_extension.kube.cluster` implements them
over the Kubernetes API, ``tests/kubefake.py`` in memory (so the Kubernetes-aware steps and the MCM agent
are tested without an API server). Nothing here imports the client library.

- :class:`ManagementCluster` (blocking; the Kubernetes-aware steps of ``serve``, from worker threads):
  CAPI Machines, their Events, and the workload cluster each Machine's Node lives in;
- :class:`WorkloadCluster` (blocking): one workload cluster's Nodes: health, cordon, drain, uncordon;
  and any object a user names (:class:`ClusterObjects`, the ``kubernetes`` health checks);
- :class:`ClusterObjects` (blocking): any object a user names, read as plain dicts (the MCM agent's
  ``kubernetes`` health checks read the target cluster through it);
- :class:`TargetCluster` (async; the MCM agent): the Nodes MCM updates, their Events and Pods;
- :class:`ControlCluster` (async; the MCM agent): MCM's objects (Machines, MachineSets,
  MachineDeployments, MachineClasses) as plain dicts;
- :class:`RecordStore` (blocking; the ``kubernetes`` executor): one annotation on the object an update
  is for (a CAPI Machine, a Node), read with its resourceVersion and written only if unchanged;
- :class:`JobCluster` (blocking; the ``kubernetes`` executor and the Job it starts): one Job per
  attempt with the Secret it owns, the Job's state, its Pod's own phase annotation.

Every method raises only :mod:`inplace_extension.kube.errors` (and :class:`DrainError` from a drain).
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

MAX_EVENT_MESSAGE: Final = 1024  # Event messages are meant to be short; ours are one line


@dataclass(frozen=True)
class MachineFacts:
    """What the live CAPI Machine says (CAPI strips ``status`` from UpdateMachine requests)."""

    namespace: str
    name: str
    uid: str | None
    cluster: str  # spec.clusterName
    addresses: tuple[tuple[str, str], ...]  # status.addresses as (type, address), in CAPI's order
    node_name: str | None  # status.nodeRef.name
    annotations: dict[str, str] = field(default_factory=dict)
    # metadata.resourceVersion as read: our annotation writes are conditional on it (optimistic concurrency)
    resource_version: str | None = None


@dataclass(frozen=True)
class NodeHealth:
    exists: bool
    ready: bool
    kubelet_version: str | None  # status.nodeInfo.kubeletVersion
    unschedulable: bool


@dataclass(frozen=True)
class DrainPolicy:
    timeout_seconds: float = 300.0
    grace_seconds: int | None = None  # None: each Pod's own terminationGracePeriodSeconds
    delete_empty_dir_data: bool = False  # as kubectl drain: refuse Pods with emptyDir volumes by default
    poll_seconds: float = 1.0
    # a PodDisruptionBudget that can never allow the eviction (kube/budgets.py) fails the drain at once;
    # True: wait for it until the timeout, as for any refused eviction
    wait_for_blocking_budgets: bool = False
    # the labels of the service's own attempt Pods (the kubernetes executor's Jobs, updating other
    # Machines): never evicted, never a user's emptyDir data; waited for, unless they wait at their own
    # drain point (kube/drain.py)
    attempt_labels: tuple[tuple[str, str], ...] = ()


class DrainError(Exception):
    """The drain did not finish; the message (``drain: ...``) is stable and goes to CAPI as is.
    ``retriable``: what held it up goes away by itself (the service's own attempts of other Machines):
    the attempt is retried, not remembered as failed."""

    def __init__(self, message: str, retriable: bool = False) -> None:
        super().__init__(message)
        self.retriable = retriable


@dataclass(frozen=True)
class Involved:
    """The object an Event is about."""

    kind: str
    api_version: str
    name: str
    namespace: str | None = None  # None: cluster-scoped (a Node)
    uid: str | None = None  # ``kubectl describe`` finds Events by the object's uid


@dataclass(frozen=True)
class KubeEvent:
    """One state change an operator sees in ``kubectl describe``. The one naming rule: the name is
    derived from the object, the occurrence and the state, and an Event is created only if absent, so
    the same state reported again (another poll, a restarted process, a second replica) is the same
    Event: no spam, nothing to aggregate in memory."""

    about: Involved
    occurrence: str  # a run ident, a Node's resourceVersion: the same state of another one is another Event
    type: str  # Normal | Warning
    reason: str  # CamelCase: Queued, Started, Drained, Done, Failed, InPlaceUpdateSucceeded ...
    message: str
    component: str

    @property
    def name(self) -> str:
        key = f"{self.occurrence}\0{self.reason}\0{self.message}"
        return f"{self.about.name[:200]}.{hashlib.sha256(key.encode()).hexdigest()[:16]}"

    @property
    def namespace(self) -> str:
        """Where the Event lives: its object's namespace; Events about Nodes go to ``default`` (as the
        kubelet's and MCM's do)."""
        return self.about.namespace or "default"

    @property
    def short_message(self) -> str:
        return self.message[:MAX_EVENT_MESSAGE]


@dataclass(frozen=True)
class ObjectQuery:
    """Objects a user names (a ``kubernetes`` health check): of ``api_version``/``kind``, in ``namespace``
    (None: a cluster-scoped kind), the one called ``name`` or, without a name, every one carrying all the
    ``selector`` labels. ``resource``: the kind's plural, when it is not the usual one."""

    api_version: str
    kind: str
    namespace: str | None
    name: str | None
    selector: tuple[tuple[str, str], ...] = ()
    resource: str | None = None


class ClusterObjects(Protocol):
    def objects(self, query: ObjectQuery) -> list[dict[str, Any]]:
        """The named object (an empty list when it does not exist) or every object the selector matches,
        each as the plain dict the API server sent."""
        ...


class WorkloadCluster(ClusterObjects, Protocol):
    def node_health(self, node: str) -> NodeHealth:
        """Ready and the kubelet's version; ``exists`` False when there is no such Node."""
        ...

    def cordon(self, node: str, owner: str) -> bool:
        """Make the Node unschedulable, recording ``owner``; True when it is cordoned by ``owner`` (now
        or before a restart), False when someone else had cordoned it (then it stays theirs)."""
        ...

    def drain(self, node: str, policy: DrainPolicy, report: Callable[[int], None]) -> None:
        """Evict the Node's Pods until none is left (``report``: how many are left), or DrainError."""
        ...

    def uncordon(self, node: str, owner: str) -> bool:
        """Uncordon the Node if (and only if) ``owner`` cordoned it; True when this call did it."""
        ...

    def cordoned_by(self, node: str) -> str | None:
        """Who cordoned the Node according to our annotation (None: not us, or no such Node)."""
        ...

    def show_updating(self, node: str, message: str) -> bool:
        """Publish the Node condition ``DisruptiveInPlaceUpdate`` True with ``message`` (a disruptive
        step runs); True when this call changed the Node, False when it already said so or there is no
        such Node."""
        ...

    def clear_updating(self, node: str) -> bool:
        """Set ``DisruptiveInPlaceUpdate`` False if it is True; True when this call did it (of two concurrent
        callers exactly one), False when it was not True or there is no such Node."""
        ...


class RecordStore(Protocol):
    def read(self, ref: RecordRef, key: str) -> Annotation | None:
        """The annotation ``key`` of ``ref`` and its resourceVersion; None when the object does not exist."""
        ...

    def write(self, ref: RecordRef, key: str, value: str | None, resource_version: str) -> None:
        """Set (None: remove) the annotation if the object is still at ``resource_version`` (else
        Conflict; NotFound when it is gone)."""
        ...


class ManagementCluster(ClusterObjects, RecordStore, Protocol):
    """The management cluster: Machines, their owners, Events, the workload clusters; ``objects`` reads
    any other object there (the provider's infrastructure machine, for its last-applied tags); ``read``
    and ``write`` keep an annotation on a Machine (the infrastructure tags wait's clock)."""

    def machine(self, namespace: str, name: str) -> MachineFacts | None:
        """The Machine's facts, or None when it does not exist."""
        ...

    def mark_skip_remediation(self, machine: MachineFacts, owner: str) -> bool:
        """Set ``skip-remediation`` (and our marker) unless ``machine`` already has it; True when it is
        ours. One someone else set stays theirs: never marked, never removed."""
        ...

    def unmark_skip_remediation(self, machine: MachineFacts) -> bool:
        """Remove ``skip-remediation`` if (and only if) our marker is on ``machine``; True when this
        call did it (of two concurrent callers exactly one)."""
        ...

    def owner_annotations(self, kind: str, namespace: str, name: str) -> Mapping[str, str] | None:
        """The annotations of a Machine's Cluster, MachineDeployment or KubeadmControlPlane (``kind``);
        None when it does not exist."""
        ...

    def record(self, event: KubeEvent) -> None:
        """Queue an Event (a Machine's uid is looked up when the event has none); never blocks."""
        ...

    def workload(self, namespace: str, cluster: str) -> WorkloadCluster:
        """The workload cluster ``cluster`` of ``namespace`` (where its Machines' Nodes are)."""
        ...

    def close(self) -> None:
        """Post the queued Events, then close every connection."""
        ...


# A Node the watch reports: its name, and the Node as it is now, or None once it is gone
NodeSeen = tuple[str, dict[str, Any] | None]


class TargetCluster(Protocol):
    def watch_nodes(self, connected: asyncio.Event | None = None) -> AsyncIterator[NodeSeen]:
        """Every Node as it is now (a full list after each (re)connect), then each change, deletions too
        (also of a Node deleted while the watch was away: missing from the next list); never ends.
        ``connected`` is set while the list or watch works and cleared during an outage."""
        ...

    async def patch_node_metadata(
        self,
        name: str,
        resource_version: str | None,
        labels: Mapping[str, str | None] | None = None,
        annotations: Mapping[str, str | None] | None = None,
    ) -> dict[str, Any]:
        """Merge-patch labels/annotations (None removes a key) if the Node is still at
        ``resource_version`` (else Conflict); the Node as patched. ``None``: whatever the Node's version,
        for a record of what was done outside the cluster, which a concurrent change must not lose."""
        ...

    async def remove_taint(self, node: Mapping[str, Any], key: str, effect: str) -> bool:
        """Remove one taint if the Node is still as read (else Conflict); False when it is absent."""
        ...

    async def delete_pods_on_node(self, node: str, keep_kinds: frozenset[str]) -> int:
        """Delete the Pods bound to ``node`` except those owned by ``keep_kinds``; how many."""
        ...

    async def post_event(self, event: KubeEvent) -> None:
        """Best effort: an Event that cannot be written is logged, never raised."""
        ...

    async def close(self) -> None: ...


class ControlCluster(Protocol):
    async def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        """One MCM object (kind: Machine, MachineSet, MachineDeployment, MachineClass), or None."""
        ...

    async def list_all(self, kind: str, namespace: str) -> list[dict[str, Any]]: ...

    def watch(
        self, kind: str, namespace: str, connected: asyncio.Event | None = None
    ) -> AsyncIterator[tuple[str, list[dict[str, Any]]]]:
        """``("LISTED", every object)`` after each (re)connect, then ``(ADDED|MODIFIED|DELETED,
        [object])`` for each change; never ends."""
        ...

    async def close(self) -> None: ...


@dataclass(frozen=True)
class RecordRef:
    """The object an update's record is kept on: a CAPI ``Machine`` (namespaced) or a ``Node``."""

    kind: str  # "Machine" or "Node"
    name: str
    namespace: str | None = None  # None: cluster-scoped (a Node)

    def __str__(self) -> str:
        return f"{self.kind} {self.namespace}/{self.name}" if self.namespace else f"{self.kind} {self.name}"


@dataclass(frozen=True)
class Annotation:
    """One annotation as read (``value`` None: absent), the object's resourceVersion then, and its Node
    (a Machine's ``status.nodeRef.name``, a Node's own name; None: none yet)."""

    value: str | None
    resource_version: str
    node: str | None = None


@dataclass(frozen=True)
class JobState:
    """What a Job says about its one attempt: ``finished`` (its Complete or Failed condition), the
    termination message of its container when its Pod ended (None: none written), the phase its
    Pod last published on itself (None: none yet), and why its Pod cannot start (None: it runs, or may
    still start): ``Pod cannot be scheduled: 0/3 nodes are available: ...``, ``Pod cannot start:
    ImagePullBackOff: ...``, ``Pod cannot start: MountVolume.SetUp failed ...``, ``its Pod cannot be
    created: ...``; ``pending``: its play has not begun (no Pod yet, or its Pod is Pending: scheduling,
    pulling the image)."""

    finished: bool
    termination_message: str | None
    phase: str | None
    not_starting: str | None = None
    pending: bool = False


class JobCluster(Protocol):
    def create_job(self, job: Mapping[str, Any], secret: Mapping[str, Any] | None) -> bool:
        """Create the Secret (one that exists is this attempt's), then the Job, then make the Job the
        Secret's owner (deleted with it); True when this call created the Job, False when it existed
        already (another replica created it: one attempt). ``secret`` None: the Job of an attempt whose
        Secret exists already (its replica was killed before the Job); NotFound when it does not."""
        ...

    def delete_job(self, namespace: str, name: str, secret: str) -> None:
        """Delete the Job (its Pods with it) and its Secret ``secret``; either gone already is fine."""
        ...

    def job_state(self, namespace: str, name: str) -> JobState | None:
        """The Job's state; None when there is no such Job (never created, or deleted after its TTL)."""
        ...

    def job_finished(self, namespace: str, name: str) -> bool | None:
        """Whether the Job has finished (its Complete or Failed condition), from the Job alone (one read,
        its Pods not listed); None when there is no such Job."""
        ...

    def set_job_ttl(self, namespace: str, name: str, seconds: int) -> None:
        """Set the Job's ``ttlSecondsAfterFinished`` (the TTL controller deletes it that long after it
        finished); NotFound when there is no such Job."""
        ...

    def annotate_pod(self, namespace: str, name: str, key: str, value: str) -> None:
        """Set one annotation on a Pod (the Job's Pod publishes its phase on itself)."""
        ...

    def pod_image(self, namespace: str, name: str) -> str | None:
        """The image of the Pod's first container (the service's own); None when there is no such Pod."""
        ...

    def secret_value(self, namespace: str, name: str, key: str) -> bytes | None:
        """One key of a Secret (a workload cluster's kubeconfig, which the service copies into the one
        attempt's Secret that needs it); None when there is no such Secret or key."""
        ...
