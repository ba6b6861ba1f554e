"""inplace_extension.kube.owners against the kubelab's real API server with CAPI's Cluster CRD (from the
pinned module): the annotations the pause is read from, and None for an owner that does not exist."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from hostlab.errors import LabError
from hostlab.proc import wait_until
from kubelab import manifests, objects
from kubelab.lab import Lab

from inplace_extension.kube.owners import owner_annotations

pytestmark = pytest.mark.kube


@pytest.fixture(scope="module")
def with_clusters(kubelab: Lab) -> Lab:
    crd = manifests.capi_crd(kubelab, "cluster.x-k8s.io_clusters.yaml")

    def installed() -> bool:
        # kubectl wait fails at once (not after its timeout) on a CRD that has no status yet, which
        # this large CRD may still lack right after the apply: try again until it is Established
        try:
            manifests.install_crds(kubelab, [crd], only_missing=True)
        except LabError:
            return False
        return True

    assert wait_until(installed, 60, 1.0), "the Cluster CRD became Established"
    return kubelab


def test_the_annotations_of_a_machines_cluster_are_read_and_a_missing_owner_is_none(
    with_clusters: Lab, client: Any
) -> None:
    namespace = f"o-{uuid.uuid4().hex[:6]}"
    objects.apply(with_clusters, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    objects.apply(
        with_clusters,
        {
            "apiVersion": "cluster.x-k8s.io/v1beta2",
            "kind": "Cluster",
            "metadata": {
                "name": "c1",
                "namespace": namespace,
                "annotations": {"inplace-extension.io/pause": "cancel", "note": "kept"},
            },
            "spec": {"paused": False},
        },
    )
    annotations = owner_annotations(client, "Cluster", namespace, "c1")
    assert annotations is not None and annotations["inplace-extension.io/pause"] == "cancel"
    assert owner_annotations(client, "Cluster", namespace, "absent") is None
