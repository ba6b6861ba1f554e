"""What an operator prepares before the ``kubernetes`` executor's Jobs can run in a namespace, as the
lab tests prepare it: the namespace enforcing the "restricted" Pod Security Standard (as deploy/'s
does), the Jobs' ServiceAccount, Role and RoleBinding from deploy/rbac.yaml, their Kubernetes-aware
rights from deploy/components/kube-aware/rbac.yaml (bound in that namespace) and the admission policies
of deploy/ that hold them to their own Pod, the cordon and the marks (moved to that namespace's account).
The Jobs mount no SSH Secret: the service copies each one its host's key. Used by
tests/nodes/test_node_jobs.py, tests/capi_lab/test_capi_jobs.py and bench/executors.py.
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
ATTEMPT_ROLE = "inplace-extension-attempt-kube-aware"
SHIPPED_USER = "system:serviceaccount:inplace-extension-system:inplace-extension-attempt"
RESTRICTED = {
    "pod-security.kubernetes.io/enforce": "restricted",
    "pod-security.kubernetes.io/enforce-version": "latest",
}


def _policies(namespace: str) -> list[dict[str, Any]]:
    """deploy/'s ValidatingAdmissionPolicies for the Jobs' account (and their bindings), matching the
    account of ``namespace`` instead of the shipped one, named after it."""
    chosen = []
    for path in ("deploy/attempt-policy.yaml", "deploy/components/kube-aware/attempt-policy.yaml"):
        for doc in yaml.safe_load_all((REPO / path).read_text()):
            if not doc:
                continue
            doc["metadata"]["name"] = f"{doc['metadata']['name']}-{namespace}"
            spec = doc["spec"]
            if doc["kind"] == "ValidatingAdmissionPolicyBinding":
                spec["policyName"] = f"{spec['policyName']}-{namespace}"
            else:
                (condition,) = spec["matchConditions"]
                assert SHIPPED_USER in condition["expression"]
                user = f"system:serviceaccount:{namespace}:{ATTEMPT_ACCOUNT}"
                condition["expression"] = condition["expression"].replace(SHIPPED_USER, user)
            chosen.append(doc)
    return chosen


def operator_objects(namespace: str) -> list[dict[str, Any]]:
    """The Jobs' ServiceAccount, Role and RoleBinding from deploy/rbac.yaml, their Kubernetes-aware
    ClusterRole from deploy/components/kube-aware/rbac.yaml (a binding of this namespace) and deploy/'s
    admission policies for them, moved into ``namespace``."""
    chosen: list[dict[str, Any]] = []
    for doc in yaml.safe_load_all((REPO / "deploy/rbac.yaml").read_text()):
        if doc and doc["metadata"]["name"] == ATTEMPT_ACCOUNT:
            doc["metadata"]["namespace"] = namespace
            for subject in doc.get("subjects", []):
                subject["namespace"] = namespace
            chosen.append(doc)
    for doc in yaml.safe_load_all((REPO / "deploy/components/kube-aware/rbac.yaml").read_text()):
        if doc and doc["kind"] == "ClusterRole" and doc["metadata"]["name"] == ATTEMPT_ROLE:
            chosen.append(doc)
        elif doc and doc["kind"] == "ClusterRoleBinding" and doc["roleRef"]["name"] == ATTEMPT_ROLE:
            doc["metadata"]["name"] = f"{doc['metadata']['name']}-{namespace}"
            doc["subjects"] = [{"kind": "ServiceAccount", "name": ATTEMPT_ACCOUNT, "namespace": namespace}]
            chosen.append(doc)
    chosen += _policies(namespace)
    assert {d["kind"] for d in chosen} == {
        "ServiceAccount",
        "Role",
        "RoleBinding",
        "ClusterRole",
        "ClusterRoleBinding",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    }
    return chosen


@contextmanager
def jobs_namespace(kube: Lab) -> Iterator[str]:
    """A new namespace for the Jobs, prepared as an operator would (restricted Pod Security, the Jobs'
    account, rights and policies); deleted afterwards with its Jobs, and the cluster-wide objects of it
    too."""
    name = f"jobs-{uuid.uuid4().hex[:8]}"
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": RESTRICTED}}
    operator = operator_objects(name)
    objects.apply(kube, namespace, *operator)
    try:
        yield name
    finally:
        for doc in operator:  # the cluster-wide ones of this namespace (the namespace takes the rest)
            kind, named = doc["kind"], doc["metadata"]["name"]
            if kind.startswith(("Cluster", "ValidatingAdmissionPolicy")) and named.endswith(name):
                kube.kubectl("delete", kind.lower(), named, "--ignore-not-found", check=False)
        kube.kubectl("delete", "namespace", name, "--wait=false", check=False)
