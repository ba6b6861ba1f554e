"""An in-memory fake of the Kubernetes adapter's ports (``inplace_extension.kube.port``): the clusters the
Kubernetes-aware steps and the MCM agent talk to, as dicts, with every call counted (``calls``) and any
call made to fail (``failing``). It keeps the rules the real API server enforces that our code relies on:
resourceVersion preconditions (Conflict), "only if absent" Events, JSON-patch style "test then remove".
Jobs too (``FakeJobs``: the ``kubernetes`` executor's Jobs, their Secrets and its record annotations).
The lab tests (tests/kube, tests/mcm) are the proof against the real API server; these are for speed.
"""

from __future__ import annotations

import asyncio
import copy
from collections import Counter
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from inplace_extension.kube.drain import CORDONED_BY
from inplace_extension.kube.errors import Conflict, Forbidden, KubeError, NotFound, Unreachable
from inplace_extension.kube.jobs import not_starting
from inplace_extension.kube.machines import SKIP_REMEDIATION, SKIP_REMEDIATION_BY
from inplace_extension.kube.port import (
    Annotation,
    DrainError,
    DrainPolicy,
    JobState,
    KubeEvent,
    MachineFacts,
    NodeHealth,
    NodeSeen,
    ObjectQuery,
    RecordRef,
)
from inplace_extension.kube.update_condition import IDLE_MESSAGE


class Calls:
    """What was called, and which calls fail (``failing.add("machine")``: the API server is away)."""

    def __init__(self) -> None:
        self.count: Counter[str] = Counter()
        self.failing: set[str] = set()
        # name -> the error that call raises (a 429, a 503, a timeout: what kube/client.py translates)
        self.errors: dict[str, KubeError] = {}

    def __call__(self, name: str) -> None:
        self.count[name] += 1
        if name in self.errors:
            raise self.errors[name]
        if name in self.failing:
            raise Unreachable("the API server is unreachable (ConnectError)")


@dataclass
class FakeNode:
    ready: bool = True
    kubelet: str | None = "v1.31.0"
    unschedulable: bool = False
    annotations: dict[str, str] = field(default_factory=dict)
    pods: int = 0  # Pods a drain must evict
    stuck: bool = False  # a PodDisruptionBudget refuses every eviction
    # the service's own attempt Pods of other Machines on it, still running: a drain waits for them (past
    # its timeout a retriable DrainError), never evicts them
    attempts: int = 0
    # the DisruptiveInPlaceUpdate condition as (status, message); None: the Node has no such condition
    updating: tuple[str, str] | None = None
    condition_writes: int = 0  # how often the condition was written


class FakeObjects:
    """:class:`~inplace_extension.kube.port.ClusterObjects` in memory: any object as the API server's
    dict, found by apiVersion, kind, namespace and name or labels; ``forbidden`` kinds answer 403."""

    def __init__(self, calls: Calls | None = None) -> None:
        self.calls = calls or Calls()
        self.store: dict[tuple[str, str, str | None, str], dict[str, Any]] = {}
        self.forbidden: set[str] = set()

    def put(
        self,
        api_version: str,
        kind: str,
        namespace: str | None,
        name: str,
        labels: Mapping[str, str] | None = None,
        **fields: Any,
    ) -> dict[str, Any]:
        """Create or replace an object (``fields``: spec, status ...); the stored dict, to change later."""
        metadata: dict[str, Any] = {"name": name, "labels": dict(labels or {})}
        if namespace is not None:
            metadata["namespace"] = namespace
        obj = {"apiVersion": api_version, "kind": kind, "metadata": metadata, **copy.deepcopy(fields)}
        self.store[(api_version, kind, namespace, name)] = obj
        return obj

    def objects(self, query: ObjectQuery) -> list[dict[str, Any]]:
        self.calls("objects")
        if query.kind in self.forbidden:
            raise Forbidden(f"list {query.kind}: the API server answered 403", 403)
        found = []
        for (api_version, kind, namespace, name), obj in sorted(self.store.items(), key=lambda i: str(i[0])):
            if (api_version, kind, namespace) != (query.api_version, query.kind, query.namespace):
                continue
            labels = obj["metadata"]["labels"]
            if query.name is not None and name != query.name:
                continue
            if query.name is None and any(labels.get(k) != v for k, v in query.selector):
                continue
            found.append(copy.deepcopy(obj))
        return found


class FakeWorkload:
    def __init__(self, calls: Calls) -> None:
        self.nodes: dict[str, FakeNode] = {}
        self.calls = calls
        self.policies: list[DrainPolicy] = []  # what each drain was asked to honour
        self.cluster_objects = FakeObjects(calls)

    def objects(self, query: ObjectQuery) -> list[dict[str, Any]]:
        return self.cluster_objects.objects(query)

    def node_health(self, node: str) -> NodeHealth:
        self.calls("node_health")
        found = self.nodes.get(node)
        if found is None:
            return NodeHealth(False, False, None, False)
        return NodeHealth(True, found.ready, found.kubelet, found.unschedulable)

    def cordon(self, node: str, owner: str) -> bool:
        self.calls("cordon")
        found = self.nodes.get(node)
        if found is None:
            raise DrainError(f"drain: Node {node} not found in the workload cluster")
        if found.unschedulable:
            return found.annotations.get(CORDONED_BY) == owner
        found.unschedulable, found.annotations[CORDONED_BY] = True, owner
        return True

    def drain(self, node: str, policy: DrainPolicy, report: Callable[[int], None]) -> None:
        self.calls("drain")
        self.policies.append(policy)
        found = self.nodes[node]
        report(found.pods + found.attempts)
        if found.stuck and found.pods:
            raise DrainError(
                f"drain: timed out after {policy.timeout_seconds:g}s with {found.pods} pods left"
            )
        found.pods = 0
        if found.attempts:
            raise DrainError(
                f"drain: timed out after {policy.timeout_seconds:g}s with {found.attempts} pods left on Node "
                f"{node}; still running: the attempts of other updates",
                retriable=True,
            )
        report(0)

    def uncordon(self, node: str, owner: str) -> bool:
        self.calls("uncordon")
        found = self.nodes.get(node)
        if found is None or found.annotations.get(CORDONED_BY) != owner:
            return False
        del found.annotations[CORDONED_BY]
        found.unschedulable = False
        return True

    def cordoned_by(self, node: str) -> str | None:
        self.calls("cordoned_by")
        found = self.nodes.get(node)
        return found.annotations.get(CORDONED_BY) if found else None

    def show_updating(self, node: str, message: str) -> bool:
        self.calls("show_updating")
        found = self.nodes.get(node)
        if found is None or found.updating == ("True", message):
            return False
        found.updating, found.condition_writes = ("True", message), found.condition_writes + 1
        return True

    def clear_updating(self, node: str) -> bool:
        self.calls("clear_updating")
        found = self.nodes.get(node)
        if found is None or found.updating is None or found.updating[0] != "True":
            return False
        found.updating, found.condition_writes = ("False", IDLE_MESSAGE), found.condition_writes + 1
        return True


class FakeManagement:
    """:class:`~inplace_extension.kube.port.ManagementCluster` in memory; the workload is one cluster."""

    def __init__(self) -> None:
        self.calls = Calls()
        self.machines: dict[tuple[str, str], MachineFacts] = {}
        self.owners: dict[tuple[str, str, str], dict[str, str]] = {}  # (kind, ns, name) -> annotations
        self.events: list[KubeEvent] = []
        self.cluster = FakeWorkload(self.calls)
        self.closed = False
        self.annotation_writes = 0  # patches of a Machine's annotations that the API server accepted
        self._version = 0
        # any other object by (kind, namespace, name), e.g. an AWSMachine; a KubeError to raise instead
        self.objects_by_name: dict[tuple[str, str | None, str], dict[str, Any]] = {}
        self.objects_error: KubeError | None = None

    def _next_version(self) -> str:
        self._version += 1
        return str(self._version)

    def annotate(self, namespace: str, name: str, changes: Mapping[str, str | None]) -> None:
        """Another writer changes the Machine's annotations (None removes): a new resourceVersion."""
        live = self.machines[(namespace, name)]
        annotations = {**live.annotations, **changes}
        kept = {k: v for k, v in annotations.items() if v is not None}
        version = self._next_version()
        self.machines[(namespace, name)] = replace(live, annotations=kept, resource_version=version)

    def add_machine(self, namespace: str, name: str, node: str | None, address: str = "10.0.0.7") -> None:
        self.machines[(namespace, name)] = MachineFacts(
            namespace, name, f"uid-{name}", "c1", (("InternalIP", address),), node, {}, self._next_version()
        )
        if node is not None:
            self.cluster.nodes.setdefault(node, FakeNode())

    def machine(self, namespace: str, name: str) -> MachineFacts | None:
        self.calls("machine")
        found = self.machines.get((namespace, name))
        return replace(found, annotations=dict(found.annotations)) if found else None

    def objects(self, query: ObjectQuery) -> list[dict[str, Any]]:
        self.calls("objects")
        if self.objects_error is not None:
            raise self.objects_error
        found = self.objects_by_name.get((query.kind, query.namespace, query.name or ""))
        return [] if found is None else [copy.deepcopy(found)]

    def owner_annotations(self, kind: str, namespace: str, name: str) -> Mapping[str, str] | None:
        self.calls("owner_annotations")
        found = self.owners.get((kind, namespace, name))
        return None if found is None else dict(found)

    def mark_skip_remediation(self, machine: MachineFacts, owner: str) -> bool:
        """As the real one: a merge patch conditional on the resourceVersion read, read again on a
        Conflict (the API server's 409 when the Machine changed since)."""
        self.calls("mark_skip_remediation")
        while SKIP_REMEDIATION not in machine.annotations:
            live = self.machines[(machine.namespace, machine.name)]
            if live.resource_version == machine.resource_version:
                marks = {SKIP_REMEDIATION: "", SKIP_REMEDIATION_BY: owner}
                self.annotate(machine.namespace, machine.name, marks)
                self.annotation_writes += 1
                return True
            machine = replace(live, annotations=dict(live.annotations))
        return machine.annotations.get(SKIP_REMEDIATION_BY) == owner

    def unmark_skip_remediation(self, machine: MachineFacts) -> bool:
        self.calls("unmark_skip_remediation")
        owner = machine.annotations.get(SKIP_REMEDIATION_BY)
        live = self.machines.get((machine.namespace, machine.name))
        if owner is None or live is None or live.annotations.get(SKIP_REMEDIATION_BY) != owner:
            return False  # the "test" op fails: removed meanwhile
        self.annotate(machine.namespace, machine.name, {SKIP_REMEDIATION_BY: None, SKIP_REMEDIATION: None})
        self.annotation_writes += 1
        return True

    def record(self, event: KubeEvent) -> None:
        if all(event.name != seen.name for seen in self.events):
            self.events.append(event)

    def workload(self, namespace: str, cluster: str) -> FakeWorkload:
        return self.cluster

    def read(self, ref: RecordRef, key: str) -> Annotation | None:
        self.calls("read")
        found = self.machines.get((ref.namespace or "", ref.name)) if ref.kind == "Machine" else None
        if found is None:
            return None
        return Annotation(found.annotations.get(key), found.resource_version or "", found.node_name)

    def write(self, ref: RecordRef, key: str, value: str | None, resource_version: str) -> None:
        """As the real one: a merge patch conditional on the resourceVersion read (else Conflict)."""
        self.calls("write")
        found = self.machines.get((ref.namespace or "", ref.name)) if ref.kind == "Machine" else None
        if found is None:
            raise KubeError(f"annotate {ref}: the API server answered 404", 404)
        if found.resource_version != resource_version:
            raise Conflict(f"annotate {ref}: the API server answered 409", 409)
        self.annotate(found.namespace, found.name, {key: value})

    def close(self) -> None:
        self.closed = True

    def reasons(self) -> list[str]:
        return [event.reason for event in self.events]


class _Watchers:
    """Change streams: each watcher gets ("LISTED", all) and then every change."""

    def __init__(self) -> None:
        self.queues: list[asyncio.Queue[tuple[str, list[dict[str, Any]]]]] = []

    async def stream(
        self,
        listed: Callable[[], list[dict[str, Any]]],
        connected: asyncio.Event | None,
        activity: asyncio.Event | None = None,
    ) -> AsyncIterator[tuple[str, list[dict[str, Any]]]]:
        changes: asyncio.Queue[tuple[str, list[dict[str, Any]]]] = asyncio.Queue()
        self.queues.append(changes)
        if connected is not None:
            connected.set()
        yield "LISTED", listed()
        if activity is not None:  # the watcher has taken the list in
            activity.set()
        while True:
            yield await changes.get()

    def changed(self, event: str, obj: dict[str, Any]) -> None:
        for changes in self.queues:
            changes.put_nowait((event, [copy.deepcopy(obj)]))


class FakeTarget:
    """:class:`~inplace_extension.kube.port.TargetCluster` in memory: Nodes as the API server's dicts."""

    def __init__(self) -> None:
        self.calls = Calls()
        self.nodes: dict[str, dict[str, Any]] = {}
        self.pods: dict[str, list[tuple[str, str]]] = {}  # Node -> (Pod name, owner kind)
        self.events: list[KubeEvent] = []
        self.activity = asyncio.Event()  # set on every write: what a test waits on
        self._version = 0
        self._watchers = _Watchers()

    def put_node(self, node: dict[str, Any]) -> dict[str, Any]:
        """Create or replace a Node (as another writer would: MCM, the kubelet)."""
        self._version += 1
        node = copy.deepcopy(node)
        node.setdefault("metadata", {})["resourceVersion"] = str(self._version)
        self.nodes[node["metadata"]["name"]] = node
        self._watchers.changed("MODIFIED", node)
        self.activity.set()
        return copy.deepcopy(node)

    def delete_node(self, name: str) -> None:
        """Delete a Node (as MCM does when it removes its Machine)."""
        node = self.nodes.pop(name)
        self._watchers.changed("DELETED", node)
        self.activity.set()

    def watch_nodes(self, connected: asyncio.Event | None = None) -> AsyncIterator[NodeSeen]:
        self.calls("watch_nodes")

        async def nodes() -> AsyncIterator[NodeSeen]:
            async for event, changed in self._watchers.stream(
                lambda: [copy.deepcopy(n) for n in self.nodes.values()], connected
            ):
                for node in changed:
                    yield node["metadata"]["name"], (None if event == "DELETED" else node)

        return nodes()

    async def patch_node_metadata(
        self,
        name: str,
        resource_version: str | None,
        labels: Mapping[str, str | None] | None = None,
        annotations: Mapping[str, str | None] | None = None,
    ) -> dict[str, Any]:
        self.calls("patch_node_metadata")
        node = copy.deepcopy(self.nodes[name])
        if resource_version is not None and node["metadata"]["resourceVersion"] != resource_version:
            raise Conflict(f"patch Node {name}: the API server answered 409", 409)
        for key, changes in (("labels", labels), ("annotations", annotations)):
            current = node["metadata"].setdefault(key, {})
            for k, v in (changes or {}).items():
                if v is None:
                    current.pop(k, None)
                else:
                    current[k] = v
        return self.put_node(node)

    async def remove_taint(self, node: Mapping[str, Any], key: str, effect: str) -> bool:
        self.calls("remove_taint")
        taints = list(node.get("spec", {}).get("taints") or [])
        kept = [t for t in taints if not (t.get("key") == key and t.get("effect") == effect)]
        if len(kept) == len(taints):
            return False
        live = copy.deepcopy(self.nodes[node["metadata"]["name"]])
        if live["metadata"]["resourceVersion"] != node["metadata"]["resourceVersion"]:
            raise Conflict("patch Node: the API server answered 422", 422)
        live.setdefault("spec", {})["taints"] = kept
        self.put_node(live)
        return True

    async def delete_pods_on_node(self, node: str, keep_kinds: frozenset[str]) -> int:
        self.calls("delete_pods_on_node")
        pods = self.pods.get(node, [])
        self.pods[node] = [pod for pod in pods if pod[1] in keep_kinds]
        return len(pods) - len(self.pods[node])

    async def post_event(self, event: KubeEvent) -> None:
        self.calls("post_event")
        if all(event.name != seen.name for seen in self.events):
            self.events.append(event)
        self.activity.set()

    async def close(self) -> None:
        return None

    def reasons(self, node: str) -> list[str]:
        return [event.reason for event in self.events if event.about.name == node]


class FakeControl:
    """:class:`~inplace_extension.kube.port.ControlCluster` in memory: MCM's objects of any namespace."""

    def __init__(self, activity: asyncio.Event | None = None) -> None:
        self.calls = Calls()
        self.activity = activity  # set when a watcher has taken its list in
        self.objects: dict[str, dict[str, dict[str, Any]]] = {}
        self._version = 0
        self._watchers: dict[str, _Watchers] = {}

    def put(self, obj: dict[str, Any]) -> None:
        """Create or replace an object (as MCM would)."""
        self._version += 1
        obj = copy.deepcopy(obj)
        obj["metadata"]["resourceVersion"] = str(self._version)
        self.objects.setdefault(obj["kind"], {})[obj["metadata"]["name"]] = obj
        self._watchers.setdefault(obj["kind"], _Watchers()).changed("MODIFIED", obj)

    async def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        self.calls("get")
        obj = self.objects.get(kind, {}).get(name)
        return copy.deepcopy(obj) if obj is not None else None

    async def list_all(self, kind: str, namespace: str) -> list[dict[str, Any]]:
        self.calls("list_all")
        return [copy.deepcopy(obj) for obj in self.objects.get(kind, {}).values()]

    def watch(
        self, kind: str, namespace: str, connected: asyncio.Event | None = None
    ) -> AsyncIterator[tuple[str, list[dict[str, Any]]]]:
        self.calls("watch")
        listed = lambda: [copy.deepcopy(o) for o in self.objects.get(kind, {}).values()]  # noqa: E731
        return self._watchers.setdefault(kind, _Watchers()).stream(listed, connected, self.activity)

    async def close(self) -> None:
        return None


class ReplicaKilled(BaseException):
    """The replica making a Job was killed (a BaseException: no ``except Exception`` of ours sees it)."""


def failing_with(error: KubeError) -> Callable[..., Any]:
    """A replacement method that raises ``error`` (e.g. a Forbidden from RBAC)."""

    def fail(*args: Any, **kwargs: Any) -> Any:
        raise error

    return fail


@dataclass
class FakeJob:
    """One Job and its one Pod, as far as the ``kubernetes`` executor reads them."""

    manifest: dict[str, Any]
    uid: str
    finished: bool = False
    finished_at: float | None = None  # when it finished (the TTL controller counts from then)
    termination_message: str | None = None
    phase: str | None = None  # the Pod's own phase annotation
    # the Pod's status as the API server sends it (kube/jobs.py names a Pod that cannot start from it)
    pod_status: dict[str, Any] = field(default_factory=dict)
    pending: bool = False  # its Pod has not started (scheduling, pulling the image)

    @property
    def pod(self) -> str:
        return f"{self.manifest['metadata']['name']}-pod"


class FakeJobs:
    """:class:`~inplace_extension.kube.port.JobCluster` and :class:`~inplace_extension.kube.port.
    RecordStore` in memory: Machines and Nodes with annotations and a resourceVersion (a write with an
    old one is a Conflict), Jobs created once (a second create of a name answers False, as AlreadyExists
    does), their Secrets owned by them and deleted with them (the garbage collector's part)."""

    def __init__(self) -> None:
        self.calls = Calls()
        self.objects: dict[tuple[str, str | None, str], dict[str, Any]] = {}
        self.jobs: dict[tuple[str, str], FakeJob] = {}
        self.secrets: dict[tuple[str, str], dict[str, Any]] = {}
        self.version = 0
        self.conflict_next_write = 0  # this many writes fail with Conflict (another replica won)
        self.pod_images: dict[tuple[str, str], str] = {}  # (namespace, Pod) -> its first container's image
        self.killed_after_secret = False  # the next create_job dies after the Secret, before the Job
        self.deleted: list[str] = []  # the Jobs deleted by the executor (not by their TTL)
        self.other_secrets: dict[tuple[str, str], dict[str, bytes]] = {}  # (namespace, name) -> its data

    def _bump(self) -> str:
        self.version += 1
        return str(self.version)

    def add(self, ref: RecordRef, node: str | None = None) -> None:
        self.objects[(ref.kind, ref.namespace, ref.name)] = {
            "annotations": {},
            "rv": self._bump(),
            "node": ref.name if ref.kind == "Node" else node,
        }

    def annotation(self, ref: RecordRef, key: str) -> str | None:
        value: str | None = self.objects[(ref.kind, ref.namespace, ref.name)]["annotations"].get(key)
        return value

    def read(self, ref: RecordRef, key: str) -> Annotation | None:
        self.calls("read")
        obj = self.objects.get((ref.kind, ref.namespace, ref.name))
        if obj is None:
            return None
        return Annotation(obj["annotations"].get(key), obj["rv"], obj["node"])

    def write(self, ref: RecordRef, key: str, value: str | None, resource_version: str) -> None:
        self.calls("write")
        obj = self.objects.get((ref.kind, ref.namespace, ref.name))
        if obj is None:
            raise KubeError(f"annotate {ref}: the API server answered 404", 404)
        if self.conflict_next_write > 0:
            self.conflict_next_write -= 1
            obj["rv"] = self._bump()  # someone else wrote meanwhile
            raise Conflict(f"annotate {ref}: the API server answered 409", 409)
        if obj["rv"] != resource_version:
            raise Conflict(f"annotate {ref}: the API server answered 409", 409)
        if value is None:
            obj["annotations"].pop(key, None)
        else:
            obj["annotations"][key] = value
        obj["rv"] = self._bump()

    def secret_value(self, namespace: str, name: str, key: str) -> bytes | None:
        self.calls("secret_value")
        return self.other_secrets.get((namespace, name), {}).get(key)

    def create_job(self, job: Mapping[str, Any], secret: Mapping[str, Any] | None) -> bool:
        """As kube/jobs.py: the Secret first (None: it must exist, else NotFound), then the Job, then the
        Secret owned by it; ``killed_after_secret``: the replica dies between the two (once)."""
        self.calls("create_job")
        namespace, name = job["metadata"]["namespace"], job["metadata"]["name"]
        if secret is None:
            if (namespace, name) not in self.secrets:
                raise NotFound(f"get Secret {namespace}/{name}: the API server answered 404", 404)
        else:
            self.calls("create_secret")
            self.secrets.setdefault((namespace, secret["metadata"]["name"]), copy.deepcopy(dict(secret)))
        if self.killed_after_secret:
            self.killed_after_secret = False
            raise ReplicaKilled(name)
        self.calls("create_job_object")
        created = (namespace, name) not in self.jobs
        if created:
            self.jobs[(namespace, name)] = FakeJob(copy.deepcopy(dict(job)), uid=f"uid-{name}")
        owner = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "name": name,
            "uid": self.jobs[(namespace, name)].uid,
        }
        self.secrets[(namespace, name)]["metadata"]["ownerReferences"] = [owner]
        return created

    def delete_job(self, namespace: str, name: str, secret: str) -> None:
        self.calls("delete_job")
        self.deleted.append(name)
        self.jobs.pop((namespace, name), None)
        self.secrets.pop((namespace, secret), None)

    def job_state(self, namespace: str, name: str) -> JobState | None:
        self.calls("job_state")
        job = self.jobs.get((namespace, name))
        if job is None:
            return None
        stuck = None if job.finished else not_starting({"status": job.pod_status})
        return JobState(
            job.finished, job.termination_message, job.phase, stuck, job.pending and not job.finished
        )

    def job_finished(self, namespace: str, name: str) -> bool | None:
        self.calls("job_finished")
        job = self.jobs.get((namespace, name))
        return None if job is None else job.finished

    def annotate_pod(self, namespace: str, name: str, key: str, value: str) -> None:
        self.calls("annotate_pod")
        for job in self.jobs.values():
            if job.pod == name and job.manifest["metadata"]["namespace"] == namespace:
                job.phase = value
                return
        raise KubeError(f"annotate Pod {namespace}/{name}: the API server answered 404", 404)

    def set_job_ttl(self, namespace: str, name: str, seconds: int) -> None:
        self.calls("set_job_ttl")
        job = self.jobs.get((namespace, name))
        if job is None:
            raise KubeError(f"patch Job {namespace}/{name}: the API server answered 404", 404)
        job.manifest["spec"]["ttlSecondsAfterFinished"] = seconds

    def pod_image(self, namespace: str, name: str) -> str | None:
        self.calls("pod_image")
        return self.pod_images.get((namespace, name))

    # what the job controller, the kubelet and the garbage collector do

    def only_job(self) -> FakeJob:
        assert len(self.jobs) == 1, sorted(self.jobs)
        return next(iter(self.jobs.values()))

    def finish(self, name: str, termination_message: str | None, at: float | None = None) -> None:
        """The Job's Pod ended (with this termination message; None: killed before writing one) at
        ``at`` (wall-clock seconds, for :meth:`ttl_controller`)."""
        job = next(j for (_, n), j in self.jobs.items() if n == name)
        job.finished, job.termination_message, job.finished_at = True, termination_message, at

    def ttl_controller(self, now: float) -> None:
        """The TTL-after-finished controller: every Job finished its ``ttlSecondsAfterFinished`` (as it
        is now) or more before ``now`` is deleted, with what it owns."""
        for (_, name), job in list(self.jobs.items()):
            ttl = job.manifest["spec"].get("ttlSecondsAfterFinished")
            if job.finished_at is not None and ttl is not None and job.finished_at + ttl <= now:
                self.expire_job(name)

    def expire_job(self, name: str) -> None:
        """The Job is deleted (its TTL, or an operator), and with it the Secrets it owns."""
        key = next(k for k in self.jobs if k[1] == name)
        uid = self.jobs.pop(key).uid
        for skey, secret in list(self.secrets.items()):
            if any(ref.get("uid") == uid for ref in secret["metadata"].get("ownerReferences", [])):
                del self.secrets[skey]
