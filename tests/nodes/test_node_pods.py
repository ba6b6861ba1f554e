"""Pods and Jobs on the real nodes: the project's own image (built here, imported into each node's
containerd, no registry) run by the real kubelet, containerd and runc, placed by the real kube-scheduler,
a Job completed by the real Job controller and removed by the real TTL controller.

Stand-ins, named: the Pod sandbox's pause image (busybox, tests/nodes/images.py), the one DNAT rule
that stands in for kube-proxy for the ``kubernetes`` Service and the not-ready taint removed at join
in place of the node lifecycle controller (kubelab.node_join). What a Job of the project's
``kubernetes`` executor needs is shown here: in-cluster API access from inside the
image with the project's own client code, a termination message, and SSH reachability of the machines.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from hostlab.lab import Host
from kubelab import objects, reads
from kubelab.lab import Lab as KubeLab

from inplace_extension.cli import installed_version

from .conftest import Cluster
from .images import node_image
from .pods import api_access, on_node

pytestmark = [pytest.mark.lab, pytest.mark.kube]

POD_NETWORK = "10.244.0."  # the nodes' CNI bridge range (hostlab.node_base)
RUN_TIMEOUT = 120.0  # image already imported; sandbox, container start, Python start on busy cores
# What the Job's container runs: the CLI, then its own Pod read through the project's in-cluster client
# (the `kubernetes` Service's ClusterIP, the projected token and CA), written as the termination message
READ_OWN_POD = """\
import json, os, subprocess
from lightkube.resources.core_v1 import Pod
from inplace_extension.kube.client import connect
version = subprocess.run(["inplace-extension", "--version"], capture_output=True, text=True, check=True)
pod = connect(None).get(Pod, os.environ["POD_NAME"])
message = {"version": version.stdout.strip(), "uid": pod.metadata.uid, "node": pod.spec.nodeName}
with open("/dev/termination-log", "w") as log:
    json.dump(message, log)
"""
# A Pod on the Pod network reads the SSH banner of another node (its traffic masqueraded by its node)
READ_SSH_BANNER = """\
import socket, sys
with socket.create_connection((sys.argv[1], 22), timeout=10) as conn:
    banner = conn.recv(64).decode().strip()
with open("/dev/termination-log", "w") as log:
    log.write(banner)
"""


@pytest.fixture
def namespace(node_cluster: Cluster) -> Iterator[str]:
    """A fresh namespace whose ``default`` ServiceAccount may read Pods; deleted afterwards."""
    kube = node_cluster.kube
    name = f"pods-{uuid.uuid4().hex[:8]}"
    objects.ensure_namespace(kube, name)
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": "read-pods", "namespace": name},
        "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": "read-pods", "namespace": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "read-pods"},
        "subjects": [{"kind": "ServiceAccount", "name": "default", "namespace": name}],
    }
    objects.apply(kube, role, binding)
    # the serviceaccount controller makes it; the kubelet asks a token for it
    objects.wait_for(kube, "serviceaccount", "default", name, bool, "created")
    try:
        yield name
    finally:
        kube.kubectl("delete", "namespace", name, "--wait=false", check=False)


def _container(image: str, script: str, *args: str) -> dict[str, Any]:
    return {
        "name": "main",
        "image": image,
        "imagePullPolicy": "Never",  # no registry: the image was imported into the node's containerd
        "command": ["python", "-c", script, *args],
        "env": [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
    }


def _terminated(pod: dict[str, Any]) -> dict[str, Any] | None:
    statuses = pod.get("status", {}).get("containerStatuses", [])
    state = statuses[0].get("state", {}) if statuses else {}
    terminated: dict[str, Any] | None = state.get("terminated")
    return terminated


def _job_pod(kube: KubeLab, namespace: str, job: str) -> dict[str, Any]:
    pods = reads.list_objects(kube, "pods", namespace, f"job-name={job}")
    assert len(pods) == 1, [p["metadata"]["name"] for p in pods]
    return pods[0]


def test_a_job_from_the_projects_image_reads_its_own_pod_in_cluster_and_its_ttl_removes_it(
    node_cluster: Cluster, namespace: str
) -> None:
    kube, node = node_cluster.kube, node_cluster.hosts[0]
    image = node_image(node_cluster)
    pod_fields, mount = api_access()
    container = {**_container(image, READ_OWN_POD), "volumeMounts": [mount]}
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "read-own-pod", "namespace": namespace},
        "spec": {
            "backoffLimit": 0,
            "template": {
                "spec": {
                    **pod_fields,
                    **on_node(node.name),
                    "restartPolicy": "Never",
                    "containers": [container],
                }
            },
        },
    }
    objects.apply(kube, job)

    def finished(obj: dict[str, Any]) -> bool:
        return any(objects.condition(obj, kind) for kind in ("Complete", "Failed"))

    objects.wait_for(kube, "job", "read-own-pod", namespace, finished, "finished", RUN_TIMEOUT)
    pod = _job_pod(kube, namespace, "read-own-pod")
    terminated = _terminated(pod)
    assert terminated is not None and terminated["exitCode"] == 0, pod.get("status")
    assert json.loads(terminated["message"]) == {
        "version": f"inplace-extension {installed_version()}",
        "uid": pod["metadata"]["uid"],
        "node": node.name,
    }
    completed = objects.get(kube, "job", "read-own-pod", namespace)
    assert objects.condition(completed, "Complete"), completed
    assert pod["status"]["podIP"].startswith(POD_NETWORK)

    # ttlSecondsAfterFinished set on the finished Job: the TTL controller deletes it, its Pod goes with it
    ttl = json.dumps({"spec": {"ttlSecondsAfterFinished": 0}})
    kube.kubectl("patch", "job", "read-own-pod", "-n", namespace, "-p", ttl)
    objects.wait_gone(kube, "job", "read-own-pod", namespace)
    objects.wait_gone(kube, "pod", pod["metadata"]["name"], namespace)


def test_a_pod_on_the_pod_network_reaches_another_nodes_sshd(node_cluster: Cluster, namespace: str) -> None:
    kube = node_cluster.kube
    node: Host = node_cluster.hosts[0]
    other: Host = node_cluster.hosts[1]
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "ssh-banner", "namespace": namespace},
        "spec": {
            **on_node(node.name),
            "restartPolicy": "Never",
            "containers": [_container(node_image(node_cluster), READ_SSH_BANNER, other.address)],
        },
    }
    objects.apply(kube, pod)
    objects.wait_for(kube, "pod", "ssh-banner", namespace, _terminated, "terminated", RUN_TIMEOUT)
    seen = objects.get(kube, "pod", "ssh-banner", namespace) or {}
    terminated = _terminated(seen)
    assert terminated is not None and terminated["exitCode"] == 0, seen.get("status")
    assert terminated["message"].startswith("SSH-2.0-OpenSSH"), terminated
    assert not seen["spec"].get("hostNetwork")
    assert seen["status"]["podIP"].startswith(POD_NETWORK)
