"""kubelab.reads without a lab: kubectl's resource names resolved against a discovery document served by
an httpx MockTransport, the refresh on a miss, the ties, and GET/LIST answering as ``kubectl get -o json``.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hostlab.errors import LabError
from kubelab import reads
from kubelab.reads import Resource, Unresolved

Obj = dict[str, Any]


def _res(name: str, kind: str, namespaced: bool = True, short: tuple[str, ...] = ()) -> Obj:
    singular = kind.lower()
    return {"name": name, "singularName": singular, "kind": kind, "namespaced": namespaced,
            "shortNames": list(short), "verbs": ["get", "list"]}  # fmt: skip


CORE = {
    "groupVersion": "v1",
    "resources": [
        _res("nodes", "Node", namespaced=False, short=("no",)),
        _res("pods", "Pod", short=("po",)),
        _res("pods/status", "Pod"),
        _res("events", "Event", short=("ev",)),
    ],
}
GROUPS: dict[str, tuple[str, list[str], list[Obj]]] = {
    # group: (preferred version, versions, the preferred version's resources)
    "events.k8s.io": ("v1", ["v1"], [_res("events", "Event", short=("ev",))]),
    "policy": ("v1", ["v1"], [_res("poddisruptionbudgets", "PodDisruptionBudget", short=("pdb",))]),
    "cluster.x-k8s.io": ("v1beta2", ["v1beta2", "v1beta1"], [_res("machines", "Machine", short=("ma",))]),
    "machine.sapcloud.io": ("v1alpha1", ["v1alpha1"], [_res("machines", "Machine", short=("mach",))]),
    "metrics.k8s.io": ("v1beta1", ["v1beta1"], []),  # an aggregated API that is down: 503
}


class Api:
    """A stand-in API server (an httpx MockTransport handler): discovery, objects, and what was asked."""

    def __init__(self) -> None:
        self.groups = dict(GROUPS)
        self.objects: dict[str, Obj] = {}  # path -> object
        self.lists: dict[str, list[Obj]] = {}  # path -> items
        self.requests: list[httpx.Request] = []
        self.status: dict[str, tuple[int, str]] = {}  # path -> forced answer

    def discoveries(self) -> int:
        return sum(1 for r in self.requests if r.url.path in ("/api/v1", "/apis"))

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        path = request.url.path
        if path in self.status:
            code, text = self.status[path]
            return httpx.Response(code, text=text)
        if path == "/api/v1":
            return httpx.Response(200, json=CORE)
        if path == "/apis":
            groups = [
                {
                    "name": g,
                    "versions": [{"groupVersion": f"{g}/{v}", "version": v} for v in versions],
                    "preferredVersion": {"groupVersion": f"{g}/{pref}", "version": pref},
                }
                for g, (pref, versions, _) in self.groups.items()
            ]
            return httpx.Response(200, json={"kind": "APIGroupList", "groups": groups})
        for g, (pref, _, resources) in self.groups.items():
            if path == f"/apis/{g}/{pref}":
                if g == "metrics.k8s.io":
                    return httpx.Response(503, text="service unavailable")
                return httpx.Response(200, json={"groupVersion": f"{g}/{pref}", "resources": resources})
        if path in self.objects:
            return httpx.Response(200, json=self.objects[path])
        if path in self.lists:
            return httpx.Response(200, json={"kind": "List", "metadata": {}, "items": self.lists[path]})
        name = path.rpartition("/")[2]
        details = {"name": name, "kind": "x"}
        body = {"kind": "Status", "status": "Failure", "reason": "NotFound", "details": details, "code": 404}
        return httpx.Response(404, json=body)


class FakeLab:
    """What kubelab.reads uses of a Lab: its directory, server, HTTP client and kubectl (recorded)."""

    def __init__(self, api: Api, tmp: Path) -> None:
        self.dir = tmp / "lab"
        self.server = "https://127.0.0.1:6443"
        self.ca = tmp / "ca.crt"
        self.ca.write_text("CA 1")
        self.api = api
        self.kubectl_calls: list[tuple[str, ...]] = []
        self.kubectl_answer = subprocess.CompletedProcess[str]([], 0, json.dumps({"items": []}), "")

    def http(self) -> httpx.Client:
        return httpx.Client(base_url=self.server, transport=httpx.MockTransport(self.api))

    def kubectl(self, *args: str, check: bool = True, **_: Any) -> subprocess.CompletedProcess[str]:
        self.kubectl_calls.append(args)
        return self.kubectl_answer


@pytest.fixture
def api() -> Api:
    return Api()


@pytest.fixture
def fake(api: Api, tmp_path: Path) -> Iterator[Any]:
    lab = FakeLab(api, tmp_path)
    yield lab
    reads.close(lab)  # type: ignore[arg-type]


def _known(api: Api) -> list[Resource]:
    with httpx.Client(base_url="https://api", transport=httpx.MockTransport(api)) as client:
        return reads.resources(lambda p: client.get(p).json() if client.get(p).status_code == 200 else None)


@pytest.mark.parametrize(
    ("name", "group", "version", "plural"),
    [
        ("node", "", "v1", "nodes"),
        ("nodes", "", "v1", "nodes"),
        ("Node", "", "v1", "nodes"),
        ("no", "", "v1", "nodes"),
        ("po", "", "v1", "pods"),
        ("pdb", "policy", "v1", "poddisruptionbudgets"),
        ("PodDisruptionBudget", "policy", "v1", "poddisruptionbudgets"),
        # the same name in the core group and in events.k8s.io: the core group's, as kubectl's
        ("events", "", "v1", "events"),
        ("ev", "", "v1", "events"),
        ("events.events.k8s.io", "events.k8s.io", "v1", "events"),
        # group-qualified: "<resource>.<group>", the group's preferred version
        ("machines.cluster.x-k8s.io", "cluster.x-k8s.io", "v1beta2", "machines"),
        ("machine.cluster.x-k8s.io", "cluster.x-k8s.io", "v1beta2", "machines"),
        ("ma", "cluster.x-k8s.io", "v1beta2", "machines"),
        ("machine.machine.sapcloud.io", "machine.sapcloud.io", "v1alpha1", "machines"),
        ("mach", "machine.sapcloud.io", "v1alpha1", "machines"),
    ],
)
def test_a_kubectl_name_resolves_to_its_group_preferred_version_and_plural(
    api: Api, name: str, group: str, version: str, plural: str
) -> None:
    found = reads.resolve(_known(api), name)
    assert found is not None
    assert (found.group, found.version, found.plural) == (group, version, plural)


def test_a_name_two_groups_serve_outside_the_core_group_is_left_to_kubectl(api: Api) -> None:
    with pytest.raises(Unresolved, match="machines"):
        reads.resolve(_known(api), "machines")


def test_a_subresource_or_an_unknown_name_resolves_to_nothing(api: Api) -> None:
    known = _known(api)
    assert reads.resolve(known, "pods/status") is None
    assert reads.resolve(known, "widgets") is None
    assert reads.resolve(known, "machines.example.com") is None
    assert not any(r.group == "metrics.k8s.io" for r in known)  # its discovery answered 503


def test_a_kind_installed_after_the_first_read_is_found_by_one_refresh(api: Api, fake: Any) -> None:
    api.objects["/api/v1/nodes/n1"] = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}}
    assert reads.get(fake, "node", "n1") is not None
    assert reads.get(fake, "node", "n1") is not None
    assert api.discoveries() == 2  # /api/v1 and /apis once: the second read used the cache
    api.groups["example.com"] = ("v1", ["v1"], [_res("widgets", "Widget")])
    widget = {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}}
    api.objects["/apis/example.com/v1/namespaces/ns/widgets/w"] = widget
    assert reads.get(fake, "widgets.example.com", "w", "ns") == widget
    assert api.discoveries() == 4  # one refresh on the miss
    assert reads.get(fake, "widget", "w", "ns") == widget
    assert api.discoveries() == 4
    assert fake.kubectl_calls == []


def test_a_name_unknown_after_the_refresh_and_a_tie_are_read_by_kubectl(api: Api, fake: Any) -> None:
    fake.kubectl_answer = subprocess.CompletedProcess(
        [], 1, "", 'error: the server doesn\'t have a resource type "widgets"'
    )
    with pytest.raises(LabError, match="doesn't have a resource type"):
        reads.get(fake, "widgets", "w", "ns")
    assert fake.kubectl_calls == [("get", "widgets", "w", "-o", "json", "-n", "ns")]
    fake.kubectl_answer = subprocess.CompletedProcess([], 0, json.dumps({"items": [{"kind": "Machine"}]}), "")
    assert reads.list_objects(fake, "machines", "ns", "a=b") == [{"kind": "Machine"}]
    assert fake.kubectl_calls[-1] == ("get", "machines", "-n", "ns", "-l", "a=b", "-o", "json")


def test_get_answers_the_object_without_managed_fields_or_none_when_it_does_not_exist(
    api: Api, fake: Any
) -> None:
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "managedFields": [{"manager": "x"}]}}
    api.objects["/api/v1/namespaces/default/pods/p"] = pod
    assert reads.get(fake, "pod", "p") == {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}}
    assert reads.get(fake, "pod", "gone", "ns") is None
    # a cluster-scoped kind ignores the namespace, as kubectl does
    api.objects["/api/v1/nodes/n1"] = {"kind": "Node", "metadata": {"name": "n1"}}
    assert reads.get(fake, "node", "n1", "ns") == {"kind": "Node", "metadata": {"name": "n1"}}
    assert fake.kubectl_calls == []


def test_an_error_names_the_request_and_the_answer(api: Api, fake: Any) -> None:
    api.status["/api/v1/namespaces/ns/pods/p"] = (500, "etcd is sad")
    with pytest.raises(LabError, match=r"GET /api/v1/namespaces/ns/pods/p: 500 etcd is sad"):
        reads.get(fake, "pod", "p", "ns")
    api.status["/api/v1/namespaces/ns/pods"] = (403, "forbidden")
    with pytest.raises(
        LabError, match=r"GET /api/v1/namespaces/ns/pods\?labelSelector=app%3Dx: 403 forbidden"
    ):
        reads.list_objects(fake, "pods", "ns", "app=x")


def test_a_404_that_is_not_the_objects_is_left_to_kubectl(api: Api, fake: Any) -> None:
    # the CRD went away after the discovery: the path itself answers 404 (no object named in it)
    api.groups["example.com"] = ("v1", ["v1"], [_res("widgets", "Widget")])
    api.status["/apis/example.com/v1/namespaces/ns/widgets/w"] = (404, "404 page not found")
    fake.kubectl_answer = subprocess.CompletedProcess(
        [], 1, "", 'Error from server (NotFound): widgets "w" not found'
    )
    assert reads.get(fake, "widgets", "w", "ns") is None
    assert fake.kubectl_calls == [("get", "widgets", "w", "-o", "json", "-n", "ns")]


def test_list_items_carry_api_version_and_kind_as_kubectls_list_does(api: Api, fake: Any) -> None:
    items: list[Obj] = [{"metadata": {"name": "m1", "managedFields": []}}, {"metadata": {"name": "m2"}}]
    api.lists["/apis/cluster.x-k8s.io/v1beta2/namespaces/ns/machines"] = items
    listed = reads.list_objects(fake, "machines.cluster.x-k8s.io", "ns", "cluster.x-k8s.io/control-plane=")
    expected = {"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine"}
    assert listed == [{**expected, "metadata": {"name": "m1"}}, {**expected, "metadata": {"name": "m2"}}]
    asked = api.requests[-1]
    assert asked.url.params["labelSelector"] == "cluster.x-k8s.io/control-plane="
    api.lists["/api/v1/events"] = [{"metadata": {"name": "e", "namespace": "a"}}]
    everywhere = reads.list_objects(fake, "events", all_namespaces=True, fields="reason=X")
    assert everywhere == [{"apiVersion": "v1", "kind": "Event", "metadata": {"name": "e", "namespace": "a"}}]
    assert api.requests[-1].url.params["fieldSelector"] == "reason=X"


def test_one_client_per_lab_closed_when_the_lab_goes(api: Api, fake: Any) -> None:
    first = reads.reader(fake)
    assert reads.reader(fake) is first
    fake.server = "https://127.0.0.1:7443"  # the lab came up again: a new server, a new client
    second = reads.reader(fake)
    assert second is not first and first.client.is_closed
    os.utime(fake.ca, ns=(0, 1))  # a new CA on the same server (the lab came up again on that port)
    third = reads.reader(fake)
    assert third is not second and second.client.is_closed
    reads.close(fake)
    assert third.client.is_closed


def test_a_dropped_connection_is_tried_once_more_then_named(api: Api, fake: Any) -> None:
    api.objects["/api/v1/nodes/n1"] = {"kind": "Node", "metadata": {"name": "n1"}}
    drops = {"left": 1}
    served = api.__call__

    def flaky(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/api/v1/nodes/n1" and drops["left"] > 0:
            drops["left"] -= 1
            raise httpx.RemoteProtocolError("Server disconnected without sending a response.")
        return served(request)

    fake.http = lambda: httpx.Client(base_url=fake.server, transport=httpx.MockTransport(flaky))
    assert reads.get(fake, "node", "n1") == {"kind": "Node", "metadata": {"name": "n1"}}
    drops["left"] = 2
    with pytest.raises(
        LabError, match=r"GET https://127.0.0.1:6443/api/v1/nodes/n1 failed: RemoteProtocolError"
    ):
        reads.get(fake, "node", "n1")


def test_a_429_or_a_5xx_with_retry_after_is_sent_again_as_kubectl_does(
    api: Api, fake: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The API server answers 429 "storage is (re)initializing" while it starts again (a test restarting
    it mid-rollout met it); kubectl waits the Retry-After and asks again, and so does the reader."""
    api.objects["/api/v1/nodes/n1"] = {"kind": "Node", "metadata": {"name": "n1"}}
    answers = [
        httpx.Response(429, headers={"Retry-After": "1"}, json={"reason": "TooManyRequests"}),
        httpx.Response(503, headers={"Retry-After": "1"}, json={"reason": "ServiceUnavailable"}),
    ]
    served = api.__call__
    slept: list[float] = []
    monkeypatch.setattr("kubelab.reads.time.sleep", slept.append)

    def starting(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/api/v1/nodes/n1" and answers:
            return answers.pop(0)
        return served(request)

    fake.http = lambda: httpx.Client(base_url=fake.server, transport=httpx.MockTransport(starting))
    assert reads.get(fake, "node", "n1") == {"kind": "Node", "metadata": {"name": "n1"}}
    assert slept == [1.0, 1.0]
    # a 5xx without Retry-After is final, and a server that keeps answering 429 is named after 10 tries
    answers[:] = [httpx.Response(500, json={"reason": "InternalError"})]
    with pytest.raises(LabError, match=r"GET /api/v1/nodes/n1: 500"):
        reads.get(fake, "node", "n1")
    answers[:] = [httpx.Response(429, headers={"Retry-After": "1"})] * reads.RETRIES
    slept.clear()
    with pytest.raises(LabError, match=r"GET /api/v1/nodes/n1: 429"):
        reads.get(fake, "node", "n1")
    assert len(slept) == reads.RETRIES - 1
