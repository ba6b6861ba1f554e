"""What an operator prepares before the ``kubernetes`` executor's Jobs can run in a namespace, as the
lab tests prepare it: the Jobs' ServiceAccount, Role and RoleBinding from deploy/rbac.yaml, its drain
rights from deploy/components/kube-aware/rbac.yaml (bound in that namespace), the rights
docs/kube-aware.md lists for ``--workload-kubeconfig management``, and the Secret with the SSH key that
each Job mounts where the inventory's ``private_key_file`` says. Used by tests/nodes/test_node_jobs.py
and tests/capi_lab/test_capi_jobs.py.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml
from kubelab import objects
from kubelab.lab import Lab

REPO = Path(__file__).resolve().parents[2]
ATTEMPT_ACCOUNT = "inplace-extension-attempt"
SSH_SECRET = "inplace-extension-ssh"


def _rbac(kind: str, name: str) -> dict[str, Any]:
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": kind, "metadata": {"name": name}}


def operator_objects(namespace: str) -> list[dict[str, Any]]:
    """The Jobs' ServiceAccount, Role and RoleBinding from deploy/rbac.yaml, and its drain rights from
    deploy/components/kube-aware/rbac.yaml (a binding of this namespace), moved into ``namespace``."""
    chosen: list[dict[str, Any]] = []
    for doc in yaml.safe_load_all((REPO / "deploy/rbac.yaml").read_text()):
        if doc and doc["metadata"]["name"] == ATTEMPT_ACCOUNT:
            doc["metadata"]["namespace"] = namespace
            for subject in doc.get("subjects", []):
                subject["namespace"] = namespace
            chosen.append(doc)
    for doc in yaml.safe_load_all((REPO / "deploy/components/kube-aware/rbac.yaml").read_text()):
        if doc and doc["kind"] == "ClusterRole":
            chosen.append(doc)
        elif doc and doc["kind"] == "ClusterRoleBinding":
            doc["metadata"]["name"] = f"{doc['metadata']['name']}-{namespace}"
            doc["subjects"] = [{"kind": "ServiceAccount", "name": ATTEMPT_ACCOUNT, "namespace": namespace}]
            chosen.append(doc)
    # --workload-kubeconfig management: the Jobs' own account drains, with the rights docs/kube-aware.md
    # lists for it (not in the component)
    workload = f"inplace-extension-workload-{namespace}"
    rules = [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]},
        {"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["patch"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]},
        {"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]},
        {"apiGroups": ["policy"], "resources": ["poddisruptionbudgets"], "verbs": ["list"]},
    ]
    role_ref = {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": workload}
    subject = {"kind": "ServiceAccount", "name": ATTEMPT_ACCOUNT, "namespace": namespace}
    chosen.append({**_rbac("ClusterRole", workload), "rules": rules})
    chosen.append({**_rbac("ClusterRoleBinding", workload), "roleRef": role_ref, "subjects": [subject]})
    assert {d["kind"] for d in chosen} == {
        "ServiceAccount",
        "Role",
        "RoleBinding",
        "ClusterRole",
        "ClusterRoleBinding",
    }
    return chosen


def ssh_secret(namespace: str, private_key: Path) -> dict[str, Any]:
    """The Secret ``--job-ssh-secret`` names, in ``namespace``: ``private_key`` under its file name."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": SSH_SECRET, "namespace": namespace},
        "type": "Opaque",
        "stringData": {private_key.name: private_key.read_text()},
    }


@contextmanager
def jobs_namespace(kube: Lab, private_key: Path) -> Iterator[str]:
    """A new namespace for the Jobs, prepared as an operator would (the SSH Secret holds ``private_key``
    under its file name); deleted afterwards with its Jobs, and the cluster-wide objects of it too."""
    name = f"jobs-{uuid.uuid4().hex[:8]}"
    objects.ensure_namespace(kube, name)
    operator = operator_objects(name)
    objects.apply(kube, *operator, ssh_secret(name, private_key))
    try:
        yield name
    finally:
        for doc in operator:  # the cluster-wide ones of this namespace (the namespace takes the rest)
            kind, named = doc["kind"], doc["metadata"]["name"]
            if kind in ("ClusterRoleBinding", "ClusterRole") and named.endswith(name):
                kube.kubectl("delete", kind.lower(), named, "--ignore-not-found", check=False)
        kube.kubectl("delete", "namespace", name, "--wait=false", check=False)
