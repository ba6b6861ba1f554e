"""The Job of one attempt and its Secret (kubejobs/manifest.py, spec.py): a name every replica derives
alike, labels an operator selects by, kept off the Node it updates, bounded in time, non-root, and no
request data anywhere but in the Secret."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

from inplace_extension.kubejobs.attempt import KILL_AFTER_SECONDS
from inplace_extension.kubejobs.manifest import (
    JOB_TTL_BACKSTOP_SECONDS,
    STOP_GRACE_SECONDS,
    job_manifest,
    job_name,
    labels,
    secret_manifest,
)
from inplace_extension.kubejobs.spec import (
    TERMINATION_MESSAGE_LIMIT,
    AttemptSpec,
    outcome_of,
    termination_message,
)
from inplace_extension.runs.attempts import Outcome, OutcomeKind
from inplace_extension.runs.model import CommandCheck, RunRequest
from inplace_extension.runs.resolve import HostTarget
from kubejobs import support

SECRET_VALUE = "hunter2-very-secret-file-content"
CONFIG = replace(support.CONFIG, image="registry.example/inplace-extension:0.1.0")  # as a release names it
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
EPISODE = "0123456789abcdef"  # as kubejobs/record.py draws one


def request(name: str = "md-0-abcde-x7k2p") -> RunRequest:
    return RunRequest(
        namespace="team-a",
        name=name,
        fingerprint="cd" * 32,
        capabilities=("kubeadm_files",),
        inputs={"kubeadm_files": {"kubeadm_files_files": [{"path": "/etc/x", "content": SECRET_VALUE}]}},
        labels={"cluster.x-k8s.io/deployment-name": "md-0", "cluster.x-k8s.io/set-name": "md-0-abcde"},
    )


def target() -> HostTarget:
    return HostTarget(
        address="10.1.0.7",
        port=22,
        user="ansible",
        private_key_file=Path("/etc/inplace-extension/ssh/id_ed25519"),
        become=True,
        host_keys=("ssh-ed25519 AAAA",),
        insecure_skip_host_key_check=False,
        python_interpreter=None,
        source="inventory",
    )


def test_the_job_name_is_a_dns_label_derived_from_the_ident_episode_and_attempt_alone() -> None:
    first = job_name(request().ident, 1, episode=EPISODE)
    assert first == job_name(request().ident, 1, episode=EPISODE), "every replica names the same Job"
    assert first != job_name(request().ident, 2, episode=EPISODE)
    assert first != job_name(request("other").ident, 1, episode=EPISODE)
    assert first != job_name(request().ident, 1, episode="fedcba9876543210"), "a revert's Job is its own"
    longest = job_name("x" * 300, 12345, episode=EPISODE)
    assert DNS_LABEL.match(first) and DNS_LABEL.match(longest) and len(longest) <= 63


def test_the_job_is_selectable_kept_off_its_node_bounded_in_time_and_non_root() -> None:
    job = job_manifest(CONFIG, request(), 3, "node-7", episode=EPISODE)
    assert job["metadata"]["name"] == job_name(request().ident, 3, episode=EPISODE)
    assert job["metadata"]["namespace"] == CONFIG.namespace
    want = {
        "app.kubernetes.io/name": "inplace-extension",
        "app.kubernetes.io/component": "attempt",
        "inplace-extension.io/machine": "md-0-abcde-x7k2p",
        "inplace-extension.io/namespace": "team-a",
        "inplace-extension.io/machine-deployment": "md-0",
        "inplace-extension.io/machine-set": "md-0-abcde",
        "inplace-extension.io/episode": EPISODE,
        "inplace-extension.io/attempt": "3",
    }
    assert want.items() <= job["metadata"]["labels"].items()
    assert job["spec"]["template"]["metadata"]["labels"] == job["metadata"]["labels"]
    spec = job["spec"]
    assert spec["backoffLimit"] == 0
    assert spec["activeDeadlineSeconds"] == 1800
    # --job-ttl-seconds only once its outcome is in the record (the backend shortens it)
    assert spec["ttlSecondsAfterFinished"] == JOB_TTL_BACKSTOP_SECONDS
    # a deleted Pod's attempt stops its play (SIGTERM, then SIGKILL) and writes its outcome before SIGKILL
    grace = spec["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace == STOP_GRACE_SECONDS >= 4 * KILL_AFTER_SECONDS
    pod = spec["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    assert pod["serviceAccountName"] == "inplace-extension-attempt"
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms["nodeSelectorTerms"] == [
        {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "NotIn", "values": ["node-7"]}]}
    ]
    assert pod["securityContext"]["runAsNonRoot"] is True
    (container,) = pod["containers"]
    assert container["image"] == CONFIG.image
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["terminationMessagePolicy"] == "File"
    assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]
    # above the measured peak of one Job (140-150 MB, page cache included): 160Mi is 168 MB
    assert container["resources"]["requests"]["memory"] == "160Mi"
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert mounts["attempt"]["readOnly"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    # its own Secret alone (the spec and its target's key), readable by the Pod's group, writable by none
    assert [v["secret"] for v in pod["volumes"] if "secret" in v] == [
        {"secretName": job["metadata"]["name"], "defaultMode": 0o440}
    ]
    assert pod["securityContext"]["fsGroup"] == pod["securityContext"]["runAsGroup"]
    assert "emptyDir" in volumes["state"]


def test_the_pod_declares_its_own_token_so_it_needs_no_service_account_admission_plugin() -> None:
    pod = job_manifest(CONFIG, request(), 1, None, episode=EPISODE)["spec"]["template"]["spec"]
    # not left to the admission plugin (a cluster may not run it): the token is the Pod's own volume
    assert pod["automountServiceAccountToken"] is False
    (container,) = pod["containers"]
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert mounts["kube-api-access"] == {
        "name": "kube-api-access",
        "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
        "readOnly": True,
    }
    volumes = {v["name"]: v for v in pod["volumes"]}
    sources = volumes["kube-api-access"]["projected"]["sources"]
    token, ca, namespace = sources
    assert token["serviceAccountToken"]["path"] == "token"
    assert 600 <= token["serviceAccountToken"]["expirationSeconds"] <= 3607  # bound, refreshed by the kubelet
    assert ca["configMap"] == {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}
    assert namespace["downwardAPI"]["items"] == [
        {"path": "namespace", "fieldRef": {"fieldPath": "metadata.namespace"}}
    ]


def test_without_a_known_node_there_is_no_affinity_and_long_names_make_valid_label_values() -> None:
    job = job_manifest(CONFIG, request("m" * 200), 1, None, episode=EPISODE)
    assert "affinity" not in job["spec"]["template"]["spec"]
    assert len(job["metadata"]["labels"]["inplace-extension.io/machine"]) == 63


def test_request_data_is_only_in_the_secret() -> None:
    spec = AttemptSpec(
        request=request(),
        target=target(),
        number=1,
        token="",
        lock_token="lock-1",
        takeover_tokens=(),
        host_checks=(CommandCheck("app", ("true",), 5.0),),
        role_vars={"x": 1},
        roles_paths=(),
    )
    job = job_manifest(CONFIG, request(), 1, None, episode=EPISODE)
    secret = secret_manifest(
        CONFIG, job["metadata"]["name"], spec.encode(), labels(request(), 1, episode=EPISODE)
    )
    assert SECRET_VALUE not in json.dumps(job)
    assert "lock-1" not in json.dumps(job)
    assert SECRET_VALUE in secret["stringData"]["attempt.json"]
    assert AttemptSpec.decode(secret["stringData"]["attempt.json"]) == spec


def test_the_outcome_fits_the_termination_message_and_reads_back() -> None:
    outcome = Outcome(
        OutcomeKind.TASK_FAILED, capability="ntp", task="Write config", detail="x" * 20000, finished=5.0
    )
    text = termination_message(outcome)
    assert len(text.encode()) <= TERMINATION_MESSAGE_LIMIT
    back = outcome_of(text)
    assert back is not None
    assert (back.kind, back.capability, back.task, back.finished) == (
        OutcomeKind.TASK_FAILED,
        "ntp",
        "Write config",
        5.0,
    )
    assert outcome_of(None) is None and outcome_of("killed") is None
