"""CAPI objects for the capi flavour's tests (v1beta2): in-memory clusters, their machines, ExtensionConfigs.

Builders return plain dicts (apply them with :func:`kubelab.objects.apply`); readers list Machines and
their conditions. A cluster here is a ``Cluster`` on a ``DevCluster`` with CAPD's in-memory backend
(no VMs: CAPD fakes each machine's provisioning and serves a fake workload API server per cluster on
127.0.0.1:20000-30000), a KubeadmControlPlane (workers only join once the control plane is
initialised) and optionally a MachineDeployment. Shared by the rollout tests and the Kubernetes-aware
mode's tests.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from hostlab.errors import LabError

from kubelab import objects, reads
from kubelab.objects import condition

if TYPE_CHECKING:
    from kubelab.lab import Lab

Obj = dict[str, Any]
CLUSTER_GROUP = "cluster.x-k8s.io"
CORE_API = f"{CLUSTER_GROUP}/v1beta2"
INFRA_GROUP = "infrastructure.cluster.x-k8s.io"
BOOTSTRAP_GROUP = "bootstrap.cluster.x-k8s.io"
CONTROLPLANE_GROUP = "controlplane.cluster.x-k8s.io"
RUNTIME_API = "runtime.cluster.x-k8s.io/v1beta2"
CLUSTER_LABEL = "cluster.x-k8s.io/cluster-name"
DEPLOYMENT_LABEL = "cluster.x-k8s.io/deployment-name"
CONTROL_PLANE_LABEL = "cluster.x-k8s.io/control-plane"
# Fast fake provisioning: CAPD's in-memory backend waits these durations per phase of each machine
PROVISIONING = {"startupDuration": "1s", "startupJitter": "0.1"}


def _meta(name: str, namespace: str, labels: Mapping[str, str] | None = None) -> Obj:
    meta: Obj = {"name": name, "namespace": namespace}
    if labels:
        meta["labels"] = dict(labels)
    return meta


def ref(group: str, kind: str, name: str) -> Obj:
    """A v1beta2 contract-versioned reference (the version comes from the CRD's contract label)."""
    return {"apiGroup": group, "kind": kind, "name": name}


def dev_cluster(name: str, namespace: str) -> Obj:
    # CAPD v1.14.2's in-memory backend writes an annotation into the DevCluster without making the map
    # (inmemorycluster_backend.go:67) and panics on a DevCluster without annotations; ClusterClass-made
    # ones always carry some. One annotation of ours avoids the panic.
    meta = _meta(name, namespace)
    meta["annotations"] = {"kubelab.inplace-extension.io/created-by": "kubelab"}
    return {
        "apiVersion": f"{INFRA_GROUP}/v1beta2",
        "kind": "DevCluster",
        "metadata": meta,
        "spec": {"backend": {"inMemory": {}}},
    }


def cluster(name: str, namespace: str, control_plane: str | None = None) -> Obj:
    spec: Obj = {
        "clusterNetwork": {
            "services": {"cidrBlocks": ["10.128.0.0/12"]},
            "pods": {"cidrBlocks": ["192.168.0.0/16"]},
            "serviceDomain": "cluster.local",
        },
        "infrastructureRef": ref(INFRA_GROUP, "DevCluster", name),
    }
    if control_plane:
        spec["controlPlaneRef"] = ref(CONTROLPLANE_GROUP, "KubeadmControlPlane", control_plane)
    return {"apiVersion": CORE_API, "kind": "Cluster", "metadata": _meta(name, namespace), "spec": spec}


def dev_machine_template(name: str, namespace: str, extra: Mapping[str, Any] | None = None) -> Obj:
    """In-memory machines whose fake VM, node, API server and etcd each come up after ~1 s."""
    in_memory: Obj = {
        phase: {"provisioning": dict(PROVISIONING)} for phase in ("vm", "node", "apiServer", "etcd")
    }
    in_memory.update(extra or {})
    return {
        "apiVersion": f"{INFRA_GROUP}/v1beta2",
        "kind": "DevMachineTemplate",
        "metadata": _meta(name, namespace),
        "spec": {"template": {"spec": {"backend": {"inMemory": in_memory}}}},
    }


def kubeadm_config_template(name: str, namespace: str, spec: Mapping[str, Any] | None = None) -> Obj:
    """A KubeadmConfigTemplate; CAPI refuses an empty ``template.spec``, so the default is ``format``."""
    return {
        "apiVersion": f"{BOOTSTRAP_GROUP}/v1beta2",
        "kind": "KubeadmConfigTemplate",
        "metadata": _meta(name, namespace),
        "spec": {"template": {"spec": dict(spec or {"format": "cloud-config"})}},
    }


def rolling_update(max_surge: int, max_unavailable: int | None = None) -> Obj:
    numbers: Obj = {"maxSurge": max_surge}
    if max_unavailable is not None:
        numbers["maxUnavailable"] = max_unavailable
    return {"strategy": {"type": "RollingUpdate", "rollingUpdate": numbers}}


def kubeadm_control_plane(
    name: str,
    namespace: str,
    replicas: int,
    version: str,
    machine_template: str,
    config_spec: Mapping[str, Any] | None = None,
    max_surge: int = 1,
) -> Obj:
    """A KubeadmControlPlane; with ``max_surge=0`` CAPI requires at least 3 replicas."""
    return {
        "apiVersion": f"{CONTROLPLANE_GROUP}/v1beta2",
        "kind": "KubeadmControlPlane",
        "metadata": _meta(name, namespace),
        "spec": {
            "replicas": replicas,
            "version": version,
            "machineTemplate": {
                "spec": {"infrastructureRef": ref(INFRA_GROUP, "DevMachineTemplate", machine_template)}
            },
            "kubeadmConfigSpec": dict(config_spec or {"format": "cloud-config"}),
            "rollout": rolling_update(max_surge),
        },
    }


def machine_deployment(
    name: str,
    namespace: str,
    cluster_name: str,
    replicas: int,
    version: str,
    bootstrap_template: str,
    machine_template: str,
    max_surge: int = 0,
    max_unavailable: int = 1,
) -> Obj:
    return {
        "apiVersion": CORE_API,
        "kind": "MachineDeployment",
        "metadata": _meta(name, namespace),
        "spec": {
            "clusterName": cluster_name,
            "replicas": replicas,
            "selector": {"matchLabels": {DEPLOYMENT_LABEL: name}},
            "template": {
                "metadata": {"labels": {DEPLOYMENT_LABEL: name}},
                "spec": {
                    "clusterName": cluster_name,
                    "version": version,
                    "bootstrap": {
                        "configRef": ref(BOOTSTRAP_GROUP, "KubeadmConfigTemplate", bootstrap_template)
                    },
                    "infrastructureRef": ref(INFRA_GROUP, "DevMachineTemplate", machine_template),
                },
            },
            "rollout": rolling_update(max_surge, max_unavailable),
        },
    }


def extension_config(
    name: str,
    url: str,
    ca_pem: bytes,
    namespace_labels: Mapping[str, str],
    settings: Mapping[str, str] | None = None,
) -> Obj:
    """An ExtensionConfig for a Runtime Extension at ``url`` (trusted through ``ca_pem``), called only for
    clusters in namespaces carrying ``namespace_labels``."""
    spec: Obj = {
        "clientConfig": {"url": url, "caBundle": base64.b64encode(ca_pem).decode()},
        "namespaceSelector": {"matchLabels": dict(namespace_labels)},
    }
    if settings:
        spec["settings"] = dict(settings)
    return {"apiVersion": RUNTIME_API, "kind": "ExtensionConfig", "metadata": {"name": name}, "spec": spec}


def list_objects(lab: Lab, kind: str, namespace: str, selector: Mapping[str, str] | None = None) -> list[Obj]:
    """The ``kind`` objects in ``namespace`` carrying the labels ``selector``, sorted by name."""
    labels = ",".join(f"{k}={v}" for k, v in selector.items()) if selector else None
    items = reads.list_objects(lab, kind, namespace, labels)
    return sorted(items, key=lambda o: str(o["metadata"]["name"]))


def machines(
    lab: Lab, namespace: str, deployment: str | None = None, control_plane: bool = False
) -> list[Obj]:
    """The Machines of a MachineDeployment, or of the control plane, sorted by name."""
    if deployment:
        return list_objects(lab, "machines.cluster.x-k8s.io", namespace, {DEPLOYMENT_LABEL: deployment})
    if control_plane:
        return list_objects(lab, "machines.cluster.x-k8s.io", namespace, {CONTROL_PLANE_LABEL: ""})
    return list_objects(lab, "machines.cluster.x-k8s.io", namespace)


def machine_with_status(
    lab: Lab, namespace: str, name: str, addresses: Sequence[Mapping[str, str]], node: str | None
) -> Obj:
    """A bare v1beta2 Machine (no CAPI controller owns it) with ``status.addresses`` and ``status.nodeRef``
    set through the status subresource, as CAPI does: what the Kubernetes-aware mode reads."""
    objects.ensure_namespace(lab, namespace)
    objects.apply(
        lab,
        {
            "apiVersion": CORE_API,
            "kind": "Machine",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "clusterName": "c1",
                "bootstrap": {"dataSecretName": f"{name}-bootstrap"},
                "infrastructureRef": ref(INFRA_GROUP, "DockerMachine", name),
            },
        },
    )
    status: Obj = {"addresses": [dict(a) for a in addresses]}
    if node is not None:
        status["nodeRef"] = {"name": node}
    lab.kubectl(
        "patch",
        "machine.cluster.x-k8s.io",
        name,
        "-n",
        namespace,
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps({"status": status}),
    )
    machine = objects.get(lab, "machine.cluster.x-k8s.io", name, namespace)
    if machine is None:
        raise LabError(f"Machine {namespace}/{name} is gone right after it was created")
    return machine


def owned_by_template(
    lab: Lab, namespace: str, deployment: str, template: str, infrastructure: bool = False
) -> bool:
    """Every Machine of the MachineDeployment belongs to the one MachineSet whose Machines are
    bootstrapped from the KubeadmConfigTemplate ``template`` (with ``infrastructure``: made from the
    InfraMachineTemplate ``template``): CAPI moved them there (in place or by replacing them). Right after
    a template change the Machines still look UpToDate, so a test that waits for "UpToDate" alone can pass
    before CAPI even noticed the change."""
    sets = list_objects(lab, "machinesets.cluster.x-k8s.io", namespace, {DEPLOYMENT_LABEL: deployment})
    new = [
        ms["metadata"]["name"]
        for ms in sets
        if _template_ref(ms["spec"]["template"]["spec"], infrastructure)["name"] == template
    ]
    owned = machines(lab, namespace, deployment=deployment)
    return (
        len(new) == 1
        and bool(owned)
        and all(any(o["name"] == new[0] for o in m["metadata"].get("ownerReferences", [])) for m in owned)
    )


def _template_ref(machine_spec: Mapping[str, Any], infrastructure: bool) -> Mapping[str, Any]:
    ref: Mapping[str, Any] = (
        machine_spec["infrastructureRef"] if infrastructure else machine_spec["bootstrap"]["configRef"]
    )
    return ref


def condition_status(obj: Mapping[str, Any], kind: str) -> str | None:
    found = condition(obj, kind)
    return None if found is None else str(found.get("status"))


def conditions_text(objs: Sequence[Mapping[str, Any]]) -> str:
    """Every object's conditions, one line each: for assertion messages."""
    lines = []
    for obj in objs:
        for cond in obj.get("status", {}).get("conditions", []):
            lines.append(
                f"{obj['metadata']['name']}: {cond.get('type')}={cond.get('status')} "
                f"{cond.get('reason', '')}: {cond.get('message', '')}"
            )
    return "\n".join(lines)


def running(machine: Mapping[str, Any]) -> bool:
    """The Machine is provisioned and its (fake) node is known: phase Running with a nodeRef."""
    status = machine.get("status", {})
    return status.get("phase") == "Running" and bool(status.get("nodeRef"))
