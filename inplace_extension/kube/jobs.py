"""Jobs and the Secrets they own, and one Pod's phase annotation: the ``kubernetes`` executor's calls.

A Job is created first and its Secret second, with an ownerReference to the Job's uid, so the garbage
collector deletes the Secret with the Job (after its ``ttlSecondsAfterFinished``). A Job that exists
already (AlreadyExists, HTTP 409) was created by another replica for the same attempt: it is not an
error. A Job's state is read from its conditions and from its Pod (found by the job controller's
``batch.kubernetes.io/job-name`` label): the container's termination message, and the phase the Pod
annotated itself with. Whether it has finished alone is one read of the Job (a wait for its end looks
at that only, and reads the Pod once it has).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any, Final, cast

from lightkube import Client
from lightkube.resources.batch_v1 import Job
from lightkube.resources.core_v1 import Pod, Secret
from lightkube.types import PatchType

from inplace_extension.kube.client import plain, translated
from inplace_extension.kube.errors import Conflict, NotFound
from inplace_extension.kube.port import JobState

JOB_NAME_LABEL: Final = "batch.kubernetes.io/job-name"  # set by the job controller on the Job's Pods
PHASE_ANNOTATION: Final = "inplace-extension.io/phase"


def create_job(client: Client, job: Mapping[str, Any], secret: Mapping[str, Any]) -> bool:
    """Create ``job``, then ``secret`` owned by it; False when the Job existed (its Secret is created if
    the replica that created the Job died before it could)."""
    metadata = job["metadata"]
    namespace, name = str(metadata["namespace"]), str(metadata["name"])
    created = True
    try:
        with translated(f"create Job {namespace}/{name}"):
            made = plain(client.create(cast(Job, Job.from_dict(dict(job)))))
    except Conflict:
        created = False
        with translated(f"get Job {namespace}/{name}"):
            made = plain(client.get(Job, name, namespace=namespace))
    owned = copy.deepcopy(dict(secret))
    owned["metadata"]["ownerReferences"] = [
        {"apiVersion": "batch/v1", "kind": "Job", "name": name, "uid": made["metadata"]["uid"]}
    ]
    try:
        with translated(f"create Secret {namespace}/{owned['metadata']['name']}"):
            client.create(cast(Secret, Secret.from_dict(owned)))
    except Conflict:
        pass  # created with the Job by whoever created it
    return created


def _finished(job: Mapping[str, Any]) -> bool:
    for condition in (job.get("status") or {}).get("conditions") or []:
        if condition.get("type") in ("Complete", "Failed") and condition.get("status") == "True":
            return True
    return False


def job_finished(client: Client, namespace: str, name: str) -> bool | None:
    """One GET of the Job (its Pods not listed): the cheap look of a wait for its end."""
    try:
        with translated(f"get Job {namespace}/{name}"):
            job = plain(client.get(Job, name, namespace=namespace))
    except NotFound:
        return None
    return _finished(job)


def job_state(client: Client, namespace: str, name: str) -> JobState | None:
    try:
        with translated(f"get Job {namespace}/{name}"):
            job = plain(client.get(Job, name, namespace=namespace))
    except NotFound:
        return None
    with translated(f"list the Pods of Job {namespace}/{name}"):
        pods = [plain(pod) for pod in client.list(Pod, namespace=namespace, labels={JOB_NAME_LABEL: name})]
    message: str | None = None
    phase: str | None = None
    for pod in pods:  # backoffLimit 0: one Pod; a replacement after an eviction would be a second
        phase = ((pod.get("metadata") or {}).get("annotations") or {}).get(PHASE_ANNOTATION) or phase
        for status in (pod.get("status") or {}).get("containerStatuses") or []:
            terminated = (status.get("state") or {}).get("terminated") or {}
            if terminated.get("message"):
                message = str(terminated["message"])
    return JobState(finished=_finished(job), termination_message=message, phase=phase)


def pod_image(client: Client, namespace: str, name: str) -> str | None:
    try:
        with translated(f"get Pod {namespace}/{name}"):
            pod = plain(client.get(Pod, name, namespace=namespace))
    except NotFound:
        return None
    containers = (pod.get("spec") or {}).get("containers") or []
    return str(containers[0]["image"]) if containers and containers[0].get("image") else None


def annotate_pod(client: Client, namespace: str, name: str, key: str, value: str) -> None:
    patch = {"metadata": {"annotations": {key: value}}}
    with translated(f"annotate Pod {namespace}/{name}"):
        client.patch(Pod, name, patch, namespace=namespace, patch_type=PatchType.MERGE)
