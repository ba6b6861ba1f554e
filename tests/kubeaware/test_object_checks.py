"""The kubernetes health checks (kubeaware/object_checks.py) against the in-memory fake of the adapter:
by name and by selector (every match must satisfy it, none matching does not hold), CEL errors and API
refusals as stable reasons, and the cluster a CAPI Machine's checks read. tests/kube reads the same
objects from the real API server."""

from __future__ import annotations

from dataclasses import replace

import pytest
from kubefake import FakeManagement, FakeObjects

from inplace_extension.capabilities_file import parse_capabilities
from inplace_extension.inplace.custom import NO_CUSTOM
from inplace_extension.kube.errors import KubeError
from inplace_extension.kubeaware.cluster_side import CLUSTER_LABEL, KubeClusterSide
from inplace_extension.kubeaware.object_checks import ObjectChecks
from inplace_extension.runs.model import RunRequest, Unhealthy
from inplace_extension.settings import Settings

CHECKS = parse_capabilities(
    "health_checks:\n"
    "  - name: ceph\n"
    "    kubernetes:\n"
    "      {api_version: ceph.rook.io/v1, kind: CephCluster, namespace: rook-ceph, name: ceph,\n"
    "       expression: 'object.status.health == \"HEALTH_OK\"'}\n"
    "  - name: db\n"
    "    kubernetes:\n"
    "      {api_version: apps/v1, kind: StatefulSet, namespace: db, selector: {app: db},\n"
    "       expression: object.status.readyReplicas == object.spec.replicas}\n"
).object_checks
CEPH = 'object.status.health == "HEALTH_OK"'
RUN = RunRequest("default", "md-0-abc", "ab" * 32, ("ntp",), {"ntp": {}})


@pytest.fixture
def cluster() -> FakeObjects:
    objects = FakeObjects()
    objects.put("ceph.rook.io/v1", "CephCluster", "rook-ceph", "ceph", status={"health": "HEALTH_OK"})
    for name in ("db-a", "db-b"):
        ready = {"readyReplicas": 3}
        objects.put("apps/v1", "StatefulSet", "db", name, {"app": "db"}, spec={"replicas": 3}, status=ready)
    return objects


def checks(objects: FakeObjects) -> ObjectChecks:
    return ObjectChecks(CHECKS, lambda _request: objects)


def test_all_checks_hold(cluster: FakeObjects) -> None:
    assert checks(cluster).unhealthy(RUN) is None


def test_a_false_expression_names_the_check_the_expression_and_the_object(cluster: FakeObjects) -> None:
    cluster.store[("ceph.rook.io/v1", "CephCluster", "rook-ceph", "ceph")]["status"]["health"] = "HEALTH_WARN"
    unhealthy = checks(cluster).unhealthy(RUN)
    assert unhealthy == Unhealthy(
        "ceph", CEPH, "CephCluster rook-ceph/ceph", f"{CEPH} is false on CephCluster rook-ceph/ceph"
    )
    assert unhealthy.waiting == (
        'waiting for health check "ceph" (object.status.health == "HEALTH_OK" is false on CephCluster '
        "rook-ceph/ceph)"
    )
    assert unhealthy.failure(600) == (
        'health gate: health check "ceph" did not hold within 600s after the update '
        '(object.status.health == "HEALTH_OK" on CephCluster rook-ceph/ceph)'
    )


def test_a_check_with_a_timeout_hands_it_over_with_its_failure(cluster: FakeObjects) -> None:
    timed = parse_capabilities(
        "health_checks:\n"
        "  - name: ceph\n"
        "    kubernetes:\n"
        "      {api_version: ceph.rook.io/v1, kind: CephCluster, namespace: rook-ceph, name: ceph,\n"
        "       expression: 'object.status.health == \"HEALTH_OK\"', timeout: 2h}\n"
    ).object_checks
    assert ObjectChecks(timed, lambda _request: cluster).unhealthy(RUN) is None
    cluster.store[("ceph.rook.io/v1", "CephCluster", "rook-ceph", "ceph")]["status"]["health"] = "HEALTH_WARN"
    unhealthy = ObjectChecks(timed, lambda _request: cluster).unhealthy(RUN)
    assert unhealthy is not None and unhealthy.start_timeout_seconds == 7200
    assert unhealthy.start_failure(7200) == (
        'health check "ceph" did not hold within 2h before the update '
        '(object.status.health == "HEALTH_OK" on CephCluster rook-ceph/ceph)'
    )
    assert checks(cluster).unhealthy(RUN) == replace(unhealthy, start_timeout_seconds=None)


def test_an_evaluation_error_does_not_hold_and_carries_cels_error(cluster: FakeObjects) -> None:
    del cluster.store[("ceph.rook.io/v1", "CephCluster", "rook-ceph", "ceph")]["status"]
    unhealthy = checks(cluster).unhealthy(RUN)
    assert unhealthy is not None
    assert (
        unhealthy.detail
        == f"{CEPH} failed on CephCluster rook-ceph/ceph: no such member in mapping: 'status'"
    )


def test_a_named_object_that_does_not_exist_does_not_hold(cluster: FakeObjects) -> None:
    del cluster.store[("ceph.rook.io/v1", "CephCluster", "rook-ceph", "ceph")]
    unhealthy = checks(cluster).unhealthy(RUN)
    assert unhealthy is not None and unhealthy.detail == "no CephCluster rook-ceph/ceph"


def test_with_a_selector_every_matching_object_must_satisfy_it(cluster: FakeObjects) -> None:
    cluster.store[("apps/v1", "StatefulSet", "db", "db-b")]["status"]["readyReplicas"] = 2
    cluster.put("apps/v1", "StatefulSet", "db", "other", {"app": "web"}, spec={"replicas": 1}, status={})
    unhealthy = checks(cluster).unhealthy(RUN)
    assert unhealthy is not None and (unhealthy.check, unhealthy.detail) == (
        "db",
        "object.status.readyReplicas == object.spec.replicas is false on StatefulSet db/db-b",
    )
    assert unhealthy.target == "StatefulSet with app=db in db"


def test_a_selector_matching_nothing_does_not_hold(cluster: FakeObjects) -> None:
    for name in ("db-a", "db-b"):
        del cluster.store[("apps/v1", "StatefulSet", "db", name)]
    unhealthy = checks(cluster).unhealthy(RUN)
    assert unhealthy is not None and unhealthy.detail == "no StatefulSet with app=db in db"


def test_the_first_failing_check_in_file_order_is_named(cluster: FakeObjects) -> None:
    cluster.store[("ceph.rook.io/v1", "CephCluster", "rook-ceph", "ceph")]["status"]["health"] = "HEALTH_ERR"
    cluster.store[("apps/v1", "StatefulSet", "db", "db-a")]["status"] = {}
    unhealthy = checks(cluster).unhealthy(RUN)
    assert unhealthy is not None and unhealthy.check == "ceph"


def test_api_refusals_do_not_hold_and_say_what_rbac_is_missing(cluster: FakeObjects) -> None:
    cluster.forbidden.add("CephCluster")
    unhealthy = checks(cluster).unhealthy(RUN)
    assert unhealthy is not None
    assert unhealthy.detail.startswith("cannot read CephCluster rook-ceph/ceph: list CephCluster: the API ")
    assert "needs get and list on it" in unhealthy.detail
    cluster.forbidden.clear()
    cluster.calls.failing.add("objects")
    unhealthy = checks(cluster).unhealthy(RUN)
    assert unhealthy is not None and unhealthy.detail == (
        "cannot read CephCluster rook-ceph/ceph: the API server is unreachable (ConnectError)"
    )


def test_nothing_escapes_not_even_a_bug() -> None:
    def broken(_request: RunRequest) -> FakeObjects:
        raise RuntimeError("a bug")

    unhealthy = ObjectChecks(CHECKS, broken).unhealthy(RUN)
    assert unhealthy is not None and unhealthy.detail == "the check failed unexpectedly (see the service log)"


def test_a_capi_machines_checks_read_its_workload_cluster() -> None:
    management = FakeManagement()
    management.add_machine("default", "md-0-abc", "node-1")
    side = KubeClusterSide(management, Settings(), NO_CUSTOM)
    assert side.objects_of(RUN) is management.cluster  # from spec.clusterName
    labelled = RunRequest(**{**RUN.__dict__, "labels": {CLUSTER_LABEL: "c1"}})
    calls = management.calls.count["machine"]
    assert side.objects_of(labelled) is management.cluster
    assert management.calls.count["machine"] == calls  # the label names it: no read of the Machine
    with pytest.raises(KubeError, match="no Machine default/gone"):
        side.objects_of(RunRequest("default", "gone", "ab" * 32, (), {}))
