"""The ``kube`` adapter's calls for the ``kubernetes`` executor (kube/jobs.py, kube/records.py) against a
stand-in for lightkube's blocking ``Client`` that keeps what was created and answers as the API server
does (409 on a second create, 404 on a missing object): the order of the calls and what is sent. The
proof against a real API server is the lab's."""

from __future__ import annotations

from typing import Any

import httpx2
import pytest

from inplace_extension.kube import jobs, records
from inplace_extension.kube.errors import Conflict, KubeError, NotFound
from inplace_extension.kube.port import RecordRef


class _Obj:
    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data

    def to_dict(self) -> dict[str, Any]:
        return self.data


def _status(code: int) -> httpx2.HTTPStatusError:
    request = httpx2.Request("POST", "https://api.example")
    return httpx2.HTTPStatusError("answer", request=request, response=httpx2.Response(code, request=request))


class StandInClient:
    """Stands in for ``lightkube.Client``: objects by (kind, namespace, name); ``patches`` as sent."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str | None, str], dict[str, Any]] = {}
        self.created: list[str] = []
        self.patches: list[tuple[str, str, Any]] = []
        self.listed: list[dict[str, str] | None] = []

    def create(self, obj: Any) -> _Obj:
        data = obj.to_dict()
        kind, meta = data["kind"], data["metadata"]
        key = (kind, meta.get("namespace"), meta["name"])
        if key in self.objects:
            raise _status(409)
        meta["uid"] = f"uid-{len(self.objects)}"
        self.objects[key] = data
        self.created.append(kind)
        return _Obj(data)

    def get(self, res: Any, name: str, namespace: str | None = None) -> _Obj:
        found = self.objects.get((res.__name__, namespace, name))
        if found is None:
            raise _status(404)
        return _Obj(found)

    def list(
        self,
        res: Any,
        namespace: str | None = None,
        labels: dict[str, str] | None = None,
        fields: dict[str, str] | None = None,
    ) -> list[_Obj]:
        self.listed.append(labels if fields is None else fields)
        if res.__name__ == "Event":
            return [
                _Obj(v)
                for (kind, ns, _), v in self.objects.items()
                if kind == "Event"
                and ns == namespace
                and v["involvedObject"]["kind"] == (fields or {}).get("involvedObject.kind")
                and v["involvedObject"]["name"] == (fields or {}).get("involvedObject.name")
                and v["reason"] == (fields or {}).get("reason")
            ]
        return [
            _Obj(v)
            for (kind, ns, _), v in self.objects.items()
            if kind == "Pod"
            and ns == namespace
            and all(v["metadata"].get("labels", {}).get(k) == x for k, x in (labels or {}).items())
        ]

    def patch(self, res: Any, name: str, obj: Any, namespace: str | None = None, **kwargs: Any) -> None:
        self.patches.append((name, str(namespace), obj))
        found = self.objects.get((res.__name__, namespace, name))
        if found is None:
            raise _status(404)
        found["metadata"].update(obj.get("metadata") or {})

    def delete(self, res: Any, name: str, namespace: str | None = None, **kwargs: Any) -> None:
        if self.objects.pop((res.__name__, namespace, name), None) is None:
            raise _status(404)


JOB = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "inplace-ab-1", "namespace": "ie"}}
SECRET = {
    "apiVersion": "v1",
    "kind": "Secret",
    "metadata": {"name": "inplace-ab-1", "namespace": "ie"},
    "stringData": {"attempt.json": "{}"},
}


def test_the_secret_comes_first_then_the_job_owns_it_and_a_second_create_is_no_error() -> None:
    """Never a Job without its Secret: its Pod would wait in ContainerCreating until the deadline."""
    client = StandInClient()
    assert jobs.create_job(client, JOB, SECRET) is True  # type: ignore[arg-type]
    assert client.created == ["Secret", "Job"]
    job_uid = client.objects[("Job", "ie", "inplace-ab-1")]["metadata"]["uid"]
    owners = client.objects[("Secret", "ie", "inplace-ab-1")]["metadata"]["ownerReferences"]
    assert owners == [{"apiVersion": "batch/v1", "kind": "Job", "name": "inplace-ab-1", "uid": job_uid}]
    assert jobs.create_job(client, JOB, SECRET) is False  # type: ignore[arg-type]
    assert client.created == ["Secret", "Job"], "one Job, one Secret"


def test_a_refused_secret_makes_no_job() -> None:
    client = StandInClient()
    created = client.create

    def refuse_secrets(obj: Any) -> _Obj:
        if obj.to_dict()["kind"] == "Secret":
            raise _status(403)  # a quota or a webhook
        return created(obj)

    client.create = refuse_secrets  # type: ignore[method-assign]
    with pytest.raises(KubeError, match="create Secret ie/inplace-ab-1: the API server answered 403"):
        jobs.create_job(client, JOB, SECRET)  # type: ignore[arg-type]
    assert client.created == []


def test_the_job_of_an_orphan_secret_is_made_from_it_and_owns_it() -> None:
    """A replica killed between the Secret and the Job: the next poll makes the Job (no Secret: none)."""
    client = StandInClient()
    with pytest.raises(NotFound):
        jobs.create_job(client, JOB, None)  # type: ignore[arg-type]
    assert client.created == []
    client.objects[("Secret", "ie", "inplace-ab-1")] = {
        "kind": "Secret",
        "metadata": {"name": "inplace-ab-1"},
    }
    assert jobs.create_job(client, JOB, None) is True  # type: ignore[arg-type]
    assert client.created == ["Job"]
    owners = client.objects[("Secret", "ie", "inplace-ab-1")]["metadata"]["ownerReferences"]
    assert [owner["name"] for owner in owners] == ["inplace-ab-1"]
    jobs.delete_job(client, "ie", "inplace-ab-1", "inplace-ab-1")  # type: ignore[arg-type]
    assert client.objects == {}
    jobs.delete_job(client, "ie", "inplace-ab-1", "inplace-ab-1")  # type: ignore[arg-type]  # gone: fine


def pending(**status: Any) -> dict[str, Any]:
    return {"kind": "Pod", "metadata": {"name": "p"}, "status": {"phase": "Pending", **status}}


UNSCHEDULABLE = (
    "0/3 nodes are available: 1 node(s) didn't match pod anti-affinity rules, 2 node(s) were "
    "unschedulable. preemption: 0/3 nodes are available: 3 Preemption is not helpful for scheduling."
)


def waiting(reason: str, message: str | None = None) -> dict[str, Any]:
    state: dict[str, Any] = {"reason": reason} | ({"message": message} if message else {})
    return pending(containerStatuses=[{"name": "attempt", "state": {"waiting": state}}])


@pytest.mark.parametrize(
    ("pod", "named"),
    [
        (
            pending(
                conditions=[
                    {
                        "type": "PodScheduled",
                        "status": "False",
                        "reason": "Unschedulable",
                        "message": UNSCHEDULABLE,
                    }
                ]
            ),
            f"Pod cannot be scheduled: {UNSCHEDULABLE}",
        ),
        (
            waiting("ErrImagePull", 'failed to pull and unpack image "example.invalid/x": gone'),
            'Pod cannot start: ErrImagePull: failed to pull and unpack image "example.invalid/x": gone',
        ),
        (
            waiting("ImagePullBackOff", 'Back-off pulling image "example.invalid/x:1"'),
            'Pod cannot start: ImagePullBackOff: Back-off pulling image "example.invalid/x:1"',
        ),
        (
            waiting("CreateContainerConfigError", 'secret "ssh" not found'),
            'Pod cannot start: CreateContainerConfigError: secret "ssh" not found',
        ),
        (waiting("ContainerCreating"), None),  # on its way
        (pending(), None),  # not scheduled yet
        (
            {
                "kind": "Pod",
                "status": {"phase": "Running", "containerStatuses": [{"state": {"running": {}}}]},
            },
            None,
        ),
    ],
)
def test_a_pod_that_cannot_start_is_named_from_its_status(pod: dict[str, Any], named: str | None) -> None:
    assert jobs.not_starting(pod) == named


def test_a_job_whose_pod_waits_for_a_missing_secret_or_has_no_pod_says_why_from_its_events() -> None:
    client = StandInClient()
    client.objects[("Job", "ie", "inplace-ab-1")] = {"kind": "Job", "metadata": {"name": "inplace-ab-1"}}
    state = jobs.job_state(client, "ie", "inplace-ab-1")  # type: ignore[arg-type]
    assert state is not None and state.not_starting is None, "no Pod yet, no word why: on its way"
    client.objects[("Event", "ie", "e1")] = {
        "kind": "Event",
        "involvedObject": {"kind": "Job", "name": "inplace-ab-1"},
        "reason": "FailedCreate",
        "message": 'Error creating: pods "inplace-ab-1-" is forbidden: error looking up service account '
        'ie/inplace-extension-attempt: serviceaccount "inplace-extension-attempt" not found',
    }
    state = jobs.job_state(client, "ie", "inplace-ab-1")  # type: ignore[arg-type]
    assert state is not None and state.not_starting is not None
    assert state.not_starting.startswith("its Pod cannot be created: Error creating: pods")
    assert "error looking up service account" in state.not_starting
    creating = waiting("ContainerCreating")
    creating["metadata"] = {"name": "inplace-ab-1-x", "labels": {jobs.JOB_NAME_LABEL: "inplace-ab-1"}}
    creating["spec"] = {"nodeName": "n2"}
    client.objects[("Pod", "ie", "inplace-ab-1-x")] = creating
    state = jobs.job_state(client, "ie", "inplace-ab-1")  # type: ignore[arg-type]
    assert state is not None and state.not_starting is None, "creating its containers: on its way"
    client.objects[("Event", "ie", "e2")] = {
        "kind": "Event",
        "involvedObject": {"kind": "Pod", "name": "inplace-ab-1-x"},
        "reason": "FailedMount",
        "message": 'MountVolume.SetUp failed for volume "attempt" : secret "inplace-ab-1" not found',
    }
    state = jobs.job_state(client, "ie", "inplace-ab-1")  # type: ignore[arg-type]
    assert state is not None and state.not_starting == (
        'Pod cannot start: MountVolume.SetUp failed for volume "attempt" : secret "inplace-ab-1" not found'
    )
    del client.objects[("Event", "ie", "e2")]
    client.objects[("Pod", "ie", "inplace-ab-1-x")]["status"] = {"phase": "Running"}
    state = jobs.job_state(client, "ie", "inplace-ab-1")  # type: ignore[arg-type]
    assert state is not None and state.not_starting is None


def test_a_jobs_state_comes_from_its_conditions_and_its_pod() -> None:
    client = StandInClient()
    assert jobs.job_state(client, "ie", "inplace-ab-1") is None  # type: ignore[arg-type]
    client.objects[("Job", "ie", "inplace-ab-1")] = {
        "kind": "Job",
        "metadata": {"name": "inplace-ab-1"},
        "status": {"conditions": [{"type": "Failed", "status": "True"}]},
    }
    client.objects[("Pod", "ie", "inplace-ab-1-x")] = {
        "kind": "Pod",
        "metadata": {
            "name": "inplace-ab-1-x",
            "labels": {jobs.JOB_NAME_LABEL: "inplace-ab-1"},
            "annotations": {jobs.PHASE_ANNOTATION: "ntp"},
        },
        "status": {"containerStatuses": [{"state": {"terminated": {"message": '{"kind":"successful"}'}}}]},
    }
    state = jobs.job_state(client, "ie", "inplace-ab-1")  # type: ignore[arg-type]
    assert state is not None
    assert (state.finished, state.termination_message, state.phase) == (True, '{"kind":"successful"}', "ntp")
    assert client.listed == [{jobs.JOB_NAME_LABEL: "inplace-ab-1"}], "a finished Job: nothing else read"


def test_the_record_is_read_with_its_version_and_node_and_written_with_that_version() -> None:
    client = StandInClient()
    ref = RecordRef("Machine", "m1", "default")
    assert records.read(client, ref, "k") is None  # type: ignore[arg-type]
    client.objects[("Machine", "default", "m1")] = {
        "kind": "Machine",
        "metadata": {"name": "m1", "resourceVersion": "42", "annotations": {"k": "v"}},
        "status": {"nodeRef": {"name": "node-1"}},
    }
    found = records.read(client, ref, "k")  # type: ignore[arg-type]
    assert found is not None and (found.value, found.resource_version, found.node) == ("v", "42", "node-1")
    records.write(client, ref, "k", "w", "42")  # type: ignore[arg-type]
    assert client.patches == [
        ("m1", "default", {"metadata": {"resourceVersion": "42", "annotations": {"k": "w"}}})
    ]


def test_a_conflict_on_the_record_is_the_adapters_own_error() -> None:
    class Conflicting(StandInClient):
        def patch(self, res: Any, name: str, obj: Any, namespace: str | None = None, **kwargs: Any) -> None:
            raise _status(409)

    with pytest.raises(Conflict, match="annotate Node n1: the API server answered 409"):
        records.write(Conflicting(), RecordRef("Node", "n1"), "k", "w", "1")  # type: ignore[arg-type]
