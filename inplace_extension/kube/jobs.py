"""Jobs and the Secrets they own, and one Pod's phase annotation: the ``kubernetes`` executor's calls.

The Secret is created first and the Job second, then the Secret gets an ownerReference to the Job's uid,
so the garbage collector deletes it with the Job (after its ``ttlSecondsAfterFinished``, which the
service shortens once the Job's outcome is in its record): there is
never a Job without its Secret (a Pod that would wait in ContainerCreating for it until the Job's
deadline). A Secret that exists already was created for the same attempt by a replica killed before
its Job (:func:`create_job` with no Secret makes that Job from it); a Job that exists already
(AlreadyExists, HTTP 409) was created by another replica for the same attempt: neither is an error.

A Job's state is read from its conditions and from its Pod (found by the job controller's
``batch.kubernetes.io/job-name`` label): the container's termination message, the phase the Pod
annotated itself with, and, while it has not started, why it cannot (:func:`not_starting`: unschedulable,
an image that cannot be pulled, a missing Secret or ServiceAccount). Whether it has finished alone is one
read of the Job (a wait for its end looks at that only, and reads the Pod once it has).
"""

from __future__ import annotations

import base64
import copy
from collections.abc import Mapping, Sequence
from typing import Any, Final, cast

from lightkube import Client
from lightkube.resources.batch_v1 import Job
from lightkube.resources.core_v1 import Event, Pod, Secret
from lightkube.types import CascadeType, PatchType

from inplace_extension.kube.client import plain, translated
from inplace_extension.kube.errors import Conflict, Forbidden, NotFound
from inplace_extension.kube.port import JobState

JOB_NAME_LABEL: Final = "batch.kubernetes.io/job-name"  # set by the job controller on the Job's Pods
PHASE_ANNOTATION: Final = "inplace-extension.io/phase"
ATTEMPT_VOLUME: Final = "attempt"  # the Job's volume of its attempt's Secret (kubejobs/manifest.py)


def create_job(client: Client, job: Mapping[str, Any], secret: Mapping[str, Any] | None) -> bool:
    """Create ``secret``, then ``job``, then make the Job the Secret's owner; False when the Job existed.
    ``secret`` None: the Secret exists already (created for this attempt by a replica killed before the
    Job), NotFound when it does not (the Job is then not created: its Pod could never start)."""
    metadata = job["metadata"]
    namespace, name = str(metadata["namespace"]), str(metadata["name"])
    if secret is None:
        secret_name = _secret_of(job)
        # that it exists, by the right the owner's patch below needs anyway (no right to read Secrets)
        with translated(f"patch Secret {namespace}/{secret_name}"):
            client.patch(
                Secret, secret_name, {"metadata": {}}, namespace=namespace, patch_type=PatchType.MERGE
            )
    else:
        secret_name = str(secret["metadata"]["name"])
        try:
            with translated(f"create Secret {namespace}/{secret_name}"):
                client.create(cast(Secret, Secret.from_dict(copy.deepcopy(dict(secret)))))
        except Conflict:
            pass  # created for this attempt by a replica that was killed before its Job
    created = True
    try:
        with translated(f"create Job {namespace}/{name}"):
            made = plain(client.create(cast(Job, Job.from_dict(dict(job)))))
    except Conflict:
        created = False
        with translated(f"get Job {namespace}/{name}"):
            made = plain(client.get(Job, name, namespace=namespace))
    owner = {"apiVersion": "batch/v1", "kind": "Job", "name": name, "uid": made["metadata"]["uid"]}
    with translated(f"patch Secret {namespace}/{secret_name}"):
        client.patch(
            Secret,
            secret_name,
            {"metadata": {"ownerReferences": [owner]}},
            namespace=namespace,
            patch_type=PatchType.MERGE,
        )
    return created


def _secret_of(job: Mapping[str, Any]) -> str:
    """The attempt's Secret a Job mounts: its volume ``attempt``."""
    template = ((job.get("spec") or {}).get("template") or {}).get("spec") or {}
    for volume in template.get("volumes") or []:
        if volume.get("name") == ATTEMPT_VOLUME and volume.get("secret"):
            return str(volume["secret"]["secretName"])
    return str(job["metadata"]["name"])


def delete_job(client: Client, namespace: str, name: str, secret: str) -> None:
    """Delete the Job with its Pods, and ``secret`` (its garbage collector would, unless the replica that
    made it died before making the Job its owner); gone already is fine."""
    try:
        with translated(f"delete Job {namespace}/{name}"):
            client.delete(Job, name, namespace=namespace, cascade=CascadeType.BACKGROUND)
    except NotFound:
        pass
    try:
        with translated(f"delete Secret {namespace}/{secret}"):
            client.delete(Secret, secret, namespace=namespace)
    except NotFound:
        pass


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


def not_begun(job: Mapping[str, Any], pods: Sequence[Mapping[str, Any]]) -> bool:
    """Whether no Pod of the Job has started (its play has not begun): none of ``pods`` has left
    Pending, and the Job counts no terminated Pod. The count matters once a started Pod is gone: one
    deleted mid-play leaves the list before the Job is marked failed (the Job controller first puts its
    uid in ``uncountedTerminatedPods``, then removes its finalizer, then counts it), and a Job seen in
    that moment with no Pod is not one whose Pod never started (a withdrawal then deleted a Job whose
    play had died mid-way, and its host lock stayed taken: the node lab's run of 2026-12-06)."""
    if any((pod.get("status") or {}).get("phase", "Pending") != "Pending" for pod in pods):
        return False
    status = job.get("status") or {}
    uncounted = status.get("uncountedTerminatedPods") or {}
    counted = status.get("failed") or status.get("succeeded")
    return not (counted or uncounted.get("failed") or uncounted.get("succeeded"))


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
    pending = not_begun(job, pods)
    for pod in pods:  # backoffLimit 0: one Pod; a replacement after an eviction would be a second
        phase = ((pod.get("metadata") or {}).get("annotations") or {}).get(PHASE_ANNOTATION) or phase
        for status in (pod.get("status") or {}).get("containerStatuses") or []:
            terminated = (status.get("state") or {}).get("terminated") or {}
            if terminated.get("message"):
                message = str(terminated["message"])
    finished = _finished(job)
    stuck = None if finished else _stuck(client, namespace, name, pods)
    return JobState(
        finished=finished,
        termination_message=message,
        phase=phase,
        not_starting=stuck,
        pending=pending and not finished,
    )


def _stuck(client: Client, namespace: str, name: str, pods: list[dict[str, Any]]) -> str | None:
    """Why the unfinished Job's Pod cannot start, or None (it runs, or may still start). Reads the
    Events where the status cannot tell: a Job without a Pod (the job controller's ``FailedCreate``: its
    ServiceAccount missing, a quota) and a Pod creating its containers (the kubelet's ``FailedMount``:
    a Secret it mounts missing)."""
    if not pods:
        return _event(client, namespace, "Job", name, "FailedCreate", "its Pod cannot be created")
    reasons = [not_starting(pod) for pod in pods]
    if any(reason is None and not _creating(pod) for reason, pod in zip(reasons, pods, strict=True)):
        return None  # one Pod runs (or may still start)
    known = next((reason for reason in reasons if reason is not None), None)
    if known is not None:
        return known
    pod = str((pods[-1].get("metadata") or {}).get("name") or "")
    return _event(client, namespace, "Pod", pod, "FailedMount", "Pod cannot start")


def _event(client: Client, namespace: str, kind: str, name: str, reason: str, what: str) -> str | None:
    """``what: <message>`` of the latest Event ``reason`` about the object; None when there is none."""
    fields: dict[str, Any] = {"involvedObject.kind": kind, "involvedObject.name": name, "reason": reason}
    try:
        with translated(f"list the Events of {kind} {namespace}/{name}"):
            events = [plain(event) for event in client.list(Event, namespace=namespace, fields=fields)]
    except Forbidden:  # a Role without it: the Job is not named, and given up all the same
        return None
    if not events:
        return None
    latest = max(events, key=lambda event: str(event.get("lastTimestamp") or event.get("eventTime") or ""))
    return f"{what}: {one_line(str(latest.get('message') or reason))}"


# a container waiting for one of these does not start until someone changes something
WAITING_FOR_GOOD: Final = frozenset(
    {
        "ErrImagePull",
        "ImagePullBackOff",
        "InvalidImageName",
        "ErrImageNeverPull",
        "CreateContainerConfigError",
        "CreateContainerError",
    }
)
MAX_REASON: Final = 300  # a Pod's status message is one line meant for kubectl; ours names it, shortened


def one_line(text: str) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= MAX_REASON else flat[: MAX_REASON - 3] + "..."


def not_starting(pod: Mapping[str, Any]) -> str | None:
    """Why ``pod`` (a plain dict as the API server sends it) cannot start, from its status alone: the
    scheduler found no Node (``Pod cannot be scheduled: 0/3 nodes are available: ...``), or a container
    waits for what will not come by itself (``Pod cannot start: ImagePullBackOff: ...``); None
    otherwise (running, ended, or still on its way)."""
    status = pod.get("status") or {}
    if status.get("phase") not in (None, "Pending"):
        return None
    for condition in status.get("conditions") or []:
        if (
            condition.get("type") == "PodScheduled"
            and condition.get("status") == "False"
            and condition.get("reason") == "Unschedulable"
        ):
            return f"Pod cannot be scheduled: {one_line(str(condition.get('message') or 'Unschedulable'))}"
    for container in [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]:
        waiting = (container.get("state") or {}).get("waiting") or {}
        reason = waiting.get("reason")
        if reason in WAITING_FOR_GOOD:
            detail = f": {one_line(str(waiting['message']))}" if waiting.get("message") else ""
            return f"Pod cannot start: {reason}{detail}"
    return None


def _creating(pod: Mapping[str, Any]) -> bool:
    """Scheduled, its containers not created yet (the kubelet mounting its volumes): a Secret it mounts
    may be missing, which its status does not say (only a FailedMount Event does)."""
    status = pod.get("status") or {}
    if status.get("phase") not in (None, "Pending") or not (pod.get("spec") or {}).get("nodeName"):
        return False
    containers = status.get("containerStatuses") or []
    return all(
        ((c.get("state") or {}).get("waiting") or {}).get("reason") in (None, "ContainerCreating")
        for c in containers
    )


def set_job_ttl(client: Client, namespace: str, name: str, seconds: int) -> None:
    """The Job's ``ttlSecondsAfterFinished`` (mutable, also once it has finished: the TTL controller
    counts from its finish time)."""
    patch = {"spec": {"ttlSecondsAfterFinished": seconds}}
    with translated(f"patch Job {namespace}/{name}"):
        client.patch(Job, name, patch, namespace=namespace, patch_type=PatchType.MERGE)


def pod_image(client: Client, namespace: str, name: str) -> str | None:
    try:
        with translated(f"get Pod {namespace}/{name}"):
            pod = plain(client.get(Pod, name, namespace=namespace))
    except NotFound:
        return None
    containers = (pod.get("spec") or {}).get("containers") or []
    return str(containers[0]["image"]) if containers and containers[0].get("image") else None


def secret_value(client: Client, namespace: str, name: str, key: str) -> bytes | None:
    try:
        with translated(f"get Secret {namespace}/{name}"):
            secret = client.get(Secret, name, namespace=namespace)
    except NotFound:
        return None
    encoded = (secret.data or {}).get(key)
    return base64.b64decode(encoded) if encoded else None


def annotate_pod(client: Client, namespace: str, name: str, key: str, value: str) -> None:
    patch = {"metadata": {"annotations": {key: value}}}
    with translated(f"annotate Pod {namespace}/{name}"):
        client.patch(Pod, name, patch, namespace=namespace, patch_type=PatchType.MERGE)
