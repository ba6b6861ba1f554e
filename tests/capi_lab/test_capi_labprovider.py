"""The lab's infrastructure provider under the real CAPI v1.14.2 controllers (issue #27 item 1, before a
workload cluster is built on it in items 3-4): nothing of CAPI's part is written by the test.

The Cluster's infrastructure is a LabCluster: CAPI's Cluster controller owns it, reads its
``status.initialization.provisioned`` through the v1beta2 contract label and copies its
``controlPlaneEndpoint``. A Machine whose infrastructureRef is a LabMachine reaches the phase Provisioned
on a real pool node (CAPI's Machine controller sets the owner, reads ``spec.providerID``,
``status.addresses`` and ``provisioned``), and deleting the Machine makes CAPI delete the LabMachine,
whose node the provider resets. A MachineDeployment clones a LabMachineTemplate into LabMachines on two
nodes. The real CABPK's bootstrap data for a control-plane Machine (a KubeadmConfig) is carried out on a
node up to its ``kubeadm init``: the files CABPK wrote (the cluster's CA, the kubeadm configuration) are on
the node with CABPK's modes, and the init fails because the node has no kubeadm (a kubeadm machine with
control-plane images is the next step), which the LabMachine reports as ``BootstrapFailed``.

The bootstrap data of the first two is a Secret in CABPK's format written by the test
(:mod:`labprovider.cabpk`; the Machines name it in ``bootstrap.dataSecretName``, as CAPI allows), its
kubeadm command a stand-in (``test -s`` of the join configuration). The namespace carries no
ExtensionConfig label: no in-place hook is called here. No Node ever appears (the lab makes no workload
cluster), so the Machines stay Provisioned, never Running.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from hostlab.lab import Lab as HostLab
from hostlab.proc import wait_until
from hostlab.pytest_plugin import nodes_lab
from kubelab import objects
from kubelab.flavours import capi_objects as co
from kubelab.lab import Lab as KubeLab
from kubelab.labprovider import crds
from labprovider.cabpk import secret, worker_document
from labprovider.pool import LabMachines, clean, provider_running, ready, stat

from .conftest import unique_namespace

pytestmark = [pytest.mark.lab, pytest.mark.kube, pytest.mark.capi]

CLUSTER = "lab"
ENDPOINT = {"host": "10.77.254.1", "port": 6443}  # the LabCluster's given endpoint (nothing listens there)
WAIT = 180.0  # CAPI's controllers on 2 shared cores, plus a bootstrap over SSH
STAND_IN_KUBEADM = "test -s /run/kubeadm/kubeadm-join-config.yaml"
MACHINE = "machine.cluster.x-k8s.io"


@pytest.fixture(scope="module")
def pool() -> Iterator[HostLab]:
    with nodes_lab("capipool") as lab:
        yield lab


@pytest.fixture(scope="module")
def machines(kubelab_capi: KubeLab, pool: HostLab) -> Iterator[LabMachines]:
    kube, namespace = kubelab_capi, unique_namespace("labprovider")
    with provider_running(kube, pool, namespace) as running:
        _cluster(kube, namespace)
        yield running
        # CAPI deletes what the Machines own; their LabMachines wait for their nodes' reset
        kube.kubectl("delete", "machinedeployments.cluster.x-k8s.io", "--all", "-n", namespace, check=False)
        kube.kubectl("delete", MACHINE, "--all", "-n", namespace, "--wait=false", check=False)
        wait_until(lambda: not co.machines(kube, namespace), WAIT, 1.0)
        kube.kubectl(
            "delete", "cluster.cluster.x-k8s.io", CLUSTER, "-n", namespace, "--wait=false", check=False
        )


def _cluster(kube: KubeLab, namespace: str) -> None:
    """A Cluster on a LabCluster; returns once CAPI's Cluster controller says its infrastructure is
    provisioned (and copied the LabCluster's endpoint)."""
    cluster = co.cluster(CLUSTER, namespace)
    cluster["spec"]["infrastructureRef"] = co.ref(crds.GROUP, "LabCluster", CLUSTER)
    lab_cluster = {
        "apiVersion": crds.API_VERSION,
        "kind": "LabCluster",
        "metadata": {"name": CLUSTER, "namespace": namespace},
        "spec": {"controlPlaneEndpoint": ENDPOINT},
    }
    objects.apply(kube, lab_cluster, cluster)

    def provisioned(c: dict[str, Any]) -> bool:
        return bool(c.get("status", {}).get("initialization", {}).get("infrastructureProvisioned") is True)

    objects.wait_for(kube, "cluster.cluster.x-k8s.io", CLUSTER, namespace, provisioned, "provisioned", WAIT)


def _machine_obj(kube: KubeLab, namespace: str, name: str) -> dict[str, Any]:
    return objects.get(kube, MACHINE, name, namespace) or {}


def _wait_machine(kube: KubeLab, namespace: str, name: str, phase: str) -> dict[str, Any]:
    def there() -> bool:
        return bool(_machine_obj(kube, namespace, name).get("status", {}).get("phase") == phase)

    if not wait_until(there, WAIT, 1.0):
        status = _machine_obj(kube, namespace, name).get("status", {})
        pytest.fail(f"Machine {name} not {phase}: {json.dumps(status)[:2000]}")
    return _machine_obj(kube, namespace, name)


def test_capi_takes_the_lab_cluster_and_a_machine_on_a_lab_machine_is_provisioned_and_deleted_with_a_reset(
    machines: LabMachines, pool: HostLab
) -> None:
    kube, namespace = machines.kube, machines.namespace
    cluster = objects.get(kube, "cluster.cluster.x-k8s.io", CLUSTER, namespace) or {}
    assert cluster["spec"]["controlPlaneEndpoint"] == ENDPOINT  # copied by CAPI from the LabCluster
    lab_cluster = objects.get(kube, f"labcluster.{crds.GROUP}", CLUSTER, namespace) or {}
    assert [r["kind"] for r in lab_cluster["metadata"]["ownerReferences"]] == ["Cluster"]  # CAPI's

    objects.apply(kube, secret("m1-bootstrap", namespace, worker_document(STAND_IN_KUBEADM), CLUSTER))
    lab_machine = {
        "apiVersion": crds.API_VERSION,
        "kind": "LabMachine",
        "metadata": {"name": "m1", "namespace": namespace},
    }
    machine = {
        "apiVersion": co.CORE_API,
        "kind": "Machine",
        "metadata": {"name": "m1", "namespace": namespace},
        "spec": {
            "clusterName": CLUSTER,
            "bootstrap": {"dataSecretName": "m1-bootstrap"},
            "infrastructureRef": co.ref(crds.GROUP, "LabMachine", "m1"),
        },
    }
    objects.apply(kube, lab_machine, machine)
    provisioned = _wait_machine(kube, namespace, "m1", "Provisioned")
    m1 = machines.get("m1")
    node = m1["status"]["nodeName"]
    # CAPI's Machine controller owns the LabMachine and bubbled up what the contract says
    assert [r["kind"] for r in m1["metadata"]["ownerReferences"]] == ["Machine"]
    assert provisioned["spec"]["providerID"] == f"lab://{node}"
    assert provisioned["status"]["initialization"]["infrastructureProvisioned"] is True
    assert provisioned["status"]["addresses"] == m1["status"]["addresses"]
    assert {a["type"] for a in provisioned["status"]["addresses"]} == {"Hostname", "InternalIP"}
    host = pool.host(node)
    assert pool.read_file(host, "/run/cluster-api/bootstrap-success.complete") == "success\n"

    kube.kubectl("delete", MACHINE, "m1", "-n", namespace, "--wait=false")
    objects.wait_gone(kube, MACHINE, "m1", namespace, WAIT)  # CAPI waited for the LabMachine to go
    assert objects.get(kube, f"labmachine.{crds.GROUP}", "m1", namespace) is None
    assert clean(pool, host)


def test_a_machine_deployment_clones_the_lab_machine_template_onto_two_nodes(
    machines: LabMachines, pool: HostLab
) -> None:
    kube, namespace = machines.kube, machines.namespace
    objects.apply(kube, secret("md-bootstrap", namespace, worker_document(STAND_IN_KUBEADM), CLUSTER))
    template = {
        "apiVersion": crds.API_VERSION,
        "kind": "LabMachineTemplate",
        "metadata": {"name": "md-lab", "namespace": namespace},
        "spec": {"template": {"spec": {}}},
    }
    deployment = co.machine_deployment("md", namespace, CLUSTER, 2, "v1.36.1", "unused", "md-lab")
    spec = deployment["spec"]["template"]["spec"]
    spec["bootstrap"] = {"dataSecretName": "md-bootstrap"}
    spec["infrastructureRef"] = co.ref(crds.GROUP, "LabMachineTemplate", "md-lab")
    objects.apply(kube, template, deployment)

    def both_provisioned() -> bool:
        found = co.machines(kube, namespace, deployment="md")
        return len(found) == 2 and all(m.get("status", {}).get("phase") == "Provisioned" for m in found)

    assert wait_until(both_provisioned, WAIT, 1.0), [
        m.get("status") for m in co.machines(kube, namespace, "md")
    ]
    nodes = {m["status"]["nodeName"] for m in machines.all() if m["metadata"]["name"].startswith("md-")}
    assert nodes == {h.name for h in pool.hosts()}  # one LabMachine per node, cloned from the template
    assert {m["spec"]["providerID"] for m in co.machines(kube, namespace, "md")} == {
        f"lab://{n}" for n in nodes
    }

    kube.kubectl(
        "patch",
        "machinedeployment.cluster.x-k8s.io",
        "md",
        "-n",
        namespace,
        "--type=merge",
        "-p",
        '{"spec":{"replicas":0}}',
    )
    assert wait_until(lambda: not co.machines(kube, namespace, "md"), WAIT, 1.0)
    assert wait_until(lambda: not machines.all(), WAIT, 1.0)
    assert all(clean(pool, h) for h in pool.hosts())


def test_the_real_cabpks_control_plane_data_is_carried_out_up_to_kubeadm_init(
    machines: LabMachines, pool: HostLab
) -> None:
    kube, namespace = machines.kube, machines.namespace
    name = "cp1"
    kubeadm_config = {
        "apiVersion": f"{co.BOOTSTRAP_GROUP}/v1beta2",
        "kind": "KubeadmConfig",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "clusterConfiguration": {"imageRepository": "registry.invalid/lab"},
            "initConfiguration": {
                "nodeRegistration": {
                    "name": "{{ ds.meta_data.local_hostname }}",
                    "kubeletExtraArgs": [
                        {"name": "provider-id", "value": "lab://{{ ds.meta_data.local_hostname }}"}
                    ],
                }
            },
            "files": [
                {
                    "path": "/etc/lab-test/plain.conf",
                    "content": "from a KubeadmConfig\n",
                    "permissions": "0600",
                }
            ],
        },
    }
    machine = {
        "apiVersion": co.CORE_API,
        "kind": "Machine",
        "metadata": {"name": name, "namespace": namespace, "labels": {co.CONTROL_PLANE_LABEL: ""}},
        "spec": {
            "clusterName": CLUSTER,
            "version": "v1.36.1",
            "bootstrap": {"configRef": co.ref(co.BOOTSTRAP_GROUP, "KubeadmConfig", name)},
            "infrastructureRef": co.ref(crds.GROUP, "LabMachine", name),
        },
    }
    lab_machine = {
        "apiVersion": crds.API_VERSION,
        "kind": "LabMachine",
        "metadata": {"name": name, "namespace": namespace},
    }
    objects.apply(kube, kubeadm_config, lab_machine, machine)
    failed = machines.wait_reason(name, "BootstrapFailed", WAIT)
    host = pool.host(failed["status"]["nodeName"])
    message = ready(failed)["message"]
    assert "kubeadm: not found" in message and "bootstrap-success.complete is missing" in message
    # what CABPK wrote is on the node as it said: the cluster CA (key 0600), the kubeadm configuration
    assert stat(pool, host, "/etc/kubernetes/pki/ca.key") == "600 root:root"
    assert stat(pool, host, "/etc/kubernetes/pki/ca.crt") == "640 root:root"
    assert stat(pool, host, "/run/kubeadm/kubeadm.yaml") == "640 root:root"
    assert stat(pool, host, "/etc/lab-test/plain.conf") == "600 root:root"
    init = pool.read_file(host, "/run/kubeadm/kubeadm.yaml")
    assert "kind: InitConfiguration" in init and "{{" not in init  # the jinja metadata rendered:
    assert f"name: '{host.name}'" in init and f"value: lab://{host.name}" in init

    kube.kubectl("delete", MACHINE, name, "-n", namespace, "--wait=false")
    objects.wait_gone(kube, MACHINE, name, namespace, WAIT)
    assert clean(pool, host)
    assert stat(pool, host, "/etc/kubernetes/pki") == "missing"
