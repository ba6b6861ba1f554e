"""What a Pod needs to run on the node lab's real nodes and to reach the API server from inside, as
Kubernetes objects (plain dicts) a test puts into its Pod or Job template.

- **A real node**: the lab's apiserver may hold kwok Nodes of other tests beside the real ones, and
  kube-scheduler (flavour ``nodes``) may place a Pod on either: :func:`on_node` selects one real node by
  its ``kubernetes.io/hostname`` label.
- **Its service-account token, declared**: the lab's apiserver runs without the ``ServiceAccount``
  admission plugin (kwok tests create Pods in new namespaces before their ``default`` ServiceAccount
  exists, which that plugin refuses), so nothing adds the token volume to a Pod by itself and nothing
  defaults ``serviceAccountName``. :func:`api_access` gives the Pod spec exactly what the plugin would
  add, the projected ``kube-api-access`` volume (a bound token the kubelet requests and refreshes, the
  ``kube-root-ca.crt`` ConfigMap, the namespace) mounted where in-cluster clients look for it. The same
  spec works unchanged in a cluster that runs the plugin (it leaves a Pod alone that mounts that path).
- The image: :func:`images.node_image` (the project's image, ``imagePullPolicy: Never``).
"""

from __future__ import annotations

from typing import Any

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"  # where in-cluster clients read
TOKEN_SECONDS = 3607  # what the ServiceAccount admission plugin asks for
NAMESPACE_FIELD = {"apiVersion": "v1", "fieldPath": "metadata.namespace"}


def on_node(name: str) -> dict[str, Any]:
    """Pod spec fields that place the Pod on the real node ``name`` (through the scheduler)."""
    return {"nodeSelector": {"kubernetes.io/hostname": name}}


def api_access(service_account: str = "default") -> tuple[dict[str, Any], dict[str, Any]]:
    """Pod spec fields (``serviceAccountName``, the volume) and the container's ``volumeMounts`` entry
    for in-cluster API access as ``service_account``."""
    projected = {
        "defaultMode": 0o644,
        "sources": [
            {"serviceAccountToken": {"path": "token", "expirationSeconds": TOKEN_SECONDS}},
            {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
            {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": NAMESPACE_FIELD}]}},
        ],
    }
    pod = {
        "serviceAccountName": service_account,
        "volumes": [{"name": "kube-api-access", "projected": projected}],
    }
    mount = {"name": "kube-api-access", "mountPath": SERVICE_ACCOUNT_DIR, "readOnly": True}
    return pod, mount
