"""One in-memory CAPI cluster for the rollout tests, and the waits and reads they share.

A cluster: DevCluster + Cluster + KubeadmControlPlane (CAPI only lets workers join an initialised
control plane) + optionally a MachineDeployment (maxSurge 0 / maxUnavailable 1), in a namespace that
carries our ExtensionConfig's label. CAPD's in-memory backend "provisions" each DevMachine after ~1 s
per phase (no VM); the Machines' operating systems are the hostlab hosts their names are mapped to
through the service's inventory (:meth:`Extension.map_machines`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kubelab import objects
from kubelab.flavours import capi_objects as co
from kubelab.lab import Lab

from .conftest import Extension

MACHINES = "machines.cluster.x-k8s.io"
MD = "machinedeployments.cluster.x-k8s.io"
KCP = "kubeadmcontrolplanes.controlplane.cluster.x-k8s.io"
PROVISION_TIMEOUT = 180.0
# what KCP's preflight checks require before it touches a control plane Machine (preflight.go)
CP_MACHINE_HEALTH_CONDITIONS = (
    "APIServerPodHealthy",
    "ControllerManagerPodHealthy",
    "SchedulerPodHealthy",
    "EtcdPodHealthy",
    "EtcdMemberHealthy",
)
KCP_HEALTH_CONDITIONS = ("EtcdClusterHealthy", "ControlPlaneComponentsHealthy")
ROLLOUT_TIMEOUT = 240.0
HOST_FILE = "/etc/capi-lab/in-place.conf"  # what the rollouts write on the hosts
# all CAPI v1.14 shows in a Machine's Updating condition when UpdateMachine answers a Failure (ours is
# in the service's log, its metrics and, in the Kubernetes-aware mode, the Machine's Failed Event)
CAPI_FAILURE = "UpdateMachine hook failed: please check controller logs for errors"
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGV4YW1wbGUta2V5LWZvci1lMmUtdGVzdHMtb25seQ capi@test"


@dataclass
class Cluster:
    ext: Extension
    namespace: str
    name: str
    version: str
    template_generation: int = 1

    @property
    def lab(self) -> Lab:
        return self.ext.kube

    @property
    def md(self) -> str:
        return f"{self.name}-md-0"

    @property
    def kcp(self) -> str:
        return f"{self.name}-cp"

    def md_machines(self) -> list[dict[str, Any]]:
        return co.machines(self.lab, self.namespace, deployment=self.md)

    def cp_machines(self) -> list[dict[str, Any]]:
        return co.machines(self.lab, self.namespace, control_plane=True)

    def identities(self, machines: list[dict[str, Any]]) -> dict[str, str]:
        return {m["metadata"]["name"]: m["metadata"]["uid"] for m in machines}

    def new_bootstrap_template(self, spec: Mapping[str, Any]) -> str:
        """A new KubeadmConfigTemplate, and the MachineDeployment switched to it (templates are immutable)."""
        self.template_generation += 1
        name = f"{self.md}-{self.template_generation}"
        objects.apply(self.lab, co.kubeadm_config_template(name, self.namespace, spec))
        self.patch(
            MD, self.md, {"spec": {"template": {"spec": {"bootstrap": {"configRef": {"name": name}}}}}}
        )
        return name

    def patch(self, kind: str, name: str, body: Mapping[str, Any]) -> None:
        self.lab.kubectl("patch", kind, name, "-n", self.namespace, "--type=merge", "-p", json.dumps(body))

    def annotate(self, kind: str, name: str, key: str, value: str) -> None:
        self.lab.kubectl("annotate", kind, name, "-n", self.namespace, f"{key}={value}", "--overwrite")

    def deployment(self) -> dict[str, Any]:
        found = objects.get(self.lab, MD, self.md, self.namespace)
        assert found is not None
        return found


def create_cluster(
    ext: Extension, prefix: str, version: str, md_replicas: int = 3, cp_replicas: int = 1
) -> Cluster:
    """Create the cluster and wait until every Machine is Running with a (fake) node."""
    namespace = ext.namespace(prefix)
    cluster = Cluster(ext, namespace, prefix, version)
    lab = ext.kube
    kcp = co.kubeadm_control_plane(
        cluster.kcp, namespace, cp_replicas, version, cluster.kcp, max_surge=0 if cp_replicas >= 3 else 1
    )
    docs = [
        co.dev_cluster(prefix, namespace),
        co.cluster(prefix, namespace, control_plane=cluster.kcp),
        co.dev_machine_template(cluster.kcp, namespace),
        kcp,
    ]
    if md_replicas:
        docs += [
            co.dev_machine_template(cluster.md, namespace),
            co.kubeadm_config_template(f"{cluster.md}-1", namespace),
            co.machine_deployment(
                cluster.md, namespace, prefix, md_replicas, version, f"{cluster.md}-1", cluster.md
            ),
        ]
    objects.apply(lab, *docs)
    wait(
        lambda: _all_running(co.machines(lab, namespace), cp_replicas + md_replicas),
        PROVISION_TIMEOUT,
        f"{cp_replicas + md_replicas} Machines Running in {namespace}",
        lambda: co.conditions_text(co.machines(lab, namespace)),
    )
    if cp_replicas:
        # KCP's preflight checks read these: a rollout that starts while the newest control plane
        # Machine's components are not healthy yet makes KCP scale that Machine down and replace it
        # (scale.go selectMachineForInPlaceUpdateOrScaleDown prefers unhealthy Machines) instead of
        # asking our hooks, so an in-place test must start from a stable control plane.
        wait(
            lambda: _control_plane_stable(cluster),
            PROVISION_TIMEOUT,
            f"control plane {cluster.kcp} stable (KCP preflight checks would pass)",
            lambda: co.conditions_text([*cluster.cp_machines(), *co.list_objects(lab, KCP, namespace)]),
        )
    return cluster


def _control_plane_stable(cluster: Cluster) -> bool:
    machines = cluster.cp_machines()
    kcps = co.list_objects(cluster.lab, KCP, cluster.namespace)
    return (
        len(kcps) == 1
        and all(co.condition_status(kcps[0], c) == "True" for c in KCP_HEALTH_CONDITIONS)
        and all(co.condition_status(m, c) == "True" for m in machines for c in CP_MACHINE_HEALTH_CONDITIONS)
    )


def _all_running(machines: list[dict[str, Any]], count: int) -> bool:
    return len(machines) == count and all(co.running(m) for m in machines)


def wait(
    holds: Callable[[], bool], timeout: float, what: str, explain: Callable[[], str] = lambda: ""
) -> None:
    """Poll ``holds`` until it is true; else fail saying what did not happen and the objects' state."""
    deadline = time.monotonic() + timeout
    while not holds():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:g}s: {what}\n{explain()}")
        time.sleep(1.0)


def updated_in_place(machines: list[dict[str, Any]], count: int) -> bool:
    """Every Machine UpToDate and none Updating (CAPI's own conditions)."""
    return len(machines) == count and all(
        co.condition_status(m, "UpToDate") == "True" and co.condition_status(m, "Updating") != "True"
        for m in machines
    )


def owned_by_template(cluster: Cluster, template: str) -> bool:
    """Every Machine of the MachineDeployment belongs to the MachineSet of ``template``."""
    return co.owned_by_template(cluster.lab, cluster.namespace, cluster.md, template)


def files_and_user(marker: str, *users: str) -> dict[str, object]:
    """A KubeadmConfigTemplate spec with our file (content ``marker``) and ``users``. Our users capability
    never deletes users, so a template that drops a user of the previous one is a rollout, not in place."""
    return {
        "format": "cloud-config",
        "files": [{"path": HOST_FILE, "content": f"{marker}\n", "owner": "root:root", "permissions": "0644"}],
        "users": [{"name": user, "shell": "/bin/bash", "sshAuthorizedKeys": [KEY]} for user in users],
    }


def rolled_out(cluster: Cluster, template: str) -> bool:
    status = cluster.deployment().get("status", {})
    return (
        owned_by_template(cluster, template)
        and updated_in_place(cluster.md_machines(), 3)
        and status.get("upToDateReplicas") == 3
    )


def updating(cluster: Cluster) -> list[str]:
    return [
        m["metadata"]["name"] for m in cluster.md_machines() if co.condition_status(m, "Updating") == "True"
    ]
