"""The kubernetes health checks against the kubelab's real API server: the adapter reads any kind (a CRD
through a generic resource, a kind lightkube ships, a cluster-scoped one) by name and by selector, and
the CAPI path (RunService with KubeClusterSide, the Machine's workload cluster) waits before the update
starts and after it ends on a CRD-backed object whose status flips. Only the play is a fake."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from hostlab.proc import wait_until
from kubelab import objects
from kubelab.lab import Lab
from run_deps import run_service
from runs.cluster_settings import cluster_side_settings
from runs.fakes import FP, FakeRunner

from inplace_extension.capabilities_file import parse_capabilities
from inplace_extension.kube.cluster import connect_management, connect_objects
from inplace_extension.kube.errors import KubeError
from inplace_extension.kube.objects import read
from inplace_extension.kube.port import ObjectQuery
from inplace_extension.kubeaware.cluster_side import KubeClusterSide
from inplace_extension.kubeaware.object_checks import ObjectChecks
from inplace_extension.runs.model import Progress, ProgressState, RunRequest
from inplace_extension.runs.service import RunService

from .conftest import create_machine
from .test_kube_aware_runs import events

pytestmark = [pytest.mark.kube, pytest.mark.anyio]

GROUP, KIND, PLURAL = "lab.inplace-extension.io", "CephCluster", "cephclusters"
RESOURCE = f"{PLURAL}.{GROUP}"
EXPRESSION = 'object.status.health == "HEALTH_OK"'


@pytest.fixture(scope="module")
def with_kind(with_machines: Lab) -> Lab:
    objects.define_kind(with_machines, GROUP, KIND, PLURAL)
    return with_machines


def ceph(lab: Lab, namespace: str, name: str = "ceph", health: str = "HEALTH_OK") -> None:
    metadata = {"name": name, "namespace": namespace, "labels": {"app": "ceph"}}
    objects.apply(lab, {"apiVersion": f"{GROUP}/v1", "kind": KIND, "metadata": metadata, "spec": {}})
    objects.set_status(lab, RESOURCE, name, namespace, {"health": health})


def test_the_adapter_reads_any_kind_by_name_and_by_selector(with_kind: Lab, client: Any) -> None:
    ns = f"oc-{uuid.uuid4().hex[:6]}"
    objects.ensure_namespace(with_kind, ns)
    ceph(with_kind, ns, "a")
    ceph(with_kind, ns, "b", "HEALTH_WARN")
    query = ObjectQuery(f"{GROUP}/v1", KIND, ns, "a")
    assert [o["status"]["health"] for o in read(client, query)] == ["HEALTH_OK"]
    assert read(client, ObjectQuery(f"{GROUP}/v1", KIND, ns, "absent")) == []
    by_labels = read(client, ObjectQuery(f"{GROUP}/v1", KIND, ns, None, (("app", "ceph"),)))
    assert sorted((o["metadata"]["name"], o["status"]["health"]) for o in by_labels) == [
        ("a", "HEALTH_OK"),
        ("b", "HEALTH_WARN"),
    ]
    assert read(client, ObjectQuery(f"{GROUP}/v1", KIND, ns, None, (("app", "none"),))) == []
    # a kind lightkube ships (typed), with a selector; a cluster-scoped one by name
    objects.apply(
        with_kind,
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "c", "namespace": ns, "labels": {"x": "1"}},
        },
    )
    maps = read(client, ObjectQuery("v1", "ConfigMap", ns, None, (("x", "1"),)))
    assert [m["metadata"]["name"] for m in maps] == ["c"]
    assert read(client, ObjectQuery("v1", "Namespace", None, ns))[0]["metadata"]["name"] == ns
    with pytest.raises(KubeError, match="ConfigMap \\(v1\\) is namespaced: give its namespace"):
        read(client, ObjectQuery("v1", "ConfigMap", None, "c"))
    with pytest.raises(KubeError, match="answered 404"):  # a kind the API server does not serve
        read(client, ObjectQuery(f"{GROUP}/v1", "Nothing", ns, None, (("app", "x"),)))


@pytest.fixture
def capi_service(with_kind: Lab, fake: FakeRunner, tmp_path: Path) -> Iterator[tuple[RunService, str]]:
    """The CAPI path: the check reads the Machine's workload cluster (here the lab's own API server)."""
    ns = f"oc-{uuid.uuid4().hex[:6]}"
    settings = cluster_side_settings(
        tmp_path,
        kubeconfig=with_kind.kubeconfig,
        workload_kubeconfig="management",
        health_gate_timeout_seconds=60,
    )
    custom = parse_capabilities(
        "health_checks:\n"
        "  - name: ceph\n"
        "    kubernetes:\n"
        f"      {{api_version: {GROUP}/v1, kind: {KIND}, namespace: {ns}, name: ceph,\n"
        f"       expression: '{EXPRESSION}'}}\n"
    )
    side = KubeClusterSide(connect_management(with_kind.kubeconfig, "management"), settings, custom)
    svc = run_service(
        settings, cluster=side, object_health=ObjectChecks(custom.object_checks, side.objects_of)
    )
    yield svc, ns
    assert fake.gate is not None
    fake.gate.set()
    svc.close()
    side.close()


async def poll_until(svc: RunService, req: RunRequest, done: Any, within: float = 30.0) -> Progress:
    deadline = time.monotonic() + within
    while not done(progress := await svc.poll(req)):
        assert time.monotonic() < deadline, progress.message
        await anyio.sleep(0.1)
    return progress


async def test_capi_an_update_waits_for_the_object_before_it_starts_and_after_it_ends(
    with_kind: Lab, capi_service: tuple[RunService, str], fake: FakeRunner
) -> None:
    svc, ns = capi_service
    name, node = f"md-0-{uuid.uuid4().hex[:5]}", f"n-{uuid.uuid4().hex[:6]}"
    objects.create_kwok_node(with_kind, node)
    create_machine(with_kind, ns, name, [{"type": "InternalIP", "address": "10.79.9.31"}], node)
    ceph(with_kind, ns, health="HEALTH_WARN")
    req = RunRequest(ns, name, FP, ("users",), {"users": {"users_users": []}})
    waiting = await svc.poll(req)
    message = f'waiting for health check "ceph" ({EXPRESSION} is false on {KIND} {ns}/ceph)'
    assert (waiting.state, waiting.message, waiting.waiting) == (
        ProgressState.IN_PROGRESS,
        message,
        "health_check",
    )
    assert fake.started == []
    objects.set_status(with_kind, RESOURCE, "ceph", ns, {"health": "HEALTH_OK"})
    await poll_until(svc, req, lambda p: p.waiting is None)
    assert wait_until(lambda: len(fake.started) == 1, 30, 0.1)  # it started once the object flipped
    objects.set_status(with_kind, RESOURCE, "ceph", ns, {"health": "HEALTH_ERR"})  # the update broke it
    assert fake.gate is not None
    fake.gate.set()
    gate = await poll_until(svc, req, lambda p: p.message.startswith("health gate:"))
    assert (
        gate.message
        == f'health gate: waiting for health check "ceph" ({EXPRESSION} is false on {KIND} {ns}/ceph)'
    )
    assert ("Done", "update applied") not in events(with_kind, ns)
    objects.set_status(with_kind, RESOURCE, "ceph", ns, {"health": "HEALTH_OK"})
    done = await poll_until(svc, req, lambda p: p.state is not ProgressState.IN_PROGRESS)
    assert (done.state, done.message) == (ProgressState.DONE, "update applied")
    assert len(fake.started) == 1
    assert wait_until(lambda: ("Done", "update applied") in events(with_kind, ns), 10, 0.2)
    assert ("Waiting", message) in events(with_kind, ns)  # the wait before the start, said once


def test_the_mcm_agents_reader_sees_the_object_flip(with_kind: Lab) -> None:
    ns = f"oc-{uuid.uuid4().hex[:6]}"
    objects.ensure_namespace(with_kind, ns)
    ceph(with_kind, ns, health="HEALTH_WARN")
    custom = parse_capabilities(
        "health_checks:\n"
        "  - name: ceph\n"
        "    kubernetes:\n"
        f"      {{api_version: {GROUP}/v1, kind: {KIND}, namespace: {ns}, selector: {{app: ceph}},\n"
        f"       expression: '{EXPRESSION}'}}\n"
    )
    reader = connect_objects(with_kind.kubeconfig)
    try:
        checks = ObjectChecks(custom.object_checks, lambda _request: reader)
        run = RunRequest(ns, "node-1", FP, (), {})
        unhealthy = checks.unhealthy(run)
        assert unhealthy is not None and unhealthy.detail == f"{EXPRESSION} is false on {KIND} {ns}/ceph"
        objects.set_status(with_kind, RESOURCE, "ceph", ns, {"health": "HEALTH_OK"})
        assert checks.unhealthy(run) is None
    finally:
        reader.close()
