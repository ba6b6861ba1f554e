"""The real CAPA controller in the CAPI lab, its AWS played by moto: what ``test_capi_capa.py`` needs.

Real: CAPI v1.14.2's controllers (the capi flavour), CAPA v2.8.4's own AWSMachine controller and its
AWSMachine/AWSMachineTemplate/AWSCluster webhooks (kubelab's ``capa-lab-manager``: a main of the lab's
own around CAPA's packages), our service in the Kubernetes-aware mode registered through an
ExtensionConfig. Stand-ins, named as such:

- **AWS** is moto's server (``moto_server``, a process on 127.0.0.1 at a free port, stopped by its PID),
  with moto's dummy credentials. CAPA's EC2 calls go there through capa-lab-manager's ``--aws-stand-in``
  (its HTTP transport sends every ``*.amazonaws.com`` request to moto): CAPA v2.8.4's AWSMachine
  controller does not pass its ``--service-endpoints`` on to an AWSCluster's scope.
- **The AWSCluster's manager**: the AWSCluster carries ``cluster.x-k8s.io/managed-by`` (CAPA's AWSCluster
  controller leaves it alone, so the manager does not run it) and the test sets its status ready with
  the VPC, subnet and node security group it made in moto, as an external manager would.
- **The workload cluster** is the kubelab's own API server (the Cluster's kubeconfig Secret points CAPI
  there), and each instance's **Node** is a kwok Node the test creates with the instance's providerID:
  moto's instances run no kubelet.
- **The control plane** is a ``LabControlPlane`` of the lab's own kind, initialised and externally
  managed (the kubelab's API server plays it): CAPI reads Nodes and CABPK makes join data only once a
  cluster's control plane is initialised. CABPK's user data goes to EC2 as is
  (``insecureSkipSecretsManager``); moto's instances never run it.

CAPA's CRDs come from the pinned module (``config/crd/bases``) with the contract label of its
kustomization (``cluster.x-k8s.io/v1beta1: v1beta1_v1beta2``; CAPI v1.14 still serves that contract)
and no conversion webhook: only v1beta2 objects are made, and CAPI reads that version (the label's
latest).
"""

from __future__ import annotations

import base64
import copy
import json
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from kubelab import build, manifests, objects
from kubelab.flavours import capi_objects as co
from kubelab.flavours.capi_webhooks import prepared_webhook_configurations
from kubelab.lab import Lab

from .rollout import wait

REGION = "us-east-1"
ZONE = "us-east-1a"
MANAGER = "capa-lab-manager"  # the kubelab binary and the lab component's name
# moto's dummy credentials: boto3 and CAPA's SDK sign with them, moto accepts anything
AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_REGION": REGION,
    "AWS_EC2_METADATA_DISABLED": "true",  # no instance metadata lookups from a lab machine
}
CRDS = (
    "infrastructure.cluster.x-k8s.io_awsclusters.yaml",
    "infrastructure.cluster.x-k8s.io_awsmachines.yaml",
    "infrastructure.cluster.x-k8s.io_awsmachinetemplates.yaml",
    "infrastructure.cluster.x-k8s.io_awsclustercontrolleridentities.yaml",
)
# the webhooks capa-lab-manager serves (CAPA's config names many more kinds; only these are registered)
WEBHOOK_KINDS = ("awscluster", "awsmachine", "awsmachinetemplate")
WEBHOOK_CONFIGS = ("mutating-webhook-configuration-capa", "validating-webhook-configuration-capa")
AWS_MACHINES = "awsmachines.infrastructure.cluster.x-k8s.io"
AWS_CLUSTERS = "awsclusters.infrastructure.cluster.x-k8s.io"


def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def capa_config(lab: Lab) -> Path:
    """CAPA's ``config/`` directory as kubelab's ``capa`` wrapper module pins it."""
    return build.module_source(lab.cfg, "capa", "sigs.k8s.io/cluster-api-provider-aws/v2") / "config"


def install_crds(lab: Lab, config: Path, work: Path) -> None:
    """CAPA's CRDs of :data:`CRDS` with its kustomization's contract labels (``commonLabels``)."""
    kustomization = yaml.safe_load((config / "crd" / "kustomization.yaml").read_text())
    labels = {str(k): str(v) for k, v in (kustomization.get("commonLabels") or {}).items()}
    files = []
    for name in CRDS:
        (crd,) = _docs(config / "crd" / "bases" / name)
        crd["metadata"]["labels"] = {**(crd["metadata"].get("labels") or {}), **labels}
        path = work / f"crd-{crd['metadata']['name']}.json"
        path.write_text(json.dumps(crd))
        files.append(path)
    manifests.install_crds(lab, files)


def webhook_configurations(config: Path, port: int, ca_pem: bytes) -> list[dict[str, Any]]:
    """CAPA's admission webhooks of :data:`WEBHOOK_KINDS` only, pointed at capa-lab-manager's port."""
    suffixes = tuple(f"-v1beta2-{kind}" for kind in WEBHOOK_KINDS)
    configs = []
    for doc in prepared_webhook_configurations(config, "capa", port, ca_pem):
        kept = copy.deepcopy(doc)
        kept["webhooks"] = [w for w in doc["webhooks"] if w["clientConfig"]["url"].endswith(suffixes)]
        configs.append(kept)
    return configs


@dataclass
class Capa:
    """CAPA's manager running against the lab and moto."""

    lab: Lab
    moto: str

    def log(self) -> str:
        return (self.lab.dir / f"{MANAGER}.log").read_text(errors="replace")


@contextmanager
def running_capa(lab: Lab, moto: str, work: Path) -> Iterator[Capa]:
    """CAPA's CRDs and webhooks installed, its manager started (EC2 at ``moto``) until the block ends;
    then the manager is stopped by PID and the webhook configurations are removed."""
    config = capa_config(lab)
    install_crds(lab, config, work)
    port, health = lab.free_port(), lab.free_port()
    cert = lab.pki.issue_server(f"{MANAGER}-webhook")
    hooks = work / "capa-webhooks.json"
    items = webhook_configurations(config, port, lab.ca.read_bytes())
    hooks.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
    # controller-runtime reads tls.crt and tls.key from its cert dir: a directory of its own with those
    certs = work / "capa-certs"
    certs.mkdir(exist_ok=True)
    (certs / "tls.crt").write_bytes(cert.cert.read_bytes())
    (certs / "tls.key").write_bytes(cert.key.read_bytes())
    argv = [
        str(lab.binary(MANAGER)),
        f"--kubeconfig={lab.kubeconfig}",
        f"--service-endpoints={REGION}:ec2={moto}",  # CAPA's own flag; v2.8.4 drops it on this path:
        f"--aws-stand-in={moto}",  # every *.amazonaws.com request to moto (capa-lab-manager's main.go)
        f"--webhook-port={port}",
        f"--webhook-cert-dir={certs}",
        f"--health-addr=127.0.0.1:{health}",
    ]
    # the lab starts components with this process's environment under ``env``: blank its own AWS settings
    # (a CA bundle, a profile) so only moto's apply
    env = {k: "" for k in os.environ if k.startswith("AWS_")} | AWS_ENV
    try:
        lab.start_component(MANAGER, argv, env=env, ready=f"http://127.0.0.1:{health}/readyz")
        lab.kubectl("apply", "--server-side", "--field-manager=kubelab", "-f", str(hooks))
        yield Capa(lab, moto)
    finally:
        lab.kubectl("delete", "--ignore-not-found", "-f", str(hooks), check=False)
        lab.remove_component(MANAGER)


@dataclass(frozen=True)
class Network:
    """What the stand-in AWSCluster manager made in moto."""

    vpc: str
    subnet: str
    security_group: str
    ami: str


def make_network(ec2: Any) -> Network:
    vpc = ec2.create_vpc(CidrBlock="10.20.0.0/16")["Vpc"]["VpcId"]
    # DNS host names and a public address on launch, as in a VPC CAPA would make: without them moto's
    # instances report empty DNS names and an empty public address, which CAPA passes on as Machine
    # addresses and CAPI v1.14 refuses ("status.addresses[0].address: Required value")
    ec2.modify_vpc_attribute(VpcId=vpc, EnableDnsHostnames={"Value": True})
    created = ec2.create_subnet(VpcId=vpc, CidrBlock="10.20.1.0/24", AvailabilityZone=ZONE)
    subnet = created["Subnet"]["SubnetId"]
    ec2.modify_subnet_attribute(SubnetId=subnet, MapPublicIpOnLaunch={"Value": True})
    group = ec2.create_security_group(GroupName="nodes", Description="lab nodes", VpcId=vpc)["GroupId"]
    ami = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]  # one of moto's built-in images
    return Network(vpc, subnet, group, ami)


def kubeconfig_secret(lab: Lab, cluster: str, namespace: str) -> dict[str, Any]:
    """The Cluster's kubeconfig Secret, pointing at the kubelab's own API server (the workload-cluster
    stand-in), certificates embedded."""
    config = yaml.safe_load(lab.kubeconfig.read_text())
    cluster_entry, user = config["clusters"][0]["cluster"], config["users"][0]["user"]
    embedded = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": cluster,
                "cluster": {
                    "server": cluster_entry["server"],
                    "certificate-authority-data": _b64(Path(cluster_entry["certificate-authority"])),
                },
            }
        ],
        "users": [
            {
                "name": "admin",
                "user": {
                    "client-certificate-data": _b64(Path(user["client-certificate"])),
                    "client-key-data": _b64(Path(user["client-key"])),
                },
            }
        ],
        "contexts": [{"name": cluster, "context": {"cluster": cluster, "user": "admin"}}],
        "current-context": cluster,
    }
    value = base64.b64encode(yaml.safe_dump(embedded).encode()).decode()
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "cluster.x-k8s.io/secret",
        "metadata": {
            "name": f"{cluster}-kubeconfig",
            "namespace": namespace,
            "labels": {co.CLUSTER_LABEL: cluster},
        },
        "data": {"value": value},
    }


def _b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def aws_cluster(name: str, namespace: str, server: str, network: Network) -> dict[str, Any]:
    host, _, port = server.removeprefix("https://").rpartition(":")
    return {
        "apiVersion": f"{co.INFRA_GROUP}/v1beta2",
        "kind": "AWSCluster",
        "metadata": {
            "name": name,
            "namespace": namespace,
            # CAPA's AWSCluster controller leaves it to an external manager: the test plays that part
            "annotations": {"cluster.x-k8s.io/managed-by": "inplace-extension-tests"},
        },
        "spec": {
            "region": REGION,
            "controlPlaneEndpoint": {"host": host, "port": int(port)},
            "network": {
                "vpc": {"id": network.vpc},
                "subnets": [{"id": network.subnet, "availabilityZone": ZONE, "isPublic": False}],
            },
        },
    }


def aws_cluster_ready(network: Network) -> dict[str, Any]:
    """The status an external manager sets: ready, with the node security group CAPA attaches."""
    return {
        "ready": True,
        "networkStatus": {"securityGroups": {"node": {"id": network.security_group, "name": "nodes"}}},
    }


def aws_machine_template(
    name: str, namespace: str, network: Network, tags: Mapping[str, str], instance_type: str
) -> dict[str, Any]:
    return {
        "apiVersion": f"{co.INFRA_GROUP}/v1beta2",
        "kind": "AWSMachineTemplate",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "template": {
                "spec": {
                    "instanceType": instance_type,
                    "ami": {"id": network.ami},
                    "sshKeyName": "",  # no key pair: moto refuses one it does not know
                    "cloudInit": {"insecureSkipSecretsManager": True},
                    "additionalTags": dict(tags),
                }
            }
        },
    }


def machine_deployment(
    name: str, namespace: str, cluster: str, replicas: int, version: str, template: str, bootstrap: str
) -> dict[str, Any]:
    """A MachineDeployment on AWSMachineTemplate ``template`` bootstrapped by CABPK from the
    KubeadmConfigTemplate ``bootstrap`` (maxSurge 0, maxUnavailable 1). Not a bootstrap Secret of the
    test's own: CAPI v1.14.2 marks a Machine's bootstrap data created only through a bootstrap config
    (``reconcileBootstrap`` returns before it without ``configRef``), and its in-place update waits for
    that mark."""
    md = co.machine_deployment(name, namespace, cluster, replicas, version, bootstrap, template)
    spec = md["spec"]["template"]["spec"]
    spec["infrastructureRef"] = co.ref(co.INFRA_GROUP, "AWSMachineTemplate", template)
    return md


def cluster_ca_secret(lab: Lab, cluster: str, namespace: str) -> dict[str, Any]:
    """The Cluster's CA Secret with the kubelab CA (a throwaway CA of this lab), which CABPK reads for the
    join configuration; it refuses a CA Secret without the key ("ca: missing key data")."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "cluster.x-k8s.io/secret",
        "metadata": {"name": f"{cluster}-ca", "namespace": namespace, "labels": {co.CLUSTER_LABEL: cluster}},
        "data": {"tls.crt": _b64(lab.ca), "tls.key": _b64(lab.ca.with_name("ca.key"))},
    }


CONTROL_PLANE_GROUP = "controlplane.lab.inplace-extension.io"


def control_plane_stand_in(lab: Lab, name: str, namespace: str) -> dict[str, Any]:
    """A control plane object of the lab's own kind (``LabControlPlane``, CAPI's v1beta2 contract label),
    initialised and externally managed: the stand-in of the control plane the kubelab's API server plays.
    CAPI reads a workload cluster's Nodes only once its control plane is initialised, and a cluster of
    AWS workers alone has none. Its status is set by the caller once it exists."""
    crd = objects.define_kind(lab, CONTROL_PLANE_GROUP, "LabControlPlane", "labcontrolplanes")
    lab.kubectl("label", "crd", crd, "cluster.x-k8s.io/v1beta2=v1", "--overwrite")
    return {
        "apiVersion": f"{CONTROL_PLANE_GROUP}/v1",
        "kind": "LabControlPlane",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {},
    }


CONTROL_PLANE_READY = {
    "initialization": {"controlPlaneInitialized": True},
    "externalManagedControlPlane": True,
}


def instance_id(provider_id: str) -> str:
    """``aws:///us-east-1a/i-0123`` -> ``i-0123``."""
    return provider_id.rpartition("/")[2]


def nodes_for_instances(lab: Lab, namespace: str, deployment: str, version: str) -> dict[str, str]:
    """A kwok Node (the stand-in of the instance's kubelet) for each Machine whose AWSMachine has a
    providerID, named after the instance, with that providerID; returns Machine name -> instance id."""
    found = {}
    for machine in co.machines(lab, namespace, deployment=deployment):
        infra = machine["spec"]["infrastructureRef"]["name"]
        aws = objects.get(lab, AWS_MACHINES, infra, namespace) or {}
        provider_id = aws.get("spec", {}).get("providerID")
        if not provider_id:
            continue
        instance = instance_id(provider_id)
        found[machine["metadata"]["name"]] = instance
        if objects.get(lab, "node", instance) is None:
            objects.create_kwok_node(lab, instance, wait_ready=False)
            patch = {"spec": {"providerID": provider_id}}
            lab.kubectl("patch", "node", instance, "--type=merge", "-p", json.dumps(patch))
            # CAPI compares the kubelet's version with the Machine's (UpToDate); kwok reports its own
            status = {"status": {"nodeInfo": {"kubeletVersion": version}}}
            lab.kubectl(
                "patch", "node", instance, "--subresource=status", "--type=merge", "-p", json.dumps(status)
            )
    return found


def wait_running(
    lab: Lab, namespace: str, deployment: str, replicas: int, version: str, timeout: float
) -> dict[str, str]:
    """Until the MachineDeployment has ``replicas`` Machines Running with a nodeRef, creating each
    instance's Node as CAPA reports the instance; returns Machine name -> instance id."""
    seen: dict[str, str] = {}

    def running() -> bool:
        seen.clear()
        seen.update(nodes_for_instances(lab, namespace, deployment, version))
        machines = co.machines(lab, namespace, deployment=deployment)
        return len(machines) == replicas and all(co.running(m) for m in machines)

    wait(
        running,
        timeout,
        f"{replicas} Machines Running in {namespace}",
        lambda: co.conditions_text(co.machines(lab, namespace)),
    )
    return dict(seen)
