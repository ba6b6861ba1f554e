"""deploy/: a real kustomize build, every resource validated against published schemas, and the pieces
checked against each other and against the code (Settings fields, hook settings, Dockerfile paths)."""

from __future__ import annotations

import copy
import os
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import yaml

from inplace_extension.cli import build_parser
from inplace_extension.cli.flags import settings_from_args
from inplace_extension.hooks.context import HookOptions
from inplace_extension.inplace.infra_tags import PROVIDER_TAGS
from inplace_extension.kube.objects import plural_of
from inplace_extension.kubejobs.manifest import JobConfig, job_manifest
from inplace_extension.runs.model import RunRequest
from inplace_extension.settings import Settings

from .support import (
    DEPLOY,
    KUBERNETES_VERSIONS,
    dockerfile_stages,
    kustomize,
    one,
    rendered,
    validation_errors,
)

NAMESPACE = "inplace-extension-system"
EXPECTED_KINDS = {
    "Namespace",
    "ServiceAccount",
    "Role",
    "RoleBinding",
    "ClusterRole",
    "ClusterRoleBinding",
    "ConfigMap",
    "Deployment",
    "PodDisruptionBudget",
    "Service",
    "Issuer",
    "Certificate",
    "ExtensionConfig",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
}
CLUSTER_SCOPED = {
    "Namespace",
    "ExtensionConfig",
    "ClusterRole",
    "ClusterRoleBinding",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
}


def _container() -> dict[str, Any]:
    containers = one("Deployment")["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return dict(containers[0])


def _mounts() -> dict[str, str]:
    """volume name -> mount path"""
    return {m["name"]: m["mountPath"] for m in _container()["volumeMounts"]}


def _volumes() -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in one("Deployment")["spec"]["template"]["spec"]["volumes"]}


def _pod_env() -> dict[str, str]:
    """What the process sees: image ENV, then the ConfigMap (envFrom), then explicit env."""
    env = dict(dockerfile_stages()[-1].env())
    env.update(one("ConfigMap", "inplace-extension-config")["data"])
    env.update({e["name"]: e["value"] for e in _container()["env"] if "value" in e})
    return env


def _serve_settings() -> Settings:
    """The settings ``serve`` runs with in this environment (the command reads its own variables)."""
    return settings_from_args(build_parser().parse_args(["serve"]))


def _settings_from_pod_env(monkeypatch: pytest.MonkeyPatch) -> Settings:
    for key, value in _pod_env().items():
        if key.startswith("INPLACE_"):
            monkeypatch.setenv(key, value)
    return _serve_settings()


def _under(path: str, directory: str) -> bool:
    return PurePosixPath(directory) in PurePosixPath(path).parents


def test_kustomize_renders_exactly_the_expected_resources() -> None:
    kinds = {doc["kind"] for doc in rendered()}
    assert kinds == EXPECTED_KINDS
    for doc in rendered():
        if doc["kind"] not in CLUSTER_SCOPED:
            assert doc["metadata"].get("namespace") == NAMESPACE, doc["kind"]
        else:
            assert "namespace" not in doc["metadata"], doc["kind"]


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_resource_validates_against_its_schema(version: str) -> None:
    problems = {f"{d['kind']}/{d['metadata']['name']}": validation_errors(d, version) for d in rendered()}
    assert {k: v for k, v in problems.items() if v} == {}


@pytest.mark.parametrize(
    ("kind", "mutate", "expected"),
    [
        (
            "Deployment",
            lambda d: d["spec"]["template"]["spec"]["containers"][0].update(imagePullPolcy="x"),
            "imagePullPolcy",
        ),
        ("Deployment", lambda d: d["spec"].update(replicas="one"), "one"),
        ("Service", lambda d: d["spec"]["ports"][0].update(port="443"), "443"),
        ("ExtensionConfig", lambda d: d["spec"]["clientConfig"]["service"].update(port="443"), "443"),
        ("ExtensionConfig", lambda d: d["spec"].update(namespaceSelectr={}), "namespaceSelectr"),
        ("ExtensionConfig", lambda d: d["spec"]["settings"].update(retries=3), "3"),
        ("Certificate", lambda d: d["spec"].pop("secretName"), "secretName"),
        ("Certificate", lambda d: d["spec"]["usages"].append("sever auth"), "sever auth"),
        (
            "Issuer",
            lambda d: d["spec"]["selfSigned"].update(crlDistributionPoint=["x"]),
            "crlDistributionPoint",
        ),
        ("Role", lambda d: d["rules"][0].update(verb=["get"]), "verb"),
        ("ExtensionConfig", lambda d: d["metadata"]["annotations"].update(x=1), "metadata.annotations"),
    ],
)
def test_validation_rejects_broken_resources(kind: str, mutate: Any, expected: str) -> None:
    doc = copy.deepcopy(one(kind, "inplace-extension-config-reader" if kind == "Role" else None))
    mutate(doc)
    errors = validation_errors(doc, KUBERNETES_VERSIONS[-1])
    assert errors, f"a broken {kind} validated"
    assert expected in " ".join(errors)


def test_a_kind_without_schema_is_an_error_not_a_pass() -> None:
    doc = {"apiVersion": "example.com/v1", "kind": "Gadget", "metadata": {"name": "x"}}
    assert validation_errors(doc, KUBERNETES_VERSIONS[-1]) != []


def test_pod_runs_restricted_non_root_read_only() -> None:
    pod = one("Deployment")["spec"]["template"]["spec"]
    container = _container()
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    sc = container["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert sc.get("privileged", False) is False
    assert one("Namespace")["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    # the image's USER is what runAsUser/fsGroup assume
    user = dockerfile_stages()[-1].last("USER").args
    assert user == f"{pod['securityContext']['runAsUser']}:{pod['securityContext']['runAsGroup']}"
    assert pod["securityContext"]["fsGroup"] == pod["securityContext"]["runAsGroup"]
    assert container["resources"]["requests"]["cpu"] and container["resources"]["limits"]["memory"]


# volume types the "restricted" Pod Security Standard allows
RESTRICTED_VOLUMES = {
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
}


def test_the_attempt_jobs_pod_passes_the_restricted_profile_as_the_service_runs_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    settings = _settings_from_pod_env(monkeypatch)
    config = JobConfig(
        namespace=settings.job_namespace,
        image=_container()["image"],
        service_account=settings.job_service_account,
        deadline_seconds=settings.job_deadline_seconds,
        ttl_seconds=settings.job_ttl_seconds,
    )
    request = RunRequest(
        namespace="default", name="m1", fingerprint="ab" * 32, capabilities=("ntp",), inputs={}
    )
    job = job_manifest(config, request, 1, "node-1", episode="0123456789abcdef")
    assert job["metadata"]["namespace"] == one("Namespace")["metadata"]["name"]  # the restricted one
    pod = job["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["securityContext"]["runAsUser"] != 0
    assert not any(pod.get(key) for key in ("hostNetwork", "hostPID", "hostIPC"))
    for volume in pod["volumes"]:
        assert set(volume) - {"name"} <= RESTRICTED_VOLUMES, volume
    (container,) = pod["containers"]
    sc = container["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc.get("privileged", False) is False
    assert "ports" not in container
    # and its account is one deploy/ ships, held by the policy on its own Pod
    assert pod["serviceAccountName"] == one("ServiceAccount", "inplace-extension-attempt")["metadata"]["name"]


def test_two_replicas_that_keep_one_answering(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = one("Deployment")["spec"]
    # the record is on the Machines and the plays are Jobs: any replica answers any poll
    assert spec["replicas"] == 2
    assert spec["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1},
    }
    budget = one("PodDisruptionBudget")
    assert budget["spec"]["minAvailable"] == 1
    assert budget["spec"]["selector"]["matchLabels"] == spec["selector"]["matchLabels"]
    settings = _settings_from_pod_env(monkeypatch)
    assert settings.executor == "kubernetes"
    assert settings.job_namespace == NAMESPACE
    # the Jobs run this Pod's own image, read from the Pod the downward API names
    pod_name = next(e for e in _container()["env"] if e["name"] == "INPLACE_POD_NAME")
    assert pod_name["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert settings.job_image is None
    accounts = {d["metadata"]["name"] for d in rendered() if d["kind"] == "ServiceAccount"}
    assert settings.job_service_account in accounts


def test_probes_use_the_app_health_paths_on_the_https_port() -> None:
    container = _container()
    port_names = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "https", "scheme": "HTTPS"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "https", "scheme": "HTTPS"}
    assert port_names["https"] == int(_pod_env()["INPLACE_LISTEN"].rpartition(":")[2])


def test_every_inplace_variable_is_a_setting_and_parses(monkeypatch: pytest.MonkeyPatch) -> None:
    keys = [k for k in _pod_env() if k.startswith("INPLACE_")]
    assert keys
    unknown = [k for k in keys if k.removeprefix("INPLACE_").lower() not in Settings.model_fields]
    assert unknown == []
    settings = _settings_from_pod_env(monkeypatch)  # raises if a value does not parse
    assert settings.log_format == "json"
    assert not settings.allowed_cidrs  # shipped without a network: no host until one is configured


def test_mounted_paths_match_the_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = _settings_from_pod_env(monkeypatch)
    mounts, volumes = _mounts(), _volumes()
    assert settings.tls_cert is not None and settings.tls_key is not None and settings.inventory is not None
    # TLS: the cert-manager Secret's tls.crt/tls.key appear exactly where --tls-cert/--tls-key point
    tls_items = {item["path"] for item in volumes["tls"]["secret"]["items"]}
    assert str(settings.tls_cert) == f"{mounts['tls']}/tls.crt"
    assert str(settings.tls_key) == f"{mounts['tls']}/tls.key"
    assert tls_items == {"tls.crt", "tls.key"}
    # inventory file inside the inventory Secret mount
    assert str(settings.inventory.parent) == mounts["inventory"]
    # state: runs directory on the writable volume, and the image keeps HOME and Ansible's home there too
    assert _under(str(settings.runs_dir), mounts["state"])
    image_env = dockerfile_stages()[-1].env()
    assert _under(image_env["ANSIBLE_HOME"], mounts["state"]) or image_env["ANSIBLE_HOME"] == mounts["state"]
    assert image_env["HOME"] == mounts["state"]
    assert _under(image_env["ANSIBLE_LOCAL_TEMP"], mounts["tmp"])
    # the playbooks are where the image copies them
    copies = {i.args.split()[-1].rstrip("/"): i.args.split()[-2] for i in dockerfile_stages()[-1].all("COPY")}
    assert copies[str(settings.playbooks_dir)] == "playbooks/"
    # writable mounts are exactly the emptyDirs; Secrets are read-only
    for name, volume in volumes.items():
        readonly = next(m.get("readOnly", False) for m in _container()["volumeMounts"] if m["name"] == name)
        assert readonly == ("secret" in volume), name


def test_example_inventory_uses_the_ssh_mount() -> None:
    from inplace_extension.runs.inventory import Inventory

    example = yaml.safe_load((DEPLOY / "examples" / "inventory.yaml").read_text(encoding="utf-8"))
    inventory = Inventory.model_validate(example)
    keys = [inventory.defaults.private_key_file, *(h.private_key_file for h in inventory.hosts)]
    assert [k for k in keys if k is not None]
    for key in keys:
        if key is not None:
            assert _under(str(key), _mounts()["ssh"])
    # Secrets mounted 0440: the fsGroup can read them, and ssh accepts a key file owned by another uid
    assert _volumes()["ssh"]["secret"]["defaultMode"] == 0o440


def _grants(kind: str, name: str) -> set[tuple[str, str, str, str]]:
    """(apiGroup, resource, resourceName or "", verb) the role grants."""
    role = one(kind, name)
    return {
        (g, r, n, v)
        for rule in role["rules"]
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for n in rule.get("resourceNames", [""])
        for v in rule["verbs"]
    }


def _bound(name: str) -> list[tuple[str, str]]:
    """(role kind, role name) bound to the ServiceAccount ``name``."""
    return sorted(
        (d["roleRef"]["kind"], d["roleRef"]["name"])
        for d in rendered()
        if d["kind"] in {"RoleBinding", "ClusterRoleBinding"}
        for subject in d["subjects"]
        if (subject["kind"], subject["name"], subject["namespace"]) == ("ServiceAccount", name, NAMESPACE)
    )


def test_rbac_grants_the_service_and_its_jobs_only_what_they_use() -> None:
    assert _bound("inplace-extension") == [
        ("ClusterRole", "inplace-extension-records"),
        ("Role", "inplace-extension-config-reader"),
        ("Role", "inplace-extension-jobs"),
    ]
    assert _grants("Role", "inplace-extension-config-reader") == {
        ("", "configmaps", "inplace-extension-config", verb) for verb in ("get", "list", "watch")
    }
    # one Job per attempt and the Secret it owns (made first, then owned; a Job that did not start
    # deleted with it; its TTL shortened once its outcome is recorded); the Jobs' Pods, this Pod's own
    # image, and why a Job has no Pod (its Events)
    assert _grants("Role", "inplace-extension-jobs") == {
        ("batch", "jobs", "", "get"),
        ("batch", "jobs", "", "create"),
        ("batch", "jobs", "", "delete"),
        ("batch", "jobs", "", "patch"),
        ("", "secrets", "", "create"),
        ("", "secrets", "", "patch"),
        ("", "secrets", "", "delete"),
        ("", "pods", "", "get"),
        ("", "pods", "", "list"),
        ("", "events", "", "list"),
    }
    # the record on each Machine: read it, write it
    assert _grants("ClusterRole", "inplace-extension-records") == {
        ("cluster.x-k8s.io", "machines", "", "get"),
        ("cluster.x-k8s.io", "machines", "", "patch"),
    }
    # a Job's Pod publishes its phase on itself, and nothing more
    assert _bound("inplace-extension-attempt") == [("Role", "inplace-extension-attempt")]
    assert _grants("Role", "inplace-extension-attempt") == {("", "pods", "", "patch")}
    pod = one("Deployment")["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "inplace-extension"
    assert pod["automountServiceAccountToken"] is True
    # the Jobs' account mounts no token unless its Pod asks (the Job's Pod does: it publishes its phase)
    assert one("ServiceAccount", "inplace-extension-attempt")["automountServiceAccountToken"] is False
    # ... on its own Pod alone: the policy that says so applies to that very account
    _assert_policy_holds(
        rendered(), "inplace-extension-attempt-own-pod", "inplace-extension-attempt", NAMESPACE
    )


def _assert_policy_holds(docs: Any, policy: str, account: str, namespace: str) -> None:
    """The ValidatingAdmissionPolicy ``policy`` denies (failing closed) and matches the requests of the
    ServiceAccount ``account`` in ``namespace``, which the same rendering ships: a renamed account or
    namespace would leave the policy matching no one."""
    named = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    assert ("ServiceAccount", account) in named
    assert named[("ServiceAccount", account)]["metadata"]["namespace"] == namespace
    spec = named[("ValidatingAdmissionPolicy", policy)]["spec"]
    assert spec["failurePolicy"] == "Fail"
    (condition,) = spec["matchConditions"]
    assert condition["expression"].split("==")[1].strip() == f"'system:serviceaccount:{namespace}:{account}'"
    binding = named[("ValidatingAdmissionPolicyBinding", policy)]["spec"]
    assert binding == {"policyName": policy, "validationActions": ["Deny"]}


def test_service_certificate_and_extensionconfig_agree() -> None:
    service, cert, ext = one("Service"), one("Certificate"), one("ExtensionConfig")
    pod_labels = one("Deployment")["spec"]["template"]["metadata"]["labels"]
    # Service 443 -> the container's https port, selecting the Pod
    assert service["spec"]["ports"] == [
        {"name": "https", "port": 443, "targetPort": "https", "protocol": "TCP"}
    ]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    # CAPI dials https://<svc>.<ns>.svc:<port> and checks that name (docs/capi-hooks.md §1.3)
    svc_host = f"{service['metadata']['name']}.{NAMESPACE}.svc"
    assert svc_host in cert["spec"]["dnsNames"]
    assert "server auth" in cert["spec"]["usages"]
    assert ext["spec"]["clientConfig"] == {
        "service": {"name": service["metadata"]["name"], "namespace": NAMESPACE, "port": 443}
    }
    # one Secret: issued by cert-manager, served by the Pod, injected into caBundle by CAPI
    secret = cert["spec"]["secretName"]
    assert _volumes()["tls"]["secret"]["secretName"] == secret
    annotation = ext["metadata"]["annotations"]["runtime.cluster.x-k8s.io/inject-ca-from-secret"]
    assert annotation == f"{NAMESPACE}/{secret}"
    issuer = one("Issuer", cert["spec"]["issuerRef"]["name"])
    assert cert["spec"]["issuerRef"]["kind"] == "Issuer"
    assert "selfSigned" in issuer["spec"]


def test_extensionconfig_selects_namespaces_and_sends_settings_the_hooks_read() -> None:
    spec = one("ExtensionConfig")["spec"]
    # an empty selector would offer every namespace; the base opts namespaces in by label
    assert spec["namespaceSelector"]["matchLabels"]
    defaults = HookOptions.from_settings({})
    assert HookOptions.from_settings(spec["settings"]) == defaults  # the example values are the defaults
    for key, value in spec["settings"].items():
        assert value in {"true", "false"}
        # each key changes what the hooks do when flipped to "true": no typo'd, ignored keys
        assert HookOptions.from_settings({key: "true"}) != defaults, key


def test_images_are_overridable_by_name() -> None:
    kustomization = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text(encoding="utf-8"))
    names = {image["name"] for image in kustomization["images"]}
    assert _container()["image"].split(":")[0] in names
    assert _container()["image"] == f"inplace-extension:{kustomization['images'][0]['newTag']}"


def _with_client_auth(tmp_path: Path) -> tuple[dict[str, Any], ...]:
    """The base plus deploy/components/client-auth, through an overlay outside deploy/ (install-capi.md)."""
    base = os.path.relpath(DEPLOY, tmp_path)
    (tmp_path / "kustomization.yaml").write_text(
        f"resources:\n  - {base}\ncomponents:\n  - {base}/components/client-auth\n", encoding="utf-8"
    )
    return kustomize(tmp_path)


def test_client_auth_component_validates_and_points_settings_into_its_mounts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    docs = _with_client_auth(tmp_path)
    for version in KUBERNETES_VERSIONS:
        assert {d["kind"]: validation_errors(d, version) for d in docs if validation_errors(d, version)} == {}
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    base_env = {e["name"]: e["value"] for e in _container()["env"] if "value" in e}
    assert set(env) - set(base_env) == {"INPLACE_CLIENT_CA", "INPLACE_BEARER_TOKEN_FILE"}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    settings = _serve_settings()
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    secrets = {v["name"]: v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
    assert settings.client_ca is not None and settings.bearer_token_file is not None
    assert str(settings.client_ca.parent) == mounts["client-ca"]
    assert str(settings.bearer_token_file.parent) == mounts["token"]
    assert secrets["client-ca"] == "inplace-extension-client-ca"
    assert secrets["token"] == "inplace-extension-token"
    # the base's mounts and probes are untouched: probes stay open under client auth (inplace_extension.auth)
    assert container["livenessProbe"] == _container()["livenessProbe"]
    assert {m["name"] for m in _container()["volumeMounts"]} < set(mounts)


def test_kube_aware_component_validates_and_grants_only_what_the_mode_uses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = os.path.relpath(DEPLOY, tmp_path)
    (tmp_path / "kustomization.yaml").write_text(
        f"resources:\n  - {base}\ncomponents:\n  - {base}/components/kube-aware\n", encoding="utf-8"
    )
    docs = kustomize(tmp_path)
    for version in KUBERNETES_VERSIONS:
        assert {d["kind"]: validation_errors(d, version) for d in docs if validation_errors(d, version)} == {}
    by_kind = {
        d["kind"]: d
        for d in docs
        if d["metadata"]["name"] in ("inplace-extension", "inplace-extension-kube-aware")
    }
    assert by_kind["ServiceAccount"]["automountServiceAccountToken"] is True
    pod = by_kind["Deployment"]["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is True
    for item in pod["containers"][0]["env"]:
        if "value" in item:
            monkeypatch.setenv(item["name"], item["value"])
    assert _serve_settings().kube_aware
    rules = {
        (g, r, v)
        for rule in by_kind["ClusterRole"]["rules"]
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for v in rule["verbs"]
    }
    assert rules == {
        ("cluster.x-k8s.io", "machines", "get"),
        ("cluster.x-k8s.io", "machines", "patch"),
        ("cluster.x-k8s.io", "clusters", "get"),
        ("cluster.x-k8s.io", "machinedeployments", "get"),
        ("controlplane.cluster.x-k8s.io", "kubeadmcontrolplanes", "get"),
        ("", "events", "create"),
        ("", "secrets", "get"),
        # the providers' last-applied tags UpdateMachine waits for (inplace/infra_tags.py's table)
        *(("infrastructure.cluster.x-k8s.io", plural_of(row.kind), "get") for row in PROVIDER_TAGS),
    }
    subjects = {(s["name"], s["namespace"]) for s in by_kind["ClusterRoleBinding"]["subjects"]}
    # the service alone: the Jobs have rights of their own, and no Secret among them
    assert subjects == {("inplace-extension", "inplace-extension-system")}
    named = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    attempt_bindings = {
        (d["kind"], d["roleRef"]["name"])
        for d in docs
        if d["kind"] in {"RoleBinding", "ClusterRoleBinding"}
        for s in d["subjects"]
        if s["name"] == "inplace-extension-attempt"
    }
    assert attempt_bindings == {
        ("RoleBinding", "inplace-extension-attempt"),
        ("ClusterRoleBinding", "inplace-extension-attempt-kube-aware"),
    }
    attempt_rules = {
        (g, r, v)
        for rule in named[("ClusterRole", "inplace-extension-attempt-kube-aware")]["rules"]
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for v in rule["verbs"]
    }
    # what a play does around its steps (kube/machines.py, events.py, drain.py, budgets.py,
    # update_condition.py); every write held by a policy to the fields it sets
    assert attempt_rules == {
        ("cluster.x-k8s.io", "machines", "get"),
        ("cluster.x-k8s.io", "machines", "patch"),
        ("", "events", "create"),
        ("", "nodes", "get"),
        ("", "nodes", "patch"),
        ("", "nodes/status", "patch"),
        ("", "pods", "list"),
        ("", "pods/eviction", "create"),
        ("policy", "poddisruptionbudgets", "list"),
    }
    assert not {r for _, r, _ in attempt_rules} & {"secrets", "jobs", "roles", "rolebindings"}
    for policy in (
        "inplace-extension-attempt-own-pod",
        "inplace-extension-attempt-machine-marks",
        "inplace-extension-attempt-node-cordon",
    ):
        _assert_policy_holds(docs, policy, "inplace-extension-attempt", "inplace-extension-system")


def test_the_mcm_agent_runs_two_replicas_with_the_kubernetes_executor() -> None:
    docs = kustomize(DEPLOY / "mcm")
    for version in KUBERNETES_VERSIONS:
        assert {d["kind"]: validation_errors(d, version) for d in docs if validation_errors(d, version)} == {}
    named = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    deployment = named[("Deployment", "inplace-extension-mcm-agent")]
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"]["type"] == "RollingUpdate"
    budget = named[("PodDisruptionBudget", "inplace-extension-mcm-agent")]
    assert budget["spec"]["selector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
    env = {e["name"]: e for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["INPLACE_EXECUTOR"]["value"] == "kubernetes"
    assert env["INPLACE_POD_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    namespace = deployment["metadata"]["namespace"]
    assert env["INPLACE_JOB_NAMESPACE"]["value"] == namespace
    attempt = env["INPLACE_JOB_SERVICE_ACCOUNT"]["value"]
    assert named[("ServiceAccount", attempt)]["automountServiceAccountToken"] is False
    jobs = named[("Role", "inplace-extension-mcm-agent-jobs")]
    assert {
        (r["apiGroups"][0], res, v) for r in jobs["rules"] for res in r["resources"] for v in r["verbs"]
    } == {
        ("batch", "jobs", "get"),
        ("batch", "jobs", "create"),
        ("batch", "jobs", "delete"),
        ("batch", "jobs", "patch"),
        ("", "secrets", "create"),
        ("", "secrets", "patch"),
        ("", "secrets", "delete"),
        ("", "pods", "get"),
        ("", "pods", "list"),
        ("", "events", "list"),
    }
    assert named[("Role", attempt)]["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["patch"]}
    ]
    # ... its own Pod alone; the namespace enforces the restricted profile, as the base's does
    _assert_policy_holds(docs, "inplace-extension-mcm-attempt-own-pod", attempt, namespace)
    labels = named[("Namespace", namespace)]["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"


def test_the_network_policy_component_validates_and_admits_only_hooks_dns_api_and_ssh(tmp_path: Path) -> None:
    base = os.path.relpath(DEPLOY, tmp_path)
    (tmp_path / "kustomization.yaml").write_text(
        f"resources:\n  - {base}\ncomponents:\n  - {base}/components/network-policy\n", encoding="utf-8"
    )
    docs = kustomize(tmp_path)
    for version in KUBERNETES_VERSIONS:
        assert {d["kind"]: validation_errors(d, version) for d in docs if validation_errors(d, version)} == {}
    policies = {d["metadata"]["name"]: d["spec"] for d in docs if d["kind"] == "NetworkPolicy"}
    assert set(policies) == {"inplace-extension", "inplace-extension-attempt"}
    service, attempt = policies["inplace-extension"], policies["inplace-extension-attempt"]
    # each selects the Pods it is for: the Deployment's, and the Jobs' (kubejobs/manifest.py's labels)
    pod_labels = one("Deployment")["spec"]["template"]["metadata"]["labels"]
    assert service["podSelector"]["matchLabels"].items() <= pod_labels.items()
    job_labels = job_manifest(
        JobConfig(namespace=NAMESPACE, image="x", service_account="a", deadline_seconds=1, ttl_seconds=1),
        RunRequest(namespace="default", name="m1", fingerprint="ab" * 32, capabilities=("ntp",), inputs={}),
        1,
        None,
        episode="0123456789abcdef",
    )["spec"]["template"]["metadata"]["labels"]
    assert attempt["podSelector"]["matchLabels"].items() <= job_labels.items()
    assert not service["podSelector"]["matchLabels"].items() <= job_labels.items()
    for spec in (service, attempt):
        assert spec["policyTypes"] == ["Ingress", "Egress"]

    def ports(rules: list[dict[str, Any]]) -> set[tuple[str, int, tuple[str, ...]]]:
        return {
            (p["protocol"], p["port"], tuple(t["ipBlock"]["cidr"] for t in rule.get("to", [])))
            for rule in rules
            for p in rule["ports"]
        }

    # in: the hook port alone (the container's https port), and nothing to a Job
    (https,) = [p for p in _container()["ports"] if p["name"] == "https"]
    assert ports(service["ingress"]) == {("TCP", https["containerPort"], ())}
    assert attempt["ingress"] == []
    api_and_dns = {("UDP", 53, ()), ("TCP", 53, ()), ("TCP", 443, ()), ("TCP", 6443, ())}
    assert ports(service["egress"]) == api_and_dns
    # SSH to the documentation range until an overlay names the allowed CIDRs: no host by default
    assert ports(attempt["egress"]) == api_and_dns | {("TCP", 22, ("192.0.2.0/24",))}
