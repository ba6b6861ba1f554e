"""The ``kubernetes`` executor's calls (kube/jobs.py, kube/records.py, through kube/cluster.KubeAttempts)
against the kubelab's real API server and its garbage collector: the Job and the Secret it owns (deleted
with it), a second create of the same Job no error, a Job's state from its Pod (termination message,
the Pod's own phase annotation), and the record on a Machine and a Node written only at the
resourceVersion read. The lab runs no job controller: the Pod is one the test makes, labelled as the job
controller labels its Pods; Jobs that run on real nodes are the node lab's."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import pytest
from hostlab.proc import wait_until
from kubelab import objects
from kubelab.lab import Lab

from inplace_extension.kube.cluster import KubeAttempts, connect_attempts
from inplace_extension.kube.errors import Conflict
from inplace_extension.kube.jobs import JOB_NAME_LABEL, PHASE_ANNOTATION
from inplace_extension.kube.port import RecordRef
from inplace_extension.kubejobs.manifest import (
    JOB_TTL_BACKSTOP_SECONDS,
    JobConfig,
    job_manifest,
    job_name,
    labels,
    secret_manifest,
)
from inplace_extension.runs.model import RunRequest

from .conftest import create_machine

pytestmark = pytest.mark.kube
EPISODE = "0123456789abcdef"  # as kubejobs/record.py draws one


@pytest.fixture
def jobs(kubelab: Lab) -> Iterator[KubeAttempts]:
    client = connect_attempts(kubelab.kubeconfig)
    yield client
    client.close()


def _ns(lab: Lab) -> str:
    ns = f"jobs-{uuid.uuid4().hex[:6]}"
    objects.ensure_namespace(lab, ns)
    return ns


def _complete(kubelab: Lab, name: str, ns: str) -> bool:
    """Write the Job's status as its controller does at the end of a successful run; False to try again.

    The lab's job controller sets ``status.startTime`` on its own as soon as it sees the Job, and the API
    server refuses to change it once set: the status carries the controller's start when there is one, and
    a start set between this read and the patch fails the patch, to be read again."""
    current = objects.get(kubelab, "job", name, ns) or {}
    start = current.get("status", {}).get("startTime") or "2026-11-27T08:00:00Z"
    status = {
        "conditions": [
            {"type": "SuccessCriteriaMet", "status": "True"},
            {"type": "Complete", "status": "True"},
        ],
        "startTime": start,
        "completionTime": start,
        "active": 0,
        "ready": 0,
        "succeeded": 1,
    }
    body = json.dumps({"status": status})
    patch = ("patch", "job", name, "-n", ns, "--subresource=status", "--type=merge", "-p", body)
    return kubelab.kubectl(*patch, check=False).returncode == 0


def test_a_job_owns_its_secret_is_created_once_and_reports_its_pod(kubelab: Lab, jobs: KubeAttempts) -> None:
    ns = _ns(kubelab)
    config = JobConfig(
        namespace=ns,
        image="registry.invalid/inplace-extension:1",
        service_account="default",
        deadline_seconds=600,
        ttl_seconds=600,
    )
    request = RunRequest("default", "m1", "ab" * 32, ("ntp",), {"ntp": {"ntp_servers": ["a"]}})
    name = job_name(request.ident, 1, episode=EPISODE)
    job = job_manifest(config, request, 1, "node-1", episode=EPISODE)
    secret = secret_manifest(config, name, '{"secret": "data"}', labels(request, 1, episode=EPISODE))
    assert jobs.create_job(job, secret) is True
    assert jobs.create_job(job, secret) is False, "AlreadyExists: the same attempt"
    made = objects.get(kubelab, "job", name, ns)
    owned = objects.get(kubelab, "secret", name, ns)
    assert made is not None and owned is not None
    assert owned["metadata"]["ownerReferences"] == [
        {"apiVersion": "batch/v1", "kind": "Job", "name": name, "uid": made["metadata"]["uid"]}
    ]
    assert made["spec"]["backoffLimit"] == 0
    assert (
        made["spec"]["ttlSecondsAfterFinished"] == JOB_TTL_BACKSTOP_SECONDS
    )  # until the outcome is recorded
    jobs.set_job_ttl(ns, name, 600)
    patched = objects.get(kubelab, "job", name, ns)
    assert patched is not None and patched["spec"]["ttlSecondsAfterFinished"] == 600

    assert jobs.job_finished(ns, name) is False  # the near-end wait's one read: the Job alone
    state = jobs.job_state(ns, name)
    assert state is not None and (state.finished, state.termination_message, state.phase) == (
        False,
        None,
        None,
    )
    pod = f"{name}-x1"
    objects.apply(
        kubelab,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": pod, "namespace": ns, "labels": {JOB_NAME_LABEL: name}},
            # no scheduler has this name: the Pod is never bound, so nothing but this test writes the
            # container status it reads back as the attempt's
            "spec": {
                "schedulerName": "inplace-extension-test-unscheduled",
                "containers": [{"name": "attempt", "image": "registry.invalid/x:1"}],
            },
        },
    )
    jobs.annotate_pod(ns, pod, PHASE_ANNOTATION, "ntp")
    assert jobs.pod_image(ns, pod) == "registry.invalid/x:1"
    assert jobs.pod_image(ns, "no-such-pod") is None
    objects.set_status(
        kubelab,
        "pod",
        pod,
        ns,
        {
            "containerStatuses": [
                {
                    "name": "attempt",
                    "image": "registry.invalid/x:1",
                    "imageID": "",
                    "ready": False,
                    "restartCount": 0,
                    "state": {"terminated": {"exitCode": 0, "message": '{"kind":"successful"}'}},
                }
            ]
        },
    )
    assert wait_until(lambda: _complete(kubelab, name, ns), 60, 0.2), objects.get(kubelab, "job", name, ns)
    assert jobs.job_finished(ns, name) is True
    state = jobs.job_state(ns, name)
    assert state is not None
    assert (state.finished, state.termination_message, state.phase) == (True, '{"kind":"successful"}', "ntp")

    kubelab.kubectl("delete", "job", name, "-n", ns, "--cascade=background")
    objects.wait_gone(kubelab, "secret", name, ns)  # the garbage collector: the Secret went with its Job
    assert jobs.job_state(ns, name) is None
    assert jobs.job_finished(ns, name) is None


def test_the_record_is_written_only_at_the_version_read(with_machines: Lab, jobs: KubeAttempts) -> None:
    ns = f"records-{uuid.uuid4().hex[:6]}"
    create_machine(with_machines, ns, "m1", [{"type": "InternalIP", "address": "10.0.0.7"}], "node-7")
    machine = RecordRef("Machine", "m1", ns)
    read = jobs.read(machine, "inplace-extension.io/attempts")
    assert read is not None and (read.value, read.node) == (None, "node-7")
    jobs.write(machine, "inplace-extension.io/attempts", '{"v":1}', read.resource_version)
    with pytest.raises(Conflict):
        jobs.write(machine, "inplace-extension.io/attempts", '{"v":2}', read.resource_version)
    again = jobs.read(machine, "inplace-extension.io/attempts")
    assert again is not None and again.value == '{"v":1}'
    assert jobs.read(RecordRef("Machine", "gone", ns), "k") is None

    node = f"node-{uuid.uuid4().hex[:6]}"
    objects.create_kwok_node(with_machines, node)
    on_node = jobs.read(RecordRef("Node", node), "inplace-extension.io/attempts")
    assert on_node is not None and on_node.node == node
    jobs.write(RecordRef("Node", node), "inplace-extension.io/attempts", '{"v":1}', on_node.resource_version)
    node_obj = objects.get(with_machines, "node", node)
    assert node_obj is not None
    assert node_obj["metadata"]["annotations"]["inplace-extension.io/attempts"] == '{"v":1}'
