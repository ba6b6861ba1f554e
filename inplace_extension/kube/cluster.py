"""The ports of :mod:`inplace_extension.kube.port` over the Kubernetes API: each class puts together
the object modules (machines, nodes, drain, events, MCM objects) for one role a cluster plays, and the
``connect_*`` functions are how the edges (``serve``, ``mcm-agent``) get them."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Any

from lightkube import AsyncClient, Client

from inplace_extension.kube import (
    drain,
    events,
    jobs,
    machines,
    mcm_objects,
    nodes,
    objects,
    owners,
    records,
    update_condition,
)
from inplace_extension.kube.client import connect, connect_async
from inplace_extension.kube.port import (
    Annotation,
    DrainPolicy,
    JobState,
    KubeEvent,
    MachineFacts,
    NodeHealth,
    NodeSeen,
    ObjectQuery,
    RecordRef,
)
from inplace_extension.kube.workload import WorkloadClients


class KubeWorkload:
    """:class:`~inplace_extension.kube.port.WorkloadCluster` over a blocking client."""

    def __init__(self, client: Client) -> None:
        self._client = client

    def node_health(self, node: str) -> NodeHealth:
        return nodes.node_health(self._client, node)

    def cordon(self, node: str, owner: str) -> bool:
        return drain.cordon(self._client, node, owner)

    def drain(self, node: str, policy: DrainPolicy, report: Callable[[int], None]) -> None:
        drain.drain(self._client, node, policy, report)

    def uncordon(self, node: str, owner: str) -> bool:
        return drain.uncordon(self._client, node, owner)

    def cordoned_by(self, node: str) -> str | None:
        return drain.cordoned_by(self._client, node)

    def show_updating(self, node: str, message: str) -> bool:
        return update_condition.show_updating(self._client, node, message)

    def clear_updating(self, node: str) -> bool:
        return update_condition.clear_updating(self._client, node)

    def objects(self, query: ObjectQuery) -> list[dict[str, Any]]:
        return objects.read(self._client, query)


class KubeObjects:
    """:class:`~inplace_extension.kube.port.ClusterObjects` over a blocking client of its own."""

    def __init__(self, client: Client) -> None:
        self._client = client

    def objects(self, query: ObjectQuery) -> list[dict[str, Any]]:
        return objects.read(self._client, query)

    def close(self) -> None:
        self._client.close()


class KubeManagement:
    """:class:`~inplace_extension.kube.port.ManagementCluster` over a blocking client; workload
    clusters are reached as ``workload_source`` says (see :mod:`inplace_extension.kube.workload`)."""

    def __init__(self, client: Client, workload_source: str) -> None:
        self._client = client
        self._workloads = WorkloadClients(client, workload_source)
        self._events = events.EventRecorder(client, self._uid)

    def machine(self, namespace: str, name: str) -> MachineFacts | None:
        return machines.get_machine(self._client, namespace, name)

    def mark_skip_remediation(self, machine: MachineFacts, owner: str) -> bool:
        return machines.mark_skip_remediation(self._client, machine, owner)

    def owner_annotations(self, kind: str, namespace: str, name: str) -> Mapping[str, str] | None:
        return owners.owner_annotations(self._client, kind, namespace, name)

    def unmark_skip_remediation(self, machine: MachineFacts) -> bool:
        return machines.unmark_skip_remediation(self._client, machine)

    def record(self, event: KubeEvent) -> None:
        self._events.record(event)

    def objects(self, query: ObjectQuery) -> list[dict[str, Any]]:
        return objects.read(self._client, query)

    def workload(self, namespace: str, cluster: str) -> KubeWorkload:
        return KubeWorkload(self._workloads.get(namespace, cluster))

    def read(self, ref: RecordRef, key: str) -> Annotation | None:
        return records.read(self._client, ref, key)

    def write(self, ref: RecordRef, key: str, value: str | None, resource_version: str) -> None:
        records.write(self._client, ref, key, value, resource_version)

    def close(self) -> None:
        self._events.close()
        self._workloads.close()
        self._client.close()

    def _uid(self, namespace: str, name: str) -> str | None:
        facts = machines.get_machine(self._client, namespace, name)
        return facts.uid if facts is not None else None


class KubeTarget:
    """:class:`~inplace_extension.kube.port.TargetCluster` over an asynchronous client."""

    def __init__(self, client: AsyncClient) -> None:
        self._client = client

    def watch_nodes(self, connected: asyncio.Event | None = None) -> AsyncIterator[NodeSeen]:
        return nodes.watch_nodes(self._client, connected)

    async def patch_node_metadata(
        self,
        name: str,
        resource_version: str | None,
        labels: Mapping[str, str | None] | None = None,
        annotations: Mapping[str, str | None] | None = None,
    ) -> dict[str, Any]:
        return await nodes.patch_metadata(self._client, name, resource_version, labels, annotations)

    async def remove_taint(self, node: Mapping[str, Any], key: str, effect: str) -> bool:
        return await nodes.remove_taint(self._client, node, key, effect)

    async def delete_pods_on_node(self, node: str, keep_kinds: frozenset[str]) -> int:
        return await drain.delete_pods_on_node(self._client, node, keep_kinds)

    async def post_event(self, event: KubeEvent) -> None:
        await events.post_async(self._client, event)

    async def close(self) -> None:
        await self._client.close()


class KubeControl:
    """:class:`~inplace_extension.kube.port.ControlCluster` over an asynchronous client."""

    def __init__(self, client: AsyncClient) -> None:
        self._client = client

    async def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        return await mcm_objects.get(self._client, kind, namespace, name)

    async def list_all(self, kind: str, namespace: str) -> list[dict[str, Any]]:
        return await mcm_objects.list_all(self._client, kind, namespace)

    def watch(
        self, kind: str, namespace: str, connected: asyncio.Event | None = None
    ) -> AsyncIterator[tuple[str, list[dict[str, Any]]]]:
        return mcm_objects.watch(self._client, kind, namespace, connected)

    async def close(self) -> None:
        await self._client.close()


class KubeAttempts:
    """The ``kubernetes`` executor's attempts in the cluster, both halves over one blocking client (the
    service's, and a Job's own): their Jobs (:class:`~inplace_extension.kube.port.JobCluster`) and their
    record (:class:`~inplace_extension.kube.port.RecordStore`)."""

    def __init__(self, client: Client) -> None:
        self._client = client

    def create_job(self, job: Mapping[str, Any], secret: Mapping[str, Any] | None) -> bool:
        return jobs.create_job(self._client, job, secret)

    def delete_job(self, namespace: str, name: str, secret: str) -> None:
        jobs.delete_job(self._client, namespace, name, secret)

    def job_state(self, namespace: str, name: str) -> JobState | None:
        return jobs.job_state(self._client, namespace, name)

    def job_finished(self, namespace: str, name: str) -> bool | None:
        return jobs.job_finished(self._client, namespace, name)

    def set_job_ttl(self, namespace: str, name: str, seconds: int) -> None:
        jobs.set_job_ttl(self._client, namespace, name, seconds)

    def annotate_pod(self, namespace: str, name: str, key: str, value: str) -> None:
        jobs.annotate_pod(self._client, namespace, name, key, value)

    def pod_image(self, namespace: str, name: str) -> str | None:
        return jobs.pod_image(self._client, namespace, name)

    def secret_value(self, namespace: str, name: str, key: str) -> bytes | None:
        return jobs.secret_value(self._client, namespace, name, key)

    def read(self, ref: RecordRef, key: str) -> Annotation | None:
        return records.read(self._client, ref, key)

    def write(self, ref: RecordRef, key: str, value: str | None, resource_version: str) -> None:
        records.write(self._client, ref, key, value, resource_version)

    def close(self) -> None:
        self._client.close()


def connect_attempts(kubeconfig: Path | None) -> KubeAttempts:
    """The ``kubernetes`` executor's client (``--kubeconfig`` or the in-cluster account); a bad config
    raises KubeConfigError."""
    return KubeAttempts(connect(kubeconfig))


def connect_management(kubeconfig: Path | None, workload_source: str) -> KubeManagement:
    """``serve --kubeconfig`` (or the in-cluster account); a bad config raises KubeConfigError."""
    return KubeManagement(connect(kubeconfig), workload_source)


def connect_target(kubeconfig: Path | None) -> KubeTarget:
    return KubeTarget(connect_async(kubeconfig))


def connect_control(kubeconfig: Path | None) -> KubeControl:
    return KubeControl(connect_async(kubeconfig))


def connect_objects(kubeconfig: Path | None) -> KubeObjects:
    """A blocking reader of any object (``mcm-agent``'s ``kubernetes`` health checks, from the run
    service's worker threads); a bad config raises KubeConfigError."""
    return KubeObjects(connect(kubeconfig))
