"""The capi flavour on its own: the four real CAPI v1.14.2 controllers run, their webhooks are wired
(admission and conversion), and a Cluster on a DevCluster is accepted and reconciled.

Real: the apiserver and the four CAPI controllers. Simulated: CAPD's in-memory backend (no VMs; the
DevCluster's endpoint is a listener in CAPD).
"""

from __future__ import annotations

import json
import uuid

import httpx
import pytest
from hostlab.errors import LabError
from kubelab import build, objects
from kubelab.flavours import capi
from kubelab.flavours import capi_objects as co
from kubelab.lab import Lab
from kubelab.ports import RESERVED_PORTS

pytestmark = [pytest.mark.kube, pytest.mark.capi]


def _namespace(lab: Lab) -> str:
    name = f"capi-{uuid.uuid4().hex[:6]}"
    objects.ensure_namespace(lab, name)
    return name


def test_every_controller_is_ready_on_its_own_ports(kubelab_capi: Lab) -> None:
    status = kubelab_capi.status()
    assert "capi" in status["flavours"]
    components = {c["name"]: c for c in status["components"]}
    ports = kubelab_capi.state().ports
    for controller in capi.CONTROLLERS:
        assert components[controller.name]["running"], controller.name
        health = ports[f"{controller.name}-health"]
        assert httpx.get(f"http://127.0.0.1:{health}/readyz", timeout=5).status_code == 200
        for kind in ("webhook", "health"):
            port = ports[f"{controller.name}-{kind}"]
            assert not any(port in reserved for reserved in RESERVED_PORTS), (controller.name, kind, port)
    capd = kubelab_capi.state().component("capd")
    assert capd is not None and capd.env == {"POD_IP": "127.0.0.1"}
    core = kubelab_capi.state().component("capi-core")
    assert core is not None
    assert "--feature-gates=RuntimeSDK=true,InPlaceUpdates=true" in core.argv


def test_crds_carry_the_contract_labels_and_their_owners_conversion_webhook(kubelab_capi: Lab) -> None:
    ports = kubelab_capi.state().ports
    expected = {
        "machines.cluster.x-k8s.io": ("capi-core", None),
        "kubeadmcontrolplanes.controlplane.cluster.x-k8s.io": ("capi-kcp", "v1beta2"),
        "kubeadmconfigtemplates.bootstrap.cluster.x-k8s.io": ("capi-cabpk", "v1beta2"),
        "devmachines.infrastructure.cluster.x-k8s.io": ("capd", "v1beta2"),
    }
    for crd_name, (owner, contract) in expected.items():
        crd = objects.get(kubelab_capi, "crd", crd_name)
        assert crd is not None, crd_name
        labels = crd["metadata"].get("labels", {})
        assert labels.get("cluster.x-k8s.io/v1beta2") == contract, (crd_name, labels)
        webhook = crd["spec"]["conversion"]["webhook"]["clientConfig"]
        assert webhook["url"] == f"https://127.0.0.1:{ports[f'{owner}-webhook']}/convert"
        assert webhook["caBundle"]


def test_eight_webhook_configurations_point_at_their_controllers(kubelab_capi: Lab) -> None:
    ports = kubelab_capi.state().ports
    found = []
    for kind in ("mutatingwebhookconfigurations", "validatingwebhookconfigurations"):
        for config in json.loads(kubelab_capi.kubectl("get", kind, "-o", "json").stdout)["items"]:
            owner = next(
                (c.name for c in capi.CONTROLLERS if config["metadata"]["name"].endswith(c.name)), None
            )
            if owner is None:
                continue
            found.append(config["metadata"]["name"])
            for webhook in config["webhooks"]:
                url = webhook["clientConfig"]["url"]
                assert url.startswith(f"https://127.0.0.1:{ports[f'{owner}-webhook']}/"), url
                assert "service" not in webhook["clientConfig"]
    assert len(found) == 8, found


def test_a_cluster_without_any_reference_is_refused_by_cores_webhook(kubelab_capi: Lab) -> None:
    namespace = _namespace(kubelab_capi)
    bare = {
        "apiVersion": co.CORE_API,
        "kind": "Cluster",
        "metadata": {"name": "bare", "namespace": namespace},
    }
    with pytest.raises(LabError) as refused:
        # valid for the CRD's schema, refused by core's validating webhook
        objects.apply(kubelab_capi, {**bare, "spec": {"clusterNetwork": {"serviceDomain": "cluster.local"}}})
    # this text exists only in core's webhook (core/webhooks/admission/cluster.go), not in the CRD schema
    assert "one of spec.controlPlaneRef, spec.infrastructureRef or spec.topology must be set" in str(
        refused.value
    )


def test_a_dev_cluster_based_cluster_is_accepted_and_reconciled(kubelab_capi: Lab) -> None:
    namespace = _namespace(kubelab_capi)
    objects.apply(kubelab_capi, co.dev_cluster("c1", namespace), co.cluster("c1", namespace))
    # core owns the Cluster (its finalizer), CAPD provisions the DevCluster in memory (an endpoint in CAPD)
    objects.wait_for(
        kubelab_capi,
        "clusters.cluster.x-k8s.io",
        "c1",
        namespace,
        lambda c: "cluster.cluster.x-k8s.io" in c.get("metadata", {}).get("finalizers", []),
        "owned by core",
    )
    objects.wait_for(
        kubelab_capi,
        "devclusters.infrastructure.cluster.x-k8s.io",
        "c1",
        namespace,
        lambda d: d.get("status", {}).get("initialization", {}).get("provisioned") is True,
        "provisioned",
    )
    dev = objects.get(kubelab_capi, "devclusters.infrastructure.cluster.x-k8s.io", "c1", namespace)
    assert dev is not None
    endpoint = dev["spec"]["controlPlaneEndpoint"]
    assert endpoint["host"] == "127.0.0.1"  # POD_IP
    # read back in the old API version: the apiserver calls each owner's conversion webhook
    for resource in (
        "clusters.v1beta1.cluster.x-k8s.io",
        "devclusters.v1beta1.infrastructure.cluster.x-k8s.io",
    ):
        old = json.loads(kubelab_capi.kubectl("get", resource, "c1", "-n", namespace, "-o", "json").stdout)
        assert old["apiVersion"].endswith("/v1beta1"), old["apiVersion"]


def test_the_capi_version_is_one_setting() -> None:
    versions = {b.name: b.ldflags for b in build.BINARIES.values() if b.name in capi.binaries}
    assert set(versions) == {"capi-core", "capi-kcp", "capi-cabpk", "capd"}
    for flags in versions.values():
        assert f"-X sigs.k8s.io/cluster-api/version.gitVersion={build.CAPI_VERSION}" in flags
