"""Issue #28 item 3: an AWSMachineTemplate ``additionalTags`` change updated in place by the real CAPA
controller, with the real CAPI v1.14.2 and our service in the Kubernetes-aware mode; an
``instanceType`` change rolled out by replacement. What is real and what stands in: ``capa.py``.

Issue 39 item 4: the tags-only change needs nothing on the host. The Machines' Nodes report the
Machines' version already, so UpdateMachine's one host step (the Kubernetes version it plans whenever a
Machine carries one) has nothing to do: the service has no inventory entry for any Machine (an empty
inventory), runs no play and opens no SSH connection, and answers done once CAPA's record holds the tags.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import pytest
import yaml
from aws.moto import moto_server
from e2e.conftest import START_VERSION
from hostlab.lab import Lab as HostLab
from kubelab import objects
from kubelab.flavours import capi_objects as co
from kubelab.lab import Lab

from . import capa
from .conftest import unique_namespace
from .kube_aware import KubeExtension, run_attempts, serving
from .rollout import wait

pytestmark = [pytest.mark.lab, pytest.mark.kube, pytest.mark.capi]

EXTENSION = "inplace-extension-capa"
SELECTOR = {"inplace-extension.io/capi-capa": "yes"}
CLUSTER = "capa"
MD = f"{CLUSTER}-md-0"
BOOTSTRAP = f"{MD}-bootstrap"  # the KubeadmConfigTemplate
TAGS = {"team": "blue"}
FOREIGN = ("set-by", "someone-else")  # a tag put on the instances outside the template: CAPA keeps it
LAUNCH = 300.0  # CAPA's first reconcile of each AWSMachine, RunInstances in moto, the Nodes, nodeRef
ROLLOUT = 300.0


@dataclass
class Setup:
    kube: Lab
    ec2: Any
    network: capa.Network
    namespace: str
    service: KubeExtension
    capa: capa.Capa

    def machines(self) -> list[dict[str, Any]]:
        return co.machines(self.kube, self.namespace, deployment=MD)

    def explain(self) -> str:
        return (
            co.conditions_text(self.machines())
            + f"\nservice log (end):\n{self.service.log()[-3000:]}"
            + f"\ncapa log (end):\n{self.capa.log()[-3000:]}"
        )

    def use_template(self, name: str, tags: dict[str, str], instance_type: str) -> None:
        objects.apply(
            self.kube, capa.aws_machine_template(name, self.namespace, self.network, tags, instance_type)
        )
        body = {"spec": {"template": {"spec": {"infrastructureRef": {"name": name}}}}}
        self.kube.kubectl(
            "patch",
            "machinedeployments.cluster.x-k8s.io",
            MD,
            "-n",
            self.namespace,
            "--type=merge",
            "-p",
            json.dumps(body),
        )

    def owned_by(self, template: str) -> bool:
        """Every Machine belongs to the one MachineSet whose Machines use the AWSMachineTemplate
        ``template`` and is UpToDate."""
        sets = co.list_objects(
            self.kube, "machinesets.cluster.x-k8s.io", self.namespace, {co.DEPLOYMENT_LABEL: MD}
        )
        new = [
            s["metadata"]["name"]
            for s in sets
            if s["spec"]["template"]["spec"]["infrastructureRef"]["name"] == template
        ]
        machines = self.machines()
        return (
            len(new) == 1
            and bool(machines)
            and all(
                any(o["name"] == new[0] for o in m["metadata"].get("ownerReferences", [])) for m in machines
            )
            and all(
                co.condition_status(m, "UpToDate") == "True" and co.condition_status(m, "Updating") != "True"
                for m in machines
            )
        )

    def instance_tags(self, instance: str) -> dict[str, str]:
        found = self.ec2.describe_tags(Filters=[{"Name": "resource-id", "Values": [instance]}])["Tags"]
        return {t["Key"]: t["Value"] for t in found}

    def volumes(self, instance: str) -> list[str]:
        reservations = self.ec2.describe_instances(InstanceIds=[instance])["Reservations"]
        (found,) = [i for r in reservations for i in r["Instances"]]
        return [m["Ebs"]["VolumeId"] for m in found.get("BlockDeviceMappings", [])]


@pytest.fixture
def setup(
    kubelab_capi: Lab,
    lab: HostLab,
    e2e_capabilities: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Setup]:
    kube = kubelab_capi
    work = tmp_path_factory.mktemp("capi-capa")
    with moto_server(work / "moto.log") as server, capa.running_capa(kube, server.url, work) as manager:
        ec2 = boto3.client(
            "ec2",
            endpoint_url=server.url,
            region_name=capa.REGION,
            aws_access_key_id=capa.AWS_ENV["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=capa.AWS_ENV["AWS_SECRET_ACCESS_KEY"],
        )
        network = capa.make_network(ec2)
        # the service in the Kubernetes-aware mode, with an empty inventory: no Machine is mapped to a host
        # (a tags-only change runs nothing on one: the module docstring)
        with serving(kube, lab, EXTENSION, SELECTOR, e2e_capabilities, work / "service.log") as ext:
            namespace = unique_namespace("capa")
            objects.apply(
                kube,
                {
                    "apiVersion": "v1",
                    "kind": "Namespace",
                    "metadata": {"name": namespace, "labels": SELECTOR},
                },
            )
            yield Setup(kube, ec2, network, namespace, ext, manager)
            # CAPA terminates the instances and drops its finalizers while it still runs
            kube.kubectl(
                "delete", "clusters.cluster.x-k8s.io", CLUSTER, "-n", namespace, "--wait=true",
                "--timeout=180s", check=False,
            )  # fmt: skip
            # the instances' kwok Nodes (cluster-wide, named after the instances): the lab is shared
            nodes = json.loads(kube.kubectl("get", "nodes", "-o", "json").stdout)["items"]
            for node in nodes:
                if node.get("spec", {}).get("providerID", "").startswith("aws:///"):
                    kube.kubectl(
                        "delete", "node", node["metadata"]["name"], "--ignore-not-found", check=False
                    )


def create_cluster(s: Setup) -> dict[str, str]:
    """The externally managed AWSCluster (status set ready by the test), the control-plane stand-in, the
    Cluster, its CA Secret, a KubeadmConfigTemplate, a MachineDeployment of 2 on the first
    AWSMachineTemplate; returns Machine name -> instance id once both Machines run."""
    kube, ns = s.kube, s.namespace
    objects.apply(
        kube,
        {
            "apiVersion": f"{co.INFRA_GROUP}/v1beta2",
            "kind": "AWSClusterControllerIdentity",
            "metadata": {"name": "default"},
            "spec": {"allowedNamespaces": {}},
        },
        capa.kubeconfig_secret(kube, CLUSTER, ns),
        capa.aws_cluster(CLUSTER, ns, kube.server, s.network),
    )
    objects.set_status(kube, capa.AWS_CLUSTERS, CLUSTER, ns, capa.aws_cluster_ready(s.network))
    control_plane = capa.control_plane_stand_in(kube, f"{CLUSTER}-cp", ns)
    objects.apply(kube, control_plane)
    objects.set_status(
        kube, "labcontrolplanes." + capa.CONTROL_PLANE_GROUP, f"{CLUSTER}-cp", ns, capa.CONTROL_PLANE_READY
    )
    cluster = co.cluster(CLUSTER, ns)
    cluster["spec"]["infrastructureRef"] = co.ref(co.INFRA_GROUP, "AWSCluster", CLUSTER)
    cluster["spec"]["controlPlaneRef"] = co.ref(capa.CONTROL_PLANE_GROUP, "LabControlPlane", f"{CLUSTER}-cp")
    objects.apply(
        kube,
        cluster,
        capa.cluster_ca_secret(kube, CLUSTER, ns),
        co.kubeadm_config_template(BOOTSTRAP, ns),
        capa.aws_machine_template(f"{MD}-1", ns, s.network, TAGS, "t3.small"),
        capa.machine_deployment(MD, ns, CLUSTER, 2, START_VERSION, f"{MD}-1", BOOTSTRAP),
    )
    return capa.wait_running(kube, ns, MD, 2, START_VERSION, LAUNCH)


def test_an_additional_tags_change_is_applied_by_capa_in_place_and_an_instance_type_change_replaces(
    setup: Setup,
) -> None:
    s = setup
    instances = create_cluster(s)
    uids = {m["metadata"]["name"]: m["metadata"]["uid"] for m in s.machines()}
    for instance in instances.values():
        assert s.instance_tags(instance)["team"] == "blue", s.instance_tags(instance)
        s.ec2.create_tags(Resources=[instance], Tags=[{"Key": FOREIGN[0], "Value": FOREIGN[1]}])

    # only additionalTags: CAPI asks us, we claim it, CAPA applies it to the running instances
    s.use_template(f"{MD}-2", {"team": "green", "cost-center": "42"}, "t3.small")
    wait(lambda: s.owned_by(f"{MD}-2"), ROLLOUT, "both Machines updated in place", s.explain)
    assert {m["metadata"]["name"]: m["metadata"]["uid"] for m in s.machines()} == uids, "same Machines"
    for machine, instance in instances.items():
        tags = s.instance_tags(instance)
        assert tags["team"] == "green" and tags["cost-center"] == "42", (machine, tags)
        assert tags[FOREIGN[0]] == FOREIGN[1], f"{machine}: the tag set outside the template is kept: {tags}"
        for volume in s.volumes(instance):
            volume_tags = s.instance_tags(volume)
            assert volume_tags.get("team") == "green" and volume_tags.get("cost-center") == "42", (
                machine,
                volume,
                volume_tags,
            )
    log = s.service.log()
    assert re.search(r"hook=CanUpdateMachineSet .* decision=in-place", log), log[-3000:]
    assert yaml.safe_load(s.service.inventory.read_text()) == {"hosts": []}, "no inventory entry"
    for machine in instances:
        # UpdateMachine answered done once CAPA's annotation held the tags; its host step, the Kubernetes
        # version it plans from the desired Machine, is what the Node reports already: no play, no SSH
        assert re.search(rf"hook=UpdateMachine machine={s.namespace}/{machine} .*decision=done", log), log[
            -3000:
        ]
        assert run_attempts(s.service, f"{s.namespace}/{machine}") == [], "no play ran for it"
        # the executor's own lines (queued, started, the outcome), not the hook's line that names the run
        assert not re.search(rf"machine={s.namespace}/{machine} run=\S+ state=", log), "no run of it began"

    # instanceType: no capability changes it in place: CAPI replaces the Machines
    s.use_template(f"{MD}-3", {"team": "green", "cost-center": "42"}, "t3.medium")

    def replaced() -> bool:
        capa.nodes_for_instances(s.kube, s.namespace, MD, START_VERSION)  # the new instances' Nodes
        machines = s.machines()
        return (
            s.owned_by(f"{MD}-3")
            and len(machines) == 2
            and not {m["metadata"]["uid"] for m in machines} & set(uids.values())
            and all(co.running(m) for m in machines)
        )

    wait(replaced, ROLLOUT + LAUNCH, "both Machines replaced", s.explain)
    new = capa.nodes_for_instances(s.kube, s.namespace, MD, START_VERSION)
    assert not set(new.values()) & set(instances.values()), "new instances"
    for instance in new.values():
        reservations = s.ec2.describe_instances(InstanceIds=[instance])["Reservations"]
        (found,) = [i for r in reservations for i in r["Instances"]]
        assert found["InstanceType"] == "t3.medium"
    for instance in instances.values():
        reservations = s.ec2.describe_instances(InstanceIds=[instance])["Reservations"]
        (found,) = [i for r in reservations for i in r["Instances"]]
        assert found["State"]["Name"] == "terminated", (instance, found["State"])
    assert re.search(r"hook=CanUpdateMachineSet .* decision=rollout", s.service.log()[len(log) :])
