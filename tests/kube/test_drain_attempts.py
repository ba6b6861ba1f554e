"""A drain meets the service's own attempt Pods (issue 38, item 5): lab-free, over a small in-memory
stand-in for lightkube's client (list the Node's Pods, evict one), since the rule is the drain's own:
other Machines' attempts are never evicted nor refused for their emptyDir scratch; the drain waits for
them, except one that waits at its own drain point; past the timeout with only them left the DrainError
is retriable. The real API server's part (field selectors, evictions) is tests/kube/test_kube_drain.py."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from lightkube.models.core_v1 import EmptyDirVolumeSource, PodSpec, PodStatus, Volume
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Pod

from inplace_extension.kube import drain
from inplace_extension.kube.jobs import PHASE_ANNOTATION
from inplace_extension.kube.port import DrainError, DrainPolicy
from inplace_extension.kubejobs.manifest import ATTEMPT_POD_LABELS
from inplace_extension.runs import progress

NODE = "worker-a"
POLICY = DrainPolicy(timeout_seconds=5.0, poll_seconds=0.05, attempt_labels=ATTEMPT_POD_LABELS)


def pod(name: str, *, attempt: bool = False, phase: str | None = None, ns: str = "apps") -> Pod:
    """A running Pod on :data:`NODE` with emptyDir scratch (as every attempt Pod has)."""
    labels = dict(ATTEMPT_POD_LABELS) if attempt else {"app": "web"}
    annotations = {PHASE_ANNOTATION: phase} if phase else {}
    return Pod(
        metadata=ObjectMeta(name=name, namespace=ns, labels=labels, annotations=annotations),
        spec=PodSpec(
            containers=[], nodeName=NODE, volumes=[Volume(name="tmp", emptyDir=EmptyDirVolumeSource())]
        ),
        status=PodStatus(phase="Running"),
    )


class Client:
    """What drain() calls of lightkube's client: the Node's Pods, and evictions (each deletes its Pod)."""

    def __init__(self, *pods: Pod) -> None:
        self.pods = {p.metadata.name: p for p in pods if p.metadata and p.metadata.name}
        self.evicted: list[str] = []
        self.lock = threading.Lock()

    def list(self, kind: Any, namespace: Any = None, fields: Any = None) -> list[Pod]:
        assert fields == {"spec.nodeName": NODE}
        with self.lock:
            return list(self.pods.values())

    def create(self, eviction: Any, name: str, namespace: str) -> None:
        with self.lock:
            self.evicted.append(f"{namespace}/{name}")
            self.pods.pop(name, None)

    def end(self, name: str) -> None:
        """The Pod's Job ended (the attempt Pod Succeeded)."""
        with self.lock:
            found = self.pods[name]
            found.status = PodStatus(phase="Succeeded")


def test_another_machines_attempt_is_waited_for_never_evicted_and_its_scratch_is_no_users_data() -> None:
    client = Client(
        pod("web-1"), pod("inplace-0123456789abcdef-1-x", attempt=True, ns="inplace-extension-system")
    )
    with pytest.raises(DrainError, match="Pods with emptyDir data on Node worker-a: apps/web-1 "):
        drain.drain(client, NODE, POLICY, lambda n: None)  # type: ignore[arg-type]
    client.pods.pop("web-1")
    left: list[int] = []
    threading.Timer(0.3, client.end, ("inplace-0123456789abcdef-1-x",)).start()
    drain.drain(client, NODE, POLICY, left.append)  # type: ignore[arg-type]
    assert client.evicted == [], "another update's attempt is never evicted"
    assert left[0] == 1 and left[-1] == 0, "it counts as a Pod left until it ended"


def test_a_drain_held_up_only_by_other_attempts_is_retriable_and_names_them() -> None:
    client = Client(pod("inplace-0123456789abcdef-1-x", attempt=True, phase="running: kubelet_args"))
    policy = DrainPolicy(timeout_seconds=0.2, poll_seconds=0.05, attempt_labels=ATTEMPT_POD_LABELS)
    with pytest.raises(DrainError) as caught:
        drain.drain(client, NODE, policy, lambda n: None)  # type: ignore[arg-type]
    assert caught.value.retriable, "it goes away by itself: retried, not remembered"
    assert str(caught.value) == (
        "drain: timed out after 0.2s with 1 pod left on Node worker-a; still running: the attempts of other "
        "updates apps/inplace-0123456789abcdef-1-x"
    )


def test_an_attempt_at_its_own_drain_point_is_left_where_it_is() -> None:
    """Two Machines updated at once, each attempt on the other's Node: each drain finds the other
    attempt waiting at its drain point and goes on (no deadlock, nothing evicted)."""
    waiting = pod("inplace-0123456789abcdef-1-x", attempt=True, phase=progress.draining(1))
    client = Client(waiting, pod("web-1"))
    policy = DrainPolicy(
        timeout_seconds=5.0, poll_seconds=0.05, attempt_labels=ATTEMPT_POD_LABELS, delete_empty_dir_data=True
    )
    drain.drain(client, NODE, policy, lambda n: None)  # type: ignore[arg-type]
    assert client.evicted == ["apps/web-1"], "the user's Pod is evicted, the waiting attempt is not"


def test_without_attempt_labels_every_pod_is_a_workload() -> None:
    client = Client(pod("inplace-0123456789abcdef-1-x", attempt=True))
    with pytest.raises(DrainError, match="emptyDir") as caught:
        drain.drain(client, NODE, DrainPolicy(poll_seconds=0.05), lambda n: None)  # type: ignore[arg-type]
    assert not caught.value.retriable, "a user's Pod with emptyDir data is the user's to decide"
