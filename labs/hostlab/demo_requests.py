"""The objects the demo's Cluster API would send: a MachineSet pair and the UpdateMachine requests.

The new KubeadmConfigTemplate adds a file (``kubeadm_files``) and a user with an SSH key (``users``);
every live KubeadmConfig carries a bootstrap token as CABPK stores it, which the service must never
echo or log.
"""

from __future__ import annotations

from typing import Any

NAMESPACE = "demo"
CLUSTER = "demo"
DEPLOYMENT = "demo-md-0"
OLD_SET, NEW_SET = "demo-md-0-6d9f7c8b5x", "demo-md-0-8b4c6f9d2q"
MACHINES = ("demo-md-0-6d9f7c8b5x-k2x7p", "demo-md-0-6d9f7c8b5x-m8r4t", "demo-md-0-6d9f7c8b5x-w5n9q")
BANNER_PATH = "/etc/inplace-demo/banner"
BANNER = "This node was updated in place by inplace-extension.\n"
DEMO_USER = "ops-alice"
# a bootstrap token as CABPK keeps it in every KubeadmConfig: the service must never echo or log it
BOOTSTRAP_TOKEN = "dem0ab.0123456789abcdef"  # noqa: S105 - a made-up token the demo checks stays secret


def _meta(name: str, **labels: str) -> dict[str, Any]:
    base = {"cluster.x-k8s.io/cluster-name": CLUSTER, "cluster.x-k8s.io/deployment-name": DEPLOYMENT}
    return {"name": name, "namespace": NAMESPACE, "labels": {**base, **labels}}


def kubeadm_spec(new: bool, alice_key: str) -> dict[str, Any]:
    """The KubeadmConfig(Template) spec: the new one adds a file and a user."""
    spec: dict[str, Any] = {"joinConfiguration": {"nodeRegistration": {}}}
    if new:
        spec["files"] = [
            {"path": BANNER_PATH, "content": BANNER, "owner": "root:root", "permissions": "0644"}
        ]
        spec["users"] = [{"name": DEMO_USER, "shell": "/bin/bash", "sshAuthorizedKeys": [alice_key]}]
    return spec


def machine_set_objects(new: bool, alice_key: str) -> dict[str, Any]:
    set_name = NEW_SET if new else OLD_SET
    template_hash = set_name.rsplit("-", 1)[1]
    suffix = "v2" if new else "v1"
    return {
        "machineSet": {
            "kind": "MachineSet",
            "apiVersion": "cluster.x-k8s.io/v1beta2",
            "metadata": _meta(set_name, **{"machine-template-hash": template_hash}),
            "spec": {
                "clusterName": CLUSTER,
                "replicas": len(MACHINES),
                "selector": {"matchLabels": {"machine-template-hash": template_hash}},
                "template": {
                    "metadata": {"labels": {"machine-template-hash": template_hash}},
                    "spec": {
                        "clusterName": CLUSTER,
                        "bootstrap": {
                            "configRef": {
                                "apiGroup": "bootstrap.cluster.x-k8s.io",
                                "kind": "KubeadmConfigTemplate",
                                "name": f"demo-md-0-bootstrap-{suffix}",
                            }
                        },
                        "infrastructureRef": {
                            "apiGroup": "infrastructure.cluster.x-k8s.io",
                            "kind": "DockerMachineTemplate",
                            "name": "demo-md-0-infra-v1",
                        },
                        # no version: the lab hosts run no Kubernetes, so the kubernetes_version
                        # capability (it checks the installed kubelet) has nothing to act on
                    },
                },
            },
        },
        "infrastructureMachineTemplate": {
            "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta2",
            "kind": "DockerMachineTemplate",
            "metadata": _meta("demo-md-0-infra-v1"),
            "spec": {"template": {"spec": {}}},
        },
        "bootstrapConfigTemplate": {
            "apiVersion": "bootstrap.cluster.x-k8s.io/v1beta2",
            "kind": "KubeadmConfigTemplate",
            "metadata": _meta(f"demo-md-0-bootstrap-{suffix}"),
            "spec": {"template": {"spec": kubeadm_spec(new, alice_key)}},
        },
    }


def update_machine_request(machine: str, alice_key: str) -> dict[str, Any]:
    labels = {"cluster.x-k8s.io/set-name": NEW_SET}
    in_progress = {"in-place-updates.internal.cluster.x-k8s.io/update-in-progress": ""}
    bootstrap = kubeadm_spec(True, alice_key)
    # as stored by CABPK: the join discovery, with its token, is part of the live KubeadmConfig
    bootstrap["joinConfiguration"]["discovery"] = {
        "bootstrapToken": {"apiServerEndpoint": "10.0.0.1:6443", "token": BOOTSTRAP_TOKEN, "caCertHashes": []}
    }
    return {
        "kind": "UpdateMachineRequest",
        "apiVersion": "hooks.runtime.cluster.x-k8s.io/v1alpha1",
        "desired": {
            "machine": {
                "kind": "Machine",
                "apiVersion": "cluster.x-k8s.io/v1beta2",
                "metadata": {
                    **_meta(machine, **labels),
                    "annotations": {**in_progress, "runtime.cluster.x-k8s.io/pending-hooks": "UpdateMachine"},
                },
                "spec": {
                    "clusterName": CLUSTER,
                    "bootstrap": {
                        "configRef": {
                            "apiGroup": "bootstrap.cluster.x-k8s.io",
                            "kind": "KubeadmConfig",
                            "name": machine,
                        },
                        "dataSecretName": machine,
                    },
                    "infrastructureRef": {
                        "apiGroup": "infrastructure.cluster.x-k8s.io",
                        "kind": "DockerMachine",
                        "name": machine,
                    },
                },
            },
            "infrastructureMachine": {
                "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta2",
                "kind": "DockerMachine",
                "metadata": {**_meta(machine, **labels), "annotations": in_progress},
                "spec": {"bootstrapped": True},
            },
            "bootstrapConfig": {
                "apiVersion": "bootstrap.cluster.x-k8s.io/v1beta2",
                "kind": "KubeadmConfig",
                "metadata": {**_meta(machine, **labels), "annotations": in_progress},
                "spec": bootstrap,
            },
        },
    }
