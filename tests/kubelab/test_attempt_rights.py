"""The rights deploy/ gives, as a real API server judges them: every ServiceAccount of each variant
(the base, the base with the Kubernetes-aware component, the MCM agent's) asked through
SubjectAccessReviews what it may and may not do, and an attempt Job's Pod acting with its own bound token
(a TokenRequest bound to the Pod object, as the kubelet asks for it): it may publish its phase on its own
Pod and, in the Kubernetes-aware mode, cordon a Node and mark a Machine, and nothing else: not another
Pod (the service's own included), not another field, no Secret, no Job, no RBAC. Only the RBAC objects,
the admission policies and the namespaces of each variant are applied (no Deployment runs); they are
removed again after each variant.
"""

from __future__ import annotations

import json
import os
import ssl
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from deploy.support import DEPLOY, kustomize
from hostlab.proc import wait_until
from kubelab import manifests, objects
from kubelab.flavours import capi_objects as co
from kubelab.lab import Lab

pytestmark = pytest.mark.kube

APPLIED = {
    "Namespace",
    "ServiceAccount",
    "Role",
    "RoleBinding",
    "ClusterRole",
    "ClusterRoleBinding",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
}
PHASE = "inplace-extension.io/phase"
MACHINES_CRD = "cluster.x-k8s.io_machines.yaml"
MACHINE_NAMESPACE = "lp-team-a"
NODE = "lp-node-1"
POLICY_WAIT = 30.0


@dataclass(frozen=True)
class Variant:
    name: str
    namespace: str  # the Jobs'
    service: str  # the service's (or agent's) ServiceAccount
    attempt: str  # the Jobs' ServiceAccount
    kube_aware: bool
    docs: tuple[dict[str, Any], ...]

    def user(self, account: str) -> str:
        return f"system:serviceaccount:{self.namespace}:{account}"


def _render(name: str, tmp: Path) -> tuple[dict[str, Any], ...]:
    if name == "mcm":
        return kustomize(DEPLOY / "mcm")
    if name == "plain":
        return kustomize(DEPLOY)
    base = os.path.relpath(DEPLOY, tmp)
    (tmp / "kustomization.yaml").write_text(
        f"resources:\n  - {base}\ncomponents:\n  - {base}/components/kube-aware\n", encoding="utf-8"
    )
    return kustomize(tmp)


@pytest.fixture(scope="module", params=["plain", "kube-aware", "mcm"])
def variant(
    request: pytest.FixtureRequest, kubelab: Lab, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Variant]:
    name = str(request.param)
    docs = tuple(d for d in _render(name, tmp_path_factory.mktemp(name)) if d["kind"] in APPLIED)
    manifests.install_crds(kubelab, [manifests.capi_crd(kubelab, MACHINES_CRD)], only_missing=True)
    for doc in docs:  # RoleBindings in MCM's namespace (`machines`) need it to exist
        if doc["metadata"].get("namespace"):
            objects.ensure_namespace(kubelab, doc["metadata"]["namespace"])
    text = yaml.safe_dump_all(docs)
    kubelab.kubectl("apply", "--server-side", "--field-manager=leastpriv-test", "-f", "-", input=text)
    mcm = name == "mcm"
    chosen = Variant(
        name=name,
        namespace="inplace-extension-mcm" if mcm else "inplace-extension-system",
        service="inplace-extension-mcm-agent" if mcm else "inplace-extension",
        attempt="inplace-extension-mcm-attempt" if mcm else "inplace-extension-attempt",
        kube_aware=name == "kube-aware",
        docs=docs,
    )
    try:
        yield chosen
    finally:
        kept = [d for d in docs if d["kind"] != "Namespace"]  # other tests may use the namespaces
        kubelab.kubectl(
            "delete", "--ignore-not-found", "--wait=false", "-f", "-", input=yaml.safe_dump_all(kept)
        )


# -- SubjectAccessReviews: what RBAC grants each account --------------------------------------------


def _allowed(lab: Lab, user: str, home: str, attributes: dict[str, str]) -> bool:
    """A SubjectAccessReview of ``user``, a ServiceAccount of the namespace ``home``."""
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": user,
            "groups": [
                "system:serviceaccounts",
                f"system:serviceaccounts:{home}",
                "system:authenticated",
            ],
            "resourceAttributes": attributes,
        },
    }
    with lab.http() as client:
        answer = client.post("/apis/authorization.k8s.io/v1/subjectaccessreviews", json=review)
    answer.raise_for_status()
    return bool(answer.json()["status"].get("allowed"))


def _asks(namespace: str) -> dict[str, dict[str, str]]:
    """The actions asked about: name -> resourceAttributes (``namespace``: the Jobs')."""
    ns = {"namespace": namespace}
    return {
        "patch pods": {"verb": "patch", "resource": "pods", **ns},
        "patch pods elsewhere": {"verb": "patch", "resource": "pods", "namespace": "kube-system"},
        "patch pods/status": {"verb": "patch", "resource": "pods", "subresource": "status", **ns},
        "create pods/exec": {"verb": "create", "resource": "pods", "subresource": "exec", **ns},
        "create pods": {"verb": "create", "resource": "pods", **ns},
        "delete pods": {"verb": "delete", "resource": "pods", **ns},
        "get pods": {"verb": "get", "resource": "pods", **ns},
        "list pods": {"verb": "list", "resource": "pods", **ns},
        "list pods everywhere": {"verb": "list", "resource": "pods"},
        "create pods/eviction": {"verb": "create", "resource": "pods", "subresource": "eviction", **ns},
        "get secrets": {"verb": "get", "resource": "secrets", **ns},
        "get the SSH Secret": {"verb": "get", "resource": "secrets", "name": "inplace-extension-ssh", **ns},
        "get secrets elsewhere": {"verb": "get", "resource": "secrets", "namespace": MACHINE_NAMESPACE},
        "list secrets": {"verb": "list", "resource": "secrets", **ns},
        "create secrets": {"verb": "create", "resource": "secrets", **ns},
        "patch secrets": {"verb": "patch", "resource": "secrets", **ns},
        "delete secrets": {"verb": "delete", "resource": "secrets", **ns},
        "list events": {"verb": "list", "resource": "events", **ns},
        "create jobs": {"verb": "create", "group": "batch", "resource": "jobs", **ns},
        "get jobs": {"verb": "get", "group": "batch", "resource": "jobs", **ns},
        "delete jobs": {"verb": "delete", "group": "batch", "resource": "jobs", **ns},
        "patch jobs": {"verb": "patch", "group": "batch", "resource": "jobs", **ns},
        "get machines": {
            "verb": "get",
            "group": "cluster.x-k8s.io",
            "resource": "machines",
            "namespace": MACHINE_NAMESPACE,
        },
        "patch machines": {
            "verb": "patch",
            "group": "cluster.x-k8s.io",
            "resource": "machines",
            "namespace": MACHINE_NAMESPACE,
        },
        "delete machines": {
            "verb": "delete",
            "group": "cluster.x-k8s.io",
            "resource": "machines",
            "namespace": MACHINE_NAMESPACE,
        },
        "get nodes": {"verb": "get", "resource": "nodes"},
        "patch nodes": {"verb": "patch", "resource": "nodes"},
        "patch nodes/status": {"verb": "patch", "resource": "nodes", "subresource": "status"},
        "delete nodes": {"verb": "delete", "resource": "nodes"},
        "create events": {"verb": "create", "resource": "events", "namespace": MACHINE_NAMESPACE},
        "list poddisruptionbudgets": {"verb": "list", "group": "policy", "resource": "poddisruptionbudgets"},
        "create roles": {"verb": "create", "group": "rbac.authorization.k8s.io", "resource": "roles", **ns},
        "create rolebindings": {
            "verb": "create",
            "group": "rbac.authorization.k8s.io",
            "resource": "rolebindings",
            **ns,
        },
        "create clusterrolebindings": {
            "verb": "create",
            "group": "rbac.authorization.k8s.io",
            "resource": "clusterrolebindings",
        },
        "escalate roles": {
            "verb": "escalate",
            "group": "rbac.authorization.k8s.io",
            "resource": "roles",
            **ns,
        },
        "bind clusterroles": {
            "verb": "bind",
            "group": "rbac.authorization.k8s.io",
            "resource": "clusterroles",
        },
        "impersonate serviceaccounts": {"verb": "impersonate", "resource": "serviceaccounts", **ns},
        "create serviceaccounts/token": {
            "verb": "create",
            "resource": "serviceaccounts",
            "subresource": "token",
            **ns,
        },
        "create validatingadmissionpolicybindings": {
            "verb": "create",
            "group": "admissionregistration.k8s.io",
            "resource": "validatingadmissionpolicybindings",
        },
        "delete validatingadmissionpolicies": {
            "verb": "delete",
            "group": "admissionregistration.k8s.io",
            "resource": "validatingadmissionpolicies",
        },
    }


# what each account may do (every other action of _asks is refused); docs/operations.md lists the same
ATTEMPT_PLAIN = {"patch pods"}
ATTEMPT_KUBE_AWARE = ATTEMPT_PLAIN | {
    "get machines",
    "patch machines",
    "create events",
    "get nodes",
    "patch nodes",
    "patch nodes/status",
    "list pods",
    "list pods everywhere",
    "create pods/eviction",
    "list poddisruptionbudgets",
}
SERVICE_PLAIN = {
    "create jobs",
    "get jobs",
    "patch jobs",  # a finished Job's TTL, once its outcome is in the record
    "delete jobs",
    "create secrets",
    "patch secrets",
    "delete secrets",
    "list events",
    "get pods",
    "list pods",
    "get machines",
    "patch machines",
}
SERVICE_KUBE_AWARE = SERVICE_PLAIN | {
    "create events",
    "get secrets",
    "get secrets elsewhere",
    "get the SSH Secret",
}
# the MCM agent on its target cluster (Nodes, the Pods left on an updated Node) and its Jobs' namespace
MCM_AGENT = {
    "create jobs",
    "get jobs",
    "patch jobs",  # a finished Job's TTL, once its outcome is in the record
    "delete jobs",
    "create secrets",
    "patch secrets",
    "delete secrets",
    "list events",
    "get pods",
    "list pods",
    "list pods everywhere",
    "delete pods",
    "get nodes",
    "patch nodes",
    "create events",
}


def _expected(variant: Variant) -> dict[str, set[str]]:
    if variant.name == "mcm":
        return {variant.service: MCM_AGENT, variant.attempt: ATTEMPT_PLAIN}
    if variant.kube_aware:
        return {variant.service: SERVICE_KUBE_AWARE, variant.attempt: ATTEMPT_KUBE_AWARE}
    return {variant.service: SERVICE_PLAIN, variant.attempt: ATTEMPT_PLAIN}


def test_every_account_may_do_what_it_needs_and_nothing_more(kubelab: Lab, variant: Variant) -> None:
    shipped = {d["metadata"]["name"] for d in variant.docs if d["kind"] == "ServiceAccount"}
    expected = _expected(variant)
    assert shipped == set(expected), "every ServiceAccount deploy/ ships is judged"
    asks = _asks(variant.namespace)
    for account, allowed in expected.items():
        granted = {
            action
            for action, attributes in asks.items()
            if _allowed(kubelab, variant.user(account), variant.namespace, attributes)
        }
        assert granted == allowed, f"{variant.name}: {account}"


# -- a Job's Pod with its own bound token ---------------------------------------------------------------


def _pod(name: str, account: str, namespace: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    """A Pod the restricted profile admits (the namespace enforces it); it never needs to run."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": labels or {"app": name}},
        "spec": {
            "serviceAccountName": account,
            "automountServiceAccountToken": False,
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": 10001,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "containers": [
                {
                    "name": "c",
                    "image": "registry.invalid/never-pulled:1",
                    "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
                }
            ],
            "nodeSelector": {"lp-never": "scheduled"},  # stays Pending: no kwok node runs it
        },
    }


def _token(lab: Lab, namespace: str, account: str, pod: dict[str, Any] | None) -> str:
    request: dict[str, Any] = {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {"expirationSeconds": 600},
    }
    if pod is not None:
        request["spec"]["boundObjectRef"] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": pod["metadata"]["name"],
            "uid": pod["metadata"]["uid"],
        }
    with lab.http() as client:
        answer = client.post(f"/api/v1/namespaces/{namespace}/serviceaccounts/{account}/token", json=request)
    answer.raise_for_status()
    return str(answer.json()["status"]["token"])


@dataclass
class As:
    """Requests to the API server with one bearer token."""

    lab: Lab
    token: str

    def _client(self) -> httpx.Client:
        return httpx.Client(
            base_url=self.lab.server,
            verify=ssl.create_default_context(cafile=str(self.lab.ca)),
            timeout=30,
            headers={"Authorization": f"Bearer {self.token}"},
        )

    def merge(self, path: str, patch: dict[str, Any]) -> int:
        with self._client() as client:
            answer = client.patch(
                path, content=json.dumps(patch), headers={"Content-Type": "application/merge-patch+json"}
            )
        return answer.status_code

    def strategic(self, path: str, patch: dict[str, Any]) -> int:
        with self._client() as client:
            answer = client.patch(
                path,
                content=json.dumps(patch),
                headers={"Content-Type": "application/strategic-merge-patch+json"},
            )
        return answer.status_code

    def json_patch(self, path: str, ops: list[dict[str, Any]]) -> int:
        with self._client() as client:
            answer = client.patch(
                path, content=json.dumps(ops), headers={"Content-Type": "application/json-patch+json"}
            )
        return answer.status_code

    def get(self, path: str) -> int:
        with self._client() as client:
            return client.get(path).status_code

    def post(self, path: str, body: dict[str, Any]) -> int:
        with self._client() as client:
            return client.post(path, json=body).status_code

    def delete(self, path: str) -> int:
        with self._client() as client:
            return client.delete(path).status_code

    def whoami(self) -> dict[str, Any]:
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
        with self._client() as client:
            answer = client.post("/apis/authentication.k8s.io/v1/selfsubjectreviews", json=body)
        answer.raise_for_status()
        return dict(answer.json()["status"]["userInfo"])


def _phase(value: str) -> dict[str, Any]:
    return {"metadata": {"annotations": {PHASE: value}}}


@pytest.fixture
def pods(kubelab: Lab, variant: Variant) -> Iterator[dict[str, dict[str, Any]]]:
    """Two attempt Pods and the service's Pod in the Jobs' namespace, and the SSH Secret, as created."""
    ns = variant.namespace
    made = {
        "mine": _pod("lp-attempt-mine", variant.attempt, ns),
        "other": _pod("lp-attempt-other", variant.attempt, ns),
        "service": _pod("lp-service", variant.service, ns),
    }
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "inplace-extension-ssh", "namespace": ns},
        "stringData": {"id": "every host's key"},
    }
    objects.apply(kubelab, *made.values(), secret)
    try:
        yield {
            key: objects.get(kubelab, "pod", pod["metadata"]["name"], ns) or {} for key, pod in made.items()
        }
    finally:
        for pod in made.values():
            kubelab.kubectl(
                "delete", "pod", pod["metadata"]["name"], "-n", ns, "--ignore-not-found", "--wait=false"
            )
        kubelab.kubectl("delete", "secret", "inplace-extension-ssh", "-n", ns, "--ignore-not-found")


def test_a_jobs_pod_publishes_its_phase_on_itself_and_changes_nothing_else(
    kubelab: Lab, variant: Variant, pods: dict[str, dict[str, Any]]
) -> None:
    ns = variant.namespace
    mine, other, service = (pods[k]["metadata"]["name"] for k in ("mine", "other", "service"))
    me = As(kubelab, _token(kubelab, ns, variant.attempt, pods["mine"]))
    # the API server names the Pod the token is bound to: what the policy holds the account to
    extra = me.whoami().get("extra", {})
    assert extra.get("authentication.kubernetes.io/pod-name") == [mine]
    pod_path = f"/api/v1/namespaces/{ns}/pods/"
    # the policy takes a moment to be in force after it is created: wait until it refuses another Pod
    assert wait_until(lambda: me.merge(pod_path + other, _phase("x")) == 403, POLICY_WAIT, 0.5), (
        "the policy never refused a change of another Pod"
    )
    assert me.merge(pod_path + mine, _phase("ntp")) == 200
    assert (objects.get(kubelab, "pod", mine, ns) or {})["metadata"]["annotations"][PHASE] == "ntp"
    refused = {
        "another attempt's Pod": me.merge(pod_path + other, _phase("ntp")),
        "the service's Pod": me.merge(pod_path + service, _phase("ntp")),
        "the service's image": me.strategic(
            pod_path + service, {"spec": {"containers": [{"name": "c", "image": "evil:1"}]}}
        ),
        "its own image": me.strategic(
            pod_path + mine, {"spec": {"containers": [{"name": "c", "image": "evil:1"}]}}
        ),
        "its own labels": me.merge(pod_path + mine, {"metadata": {"labels": {"app": "service"}}}),
        "another annotation": me.merge(pod_path + mine, {"metadata": {"annotations": {"x": "y"}}}),
        "its phase removed with another": me.merge(
            pod_path + mine, {"metadata": {"annotations": {PHASE: "a", "y": "z"}}}
        ),
        "its own finalizers": me.merge(pod_path + mine, {"metadata": {"finalizers": ["example.com/hold"]}}),
        "delete another Pod": me.delete(pod_path + other),
        "read the SSH Secret": me.get(f"/api/v1/namespaces/{ns}/secrets/inplace-extension-ssh"),
        "list Secrets": me.get(f"/api/v1/namespaces/{ns}/secrets"),
        "list Secrets everywhere": me.get("/api/v1/secrets"),
        "create a Job": me.post(
            f"/apis/batch/v1/namespaces/{ns}/jobs",
            {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "x"}},
        ),
        "create a Role": me.post(
            f"/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles",
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "Role",
                "metadata": {"name": "x"},
                "rules": [],
            },
        ),
        "delete the policy": me.delete("/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies/x"),
    }
    assert {what: code for what, code in refused.items() if code != 403} == {}
    after = objects.get(kubelab, "pod", mine, ns) or {}
    assert after["metadata"]["labels"] == {"app": mine} and "x" not in after["metadata"]["annotations"]
    assert (objects.get(kubelab, "pod", service, ns) or {})["spec"]["containers"][0]["image"] != "evil:1"
    # a token of the same account bound to no Pod names none: it may change no Pod at all
    unbound = As(kubelab, _token(kubelab, ns, variant.attempt, None))
    assert unbound.merge(pod_path + mine, _phase("y")) == 403


def test_only_in_the_kube_aware_mode_a_jobs_pod_cordons_and_marks_and_then_nothing_else(
    kubelab: Lab, variant: Variant, pods: dict[str, dict[str, Any]]
) -> None:
    ns = variant.namespace
    co.machine_with_status(kubelab, MACHINE_NAMESPACE, "lp-m1", [], NODE)
    objects.apply(
        kubelab, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE, "labels": {"lp": "node"}}}
    )
    me = As(kubelab, _token(kubelab, ns, variant.attempt, pods["mine"]))
    machine = f"/apis/cluster.x-k8s.io/v1beta2/namespaces/{MACHINE_NAMESPACE}/machines/lp-m1"
    node = f"/api/v1/nodes/{NODE}"
    try:
        assert wait_until(
            lambda: me.merge(node, {"metadata": {"labels": {"lp": "changed"}}}) == 403, POLICY_WAIT, 0.5
        )
        updating = {"type": "DisruptiveInPlaceUpdate", "status": "True", "reason": "DisruptiveStepRunning"}
        ready = {"type": "Ready", "status": "False", "reason": "Lab"}
        drain = {
            "skip-remediation": me.merge(
                machine,
                {
                    "metadata": {
                        "annotations": {
                            "cluster.x-k8s.io/skip-remediation": "",
                            "inplace-extension.io/skip-remediation-by": "r",
                        }
                    }
                },
            ),
            "cordon": me.merge(
                node,
                {
                    "metadata": {"annotations": {"inplace-extension.io/cordoned-by": "lp-team-a/lp-m1"}},
                    "spec": {"unschedulable": True},
                },
            ),
            "read the Machine": me.get(machine),
            "the DisruptiveInPlaceUpdate condition": me.strategic(
                node + "/status", {"status": {"conditions": [updating]}}
            ),
            "list the Node's Pods": me.get(f"/api/v1/pods?fieldSelector=spec.nodeName={NODE}"),
            "list budgets": me.get("/apis/policy/v1/poddisruptionbudgets"),
        }
        # the drain's calls: the Kubernetes-aware Jobs' only (the others' RBAC refuses every one)
        assert drain == {k: 200 if variant.kube_aware else 403 for k in drain}
        # and their undoing, as kube/drain.py and kube/machines.py send it (a JSON patch testing our mark)
        cordoned = "/metadata/annotations/inplace-extension.io~1cordoned-by"
        marked = "/metadata/annotations/inplace-extension.io~1skip-remediation-by"
        undo = {
            "uncordon": me.json_patch(
                node,
                [
                    {"op": "test", "path": cordoned, "value": "lp-team-a/lp-m1"},
                    {"op": "remove", "path": cordoned},
                    {"op": "replace", "path": "/spec/unschedulable", "value": False},
                ],
            ),
            "skip-remediation removed": me.json_patch(
                machine,
                [
                    {"op": "test", "path": marked, "value": "r"},
                    {"op": "remove", "path": marked},
                    {"op": "remove", "path": "/metadata/annotations/cluster.x-k8s.io~1skip-remediation"},
                ],
            ),
        }
        # (a Job without the rights has nothing to undo: the test of our mark fails first, 422 or 403)
        assert undo == {k: 200 for k in undo} if variant.kube_aware else 200 not in undo.values()
        refused = {
            "a Machine label": me.merge(machine, {"metadata": {"labels": {"x": "y"}}}),
            "another Machine annotation": me.merge(machine, {"metadata": {"annotations": {"x": "y"}}}),
            "the Machine's spec": me.merge(machine, {"spec": {"clusterName": "other"}}),
            "delete the Machine": me.delete(machine),
            "a Node label": me.merge(node, {"metadata": {"labels": {"lp": "changed"}}}),
            "another Node annotation": me.merge(node, {"metadata": {"annotations": {"x": "y"}}}),
            "a Node taint": me.merge(node, {"spec": {"taints": [{"key": "x", "effect": "NoSchedule"}]}}),
            "another Node condition": me.strategic(node + "/status", {"status": {"conditions": [ready]}}),
            "the cluster's kubeconfig Secret": me.get(
                f"/api/v1/namespaces/{MACHINE_NAMESPACE}/secrets/c1-kubeconfig"
            ),
        }
        assert {what: code for what, code in refused.items() if code != 403} == {}
        after = objects.get(kubelab, "node", NODE) or {}
        assert not after["spec"].get("unschedulable")
        assert "inplace-extension.io/cordoned-by" not in after["metadata"].get("annotations", {})
        assert after["metadata"]["labels"]["lp"] == "node"
        conditions = {c["type"] for c in after.get("status", {}).get("conditions") or []}
        assert conditions == ({"DisruptiveInPlaceUpdate"} if variant.kube_aware else set())
    finally:
        kubelab.kubectl("delete", "node", NODE, "--ignore-not-found", "--wait=false")
        kubelab.kubectl(
            "delete",
            "machine.cluster.x-k8s.io",
            "lp-m1",
            "-n",
            MACHINE_NAMESPACE,
            "--ignore-not-found",
            "--wait=false",
        )
