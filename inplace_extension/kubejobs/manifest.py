"""The Job of one attempt and the Secret it owns, as manifests (plain dicts; pure, no I/O).

The Job's name is derived from the run ident and the attempt number only, so every replica that
launches the same attempt names the same Job and the API server lets one of them create it. It runs the
service's image with ``attempt --spec <the Secret's file>``: nothing of the request is in its env, args,
labels or annotations; the request data is in the Secret, and so is the one SSH private key the attempt
needs (its target's, copied by the service from its own SSH mount): a Job never sees another host's
key. ``backoffLimit: 0``: a retry is the service's decision, and a new attempt is a new Job. A finished
Job is kept until its outcome is in the record (:data:`JOB_TTL_BACKSTOP_SECONDS` at most), then
``--job-ttl-seconds`` (the backend shortens its TTL).
"""

from __future__ import annotations

import base64
import hashlib
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Final

from inplace_extension.runs.model import RunRequest
from inplace_extension.runs.resolve import HostTarget
from inplace_extension.settings import Settings

APP: Final = "inplace-extension"
COMPONENT: Final = "attempt"
MACHINE_LABEL: Final = "inplace-extension.io/machine"
NAMESPACE_LABEL: Final = "inplace-extension.io/namespace"
ATTEMPT_LABEL: Final = "inplace-extension.io/attempt"
# what tells an attempt's Pod from a user's workload (a drain waits for it, never evicts it)
ATTEMPT_POD_LABELS: Final = (("app.kubernetes.io/name", APP), ("app.kubernetes.io/component", COMPONENT))
RUN_LABEL: Final = "inplace-extension.io/run"  # a hash of the run ident (names are too long for a label)
# the episode of the run's desired state the attempt belongs to (kubejobs/record.py): A -> B -> A makes two
EPISODE_LABEL: Final = "inplace-extension.io/episode"
DEPLOYMENT_LABEL: Final = "inplace-extension.io/machine-deployment"
SET_LABEL: Final = "inplace-extension.io/machine-set"
# the owners CAPI labels its Machines with
CAPI_OWNER_LABELS: Final = {
    "cluster.x-k8s.io/deployment-name": DEPLOYMENT_LABEL,
    "cluster.x-k8s.io/set-name": SET_LABEL,
}
SPEC_DIR: Final = "/etc/inplace-extension/attempt"
SSH_KEY: Final = "ssh-key"  # the Secret's key (and file in SPEC_DIR) of the target's private key
ATTEMPT_KEY_FILE: Final = f"{SPEC_DIR}/{SSH_KEY}"
# the workload cluster's kubeconfig, when the Job drains with it (the Kubernetes-aware mode, a workload
# cluster other than the one the Job runs in): the service copies it, so the Job reads no Secret itself
WORKLOAD_KUBECONFIG: Final = "workload-kubeconfig"
WORKLOAD_KUBECONFIG_FILE: Final = f"{SPEC_DIR}/{WORKLOAD_KUBECONFIG}"
# the Secret's files: owned by root, group fsGroup (the kubelet adds group read for it on every file of
# a Secret volume, so no narrower mode can be read by the Pod's user), writable by no one. OpenSSH accepts
# a key it does not own.
SECRET_MODE: Final = 0o440
STATE_DIR: Final = "/var/lib/inplace-extension"
RUNS_DIR: Final = f"{STATE_DIR}/runs"
TERMINATION_LOG: Final = "/dev/termination-log"
# where in-cluster clients read the ServiceAccount's token, CA and namespace
SERVICE_ACCOUNT_DIR: Final = "/var/run/secrets/kubernetes.io/serviceaccount"
TOKEN_SECONDS: Final = 3607  # what the ServiceAccount admission plugin asks the kubelet for
UID: Final = 10001
# SIGTERM to SIGKILL when the Pod is deleted or evicted: the attempt stops its play on SIGTERM and writes
# its outcome within seconds (kubejobs/attempt.py's KILL_AFTER_SECONDS), Kubernetes' default leaves room
STOP_GRACE_SECONDS: Final = 30
# a finished Job's ttlSecondsAfterFinished until its outcome is in the record (then --job-ttl-seconds):
# the outcome lives in its Pod's termination message until a replica copies it, so the Job must outlive
# any pause in the polls (a service scaled down, CAPI's backoff); the TTL controller deletes it after a
# week at the latest
JOB_TTL_BACKSTOP_SECONDS: Final = 7 * 86400
_LABEL_VALUE_CUT = re.compile(r"[^A-Za-z0-9]+$")


@dataclass(frozen=True, kw_only=True)
class JobConfig:
    """Where and how the Jobs run (from the settings)."""

    namespace: str
    image: str
    service_account: str
    deadline_seconds: int
    ttl_seconds: int  # how long a finished Job is kept once its outcome is in the record

    @classmethod
    def of(cls, settings: Settings, image: str) -> JobConfig:
        """The ``--job-*`` settings, for Jobs of ``image``."""
        return cls(
            namespace=settings.job_namespace,
            image=image,
            service_account=settings.job_service_account,
            deadline_seconds=settings.job_deadline_seconds,
            ttl_seconds=settings.job_ttl_seconds,
        )


def target_in_job(target: HostTarget, private_key: bytes | None) -> HostTarget:
    """``target`` as the play in a Job reaches it: with a private key, the Job's own copy of it, mounted
    from the Job's own Secret (the service's path does not exist in the Pod)."""
    return target if private_key is None else replace(target, private_key_file=Path(ATTEMPT_KEY_FILE))


def job_name(ident: str, attempt: int, *, episode: str) -> str:
    """``inplace-<16 hex of sha256(ident)>-<episode>-<attempt>``: a DNS label, the same in every replica.
    The episode (kubejobs/record.py) sets a desired state that comes back (A -> B -> A) apart from its
    earlier episode, whose Job may still exist (``--job-ttl-seconds``): that Job never has this name."""
    return f"inplace-{hashlib.sha256(ident.encode()).hexdigest()[:16]}-{episode}-{attempt}"


def run_label(ident: str) -> str:
    return hashlib.sha256(ident.encode()).hexdigest()[:16]


def label_value(value: str) -> str:
    """A name as a label value: at most 63 characters, ending with a letter or digit."""
    return _LABEL_VALUE_CUT.sub("", value[:63])


def labels(request: RunRequest, attempt: int, *, episode: str) -> dict[str, str]:
    """What an operator selects Jobs by: the app, the Machine (or Node), its namespace, its
    MachineDeployment and MachineSet when CAPI labelled it with them, the run, its episode and the
    attempt."""
    result = {
        **dict(ATTEMPT_POD_LABELS),
        MACHINE_LABEL: label_value(request.name),
        NAMESPACE_LABEL: label_value(request.namespace),
        RUN_LABEL: run_label(request.ident),
        EPISODE_LABEL: episode,
        ATTEMPT_LABEL: str(attempt),
    }
    for theirs, ours in CAPI_OWNER_LABELS.items():
        if request.labels.get(theirs):
            result[ours] = label_value(request.labels[theirs])
    return result


def secret_manifest(
    config: JobConfig,
    name: str,
    spec_text: str,
    job_labels: dict[str, str],
    private_key: bytes | None = None,
    workload_kubeconfig: bytes | None = None,
) -> dict[str, Any]:
    """The Secret with the attempt spec, the target's private key (``private_key``: None when the
    inventory names none) and the kubeconfig of the workload cluster the Job drains in (None: it drains
    with its own account, or not at all); its ownerReference to the Job is added once the Job exists."""
    secret: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": config.namespace, "labels": dict(job_labels)},
        "type": "Opaque",
        "stringData": {"attempt.json": spec_text},
    }
    data = {SSH_KEY: private_key, WORKLOAD_KUBECONFIG: workload_kubeconfig}
    encoded = {
        key: base64.b64encode(value).decode("ascii") for key, value in data.items() if value is not None
    }
    if encoded:
        secret["data"] = encoded
    return secret


def _api_access() -> dict[str, Any]:
    """The projected volume the ServiceAccount admission plugin would add: a bound token the kubelet
    requests and refreshes, the cluster's CA (``kube-root-ca.crt``) and the Pod's namespace."""
    return {
        "defaultMode": 0o444,
        "sources": [
            {"serviceAccountToken": {"path": "token", "expirationSeconds": TOKEN_SECONDS}},
            {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
            {
                "downwardAPI": {
                    "items": [{"path": "namespace", "fieldRef": {"fieldPath": "metadata.namespace"}}]
                }
            },
        ],
    }


def job_manifest(
    config: JobConfig, request: RunRequest, attempt: int, node: str | None, *, episode: str
) -> dict[str, Any]:
    """The Job of ``request``'s attempt ``attempt`` in ``episode``; ``node``: the Node it updates, which
    the Job's Pod keeps off (when known and in the cluster the Job runs in)."""
    name = job_name(request.ident, attempt, episode=episode)
    job_labels = labels(request, attempt, episode=episode)
    affinity: dict[str, Any] = {}
    if node:
        affinity = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": [node]}
                            ]
                        }
                    ]
                }
            }
        }
    container = {
        "name": COMPONENT,
        "image": config.image,
        "imagePullPolicy": "IfNotPresent",
        "args": ["attempt", "--spec", f"{SPEC_DIR}/attempt.json"],
        "env": [
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
            {"name": "INPLACE_RUNS_DIR", "value": RUNS_DIR},
        ],
        "terminationMessagePath": TERMINATION_LOG,
        "terminationMessagePolicy": "File",
        "resources": {
            # one Python CLI and one ansible-playbook with one fork: measured 128-138 MB peak per Job,
            # page cache included (bench/executors.py, issue 43), so the request reserves that and the
            # limit is well above it; 2.5 CPU seconds per Job, so 100m covers a Job of 25 s or more on
            # average (docs/scaling.md)
            "requests": {"cpu": "100m", "memory": "160Mi"},
            "limits": {"memory": "512Mi"},
        },
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "privileged": False,
            "capabilities": {"drop": ["ALL"]},
        },
        "volumeMounts": [
            {"name": "attempt", "mountPath": SPEC_DIR, "readOnly": True},
            {"name": "state", "mountPath": STATE_DIR},
            {"name": "tmp", "mountPath": "/tmp"},  # noqa: S108 -- the container's own emptyDir
            {"name": "kube-api-access", "mountPath": SERVICE_ACCOUNT_DIR, "readOnly": True},
        ],
    }
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": STOP_GRACE_SECONDS,
        "serviceAccountName": config.service_account,
        # the Pod publishes its phase on itself through the API: the only call it makes without a
        # cluster side (with one, the drain at the drain point too). Its token is declared below rather
        # than left to the ServiceAccount admission plugin, so the Pod has it also where that plugin
        # does not run (a cluster that runs it leaves a Pod alone that mounts this path itself)
        "automountServiceAccountToken": False,
        "nodeSelector": {"kubernetes.io/os": "linux"},
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": UID,
            "runAsGroup": UID,
            "fsGroup": UID,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [container],
        "volumes": [
            # the attempt spec and its target's private key: the only Secret the Pod mounts
            {"name": "attempt", "secret": {"secretName": name, "defaultMode": SECRET_MODE}},
            # scratch only: the attempt's directory and ansible-runner's artifacts; the outcome leaves
            # through the termination message and the record is the Machine's (or Node's) annotation
            {"name": "state", "emptyDir": {"sizeLimit": "1Gi"}},
            {"name": "tmp", "emptyDir": {"sizeLimit": "256Mi"}},
            {"name": "kube-api-access", "projected": _api_access()},
        ],
    }
    if affinity:
        pod_spec["affinity"] = affinity
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": config.namespace, "labels": job_labels},
        "spec": {
            "backoffLimit": 0,
            "activeDeadlineSeconds": config.deadline_seconds,
            # until a replica has its outcome in the record; then --job-ttl-seconds (backend.py)
            "ttlSecondsAfterFinished": JOB_TTL_BACKSTOP_SECONDS,
            "template": {"metadata": {"labels": job_labels}, "spec": pod_spec},
        },
    }
