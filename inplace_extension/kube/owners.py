"""The objects a CAPI Machine belongs to (its Cluster, MachineDeployment or KubeadmControlPlane), read
for their annotations: the operator's pause and cancel (docs/operator-controls.md).

Read as generic resources of the versions CAPI v1.14 stores; only ``metadata.annotations`` is looked at.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from lightkube import Client
from lightkube.generic_resource import create_namespaced_resource

from inplace_extension.kube.client import plain, translated
from inplace_extension.kube.errors import NotFound

OWNERS: Final = {
    "Cluster": create_namespaced_resource("cluster.x-k8s.io", "v1beta2", "Cluster", "clusters"),
    "MachineDeployment": create_namespaced_resource(
        "cluster.x-k8s.io", "v1beta2", "MachineDeployment", "machinedeployments"
    ),
    "KubeadmControlPlane": create_namespaced_resource(
        "controlplane.cluster.x-k8s.io", "v1beta2", "KubeadmControlPlane", "kubeadmcontrolplanes"
    ),
}


def owner_annotations(client: Client, kind: str, namespace: str, name: str) -> Mapping[str, str] | None:
    """The annotations of one owner object (``kind`` one of :data:`OWNERS`), None when it does not exist."""
    try:
        with translated(f"get {kind} {namespace}/{name}"):
            obj = client.get(OWNERS[kind], name, namespace=namespace)
    except NotFound:
        return None
    metadata = plain(obj).get("metadata") or {}
    return {str(k): str(v) for k, v in (metadata.get("annotations") or {}).items()}
