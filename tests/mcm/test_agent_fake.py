"""The MCM agent against the in-memory fake of the adapter's ports (no API server): the desired state
path and its answers, results as Node metadata, Events, the critical-components taint, and how often
the control cluster is read. tests/mcm (kube) and tests/mcm_lab run the same agent against the real
API server and the real MCM."""

from __future__ import annotations

import asyncio
import contextlib
import copy
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from kubefake import FakeControl, FakeTarget

from inplace_extension.kube.port import NodeSeen
from inplace_extension.mcm import node_state as ns
from inplace_extension.mcm.agent import Agent, AgentOptions
from inplace_extension.mcm.metrics import AgentMetrics
from inplace_extension.metrics import Metrics
from inplace_extension.runs.model import EndWaitingRuns, Progress, ProgressState, RunRequest

from .support import ScriptedRuns

pytestmark = pytest.mark.anyio
NS = "shoot--mcm"
API = "machine.sapcloud.io/v1alpha1"
NEW = {
    "kubernetesVersion": "v1.31.1",
    "kubeadmConfigSpec": {"ntp": {"enabled": True, "servers": ["ntp.test"]}},
}


def _owner(kind: str, name: str) -> dict[str, Any]:
    return {"apiVersion": API, "kind": kind, "name": name, "uid": f"uid-{name}", "controller": True}


def _template(klass: str, template_hash: str) -> dict[str, Any]:
    labels = {"name": "pool", "machine-template-hash": template_hash}
    return {"metadata": {"labels": labels}, "spec": {"class": {"kind": "MachineClass", "name": klass}}}


def pool(control: FakeControl, spec: dict[str, Any] = NEW) -> None:
    """As during MCM's update: the deployment points at class v2, the Machine is still the old set's."""

    def meta(name: str, **more: Any) -> dict[str, Any]:
        return {"name": name, "namespace": NS, **more}

    control.put({"apiVersion": API, "kind": "MachineClass", "metadata": meta("pool-v1"), "providerSpec": {}})
    control.put(
        {
            "apiVersion": API,
            "kind": "MachineClass",
            "metadata": meta("pool-v2"),
            "providerSpec": {"inPlaceUpdate": spec},
        }
    )
    template = _template("pool-v2", "h2")
    template["metadata"]["labels"].pop("machine-template-hash")
    control.put(
        {
            "apiVersion": API,
            "kind": "MachineDeployment",
            "metadata": meta("pool"),
            "spec": {"template": template},
        }
    )
    deployment = _owner("MachineDeployment", "pool")
    for version, template_hash in (("v1", "h1"), ("v2", "h2")):
        control.put(
            {
                "apiVersion": API,
                "kind": "MachineSet",
                "metadata": meta(f"pool-{template_hash}", ownerReferences=[deployment]),
                "spec": {"template": _template(f"pool-{version}", template_hash)},
            }
        )
    control.put(
        {
            "apiVersion": API,
            "kind": "Machine",
            "metadata": meta("m1", ownerReferences=[_owner("MachineSet", "pool-h1")]),
        }
    )


def waiting_node(name: str = "n1", machine: str | None = "m1") -> dict[str, Any]:
    labels = {ns.CANDIDATE_LABEL: "true", "keep": "me"}
    if machine is not None:
        labels["node.gardener.cloud/machine-name"] = machine
    conditions = [
        {"type": "Ready", "status": "True"},
        {"type": "InPlaceUpdate", "status": "True", "reason": ns.READY_FOR_UPDATE},
    ]
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "uid": f"uid-{name}", "labels": labels},
        "status": {"conditions": conditions, "addresses": [{"type": "InternalIP", "address": "10.79.9.21"}]},
    }


class Runs(ScriptedRuns):
    """The scripted executor, announcing each poll on the target's ``activity``."""

    def __init__(self, target: FakeTarget, answer: Callable[[RunRequest, int], Progress]) -> None:
        super().__init__(answer)
        self._activity = target.activity

    async def poll(self, request: RunRequest) -> Progress:
        progress = await super().poll(request)
        self._activity.set()
        return progress


async def until(condition: Callable[[], bool], activity: asyncio.Event, seconds: float = 10.0) -> None:
    """Wait for ``condition``, checked after each write or poll (``activity``), failing after ``seconds``."""
    async with asyncio.timeout(seconds):
        while not condition():
            activity.clear()  # no await since the check: nothing can have happened in between
            await activity.wait()


async def running(
    target: FakeTarget, control: FakeControl, runs: EndWaitingRuns, **options: Any
) -> AsyncIterator[Agent]:
    agent = Agent(
        AgentOptions(**{"namespace": NS, "poll_seconds": 0.02, "resync_seconds": 3600, **options}),
        target,
        control,
        runs,
        AgentMetrics(Metrics()),
    )
    before = asyncio.all_tasks()
    task = asyncio.create_task(agent.run())
    try:
        yield agent
    finally:
        # the agent's: its run, per-Node tasks, watches, resync (not this one: after a failed test the
        # generator is closed by a task of its own, which must not wait for itself)
        ours = asyncio.all_tasks() - before - {asyncio.current_task()}
        for other in ours:
            other.cancel()
        await asyncio.gather(task, *ours, return_exceptions=True)


def done_after(polls: int) -> Callable[[RunRequest, int], Progress]:
    def answer(request: RunRequest, calls: int) -> Progress:
        if calls < polls:
            return Progress(ProgressState.IN_PROGRESS, "running", 1)
        return Progress(ProgressState.DONE, "update applied")

    return answer


def result(target: FakeTarget, name: str = "n1") -> str | None:
    return ns.node_labels(target.nodes[name]).get(ns.RESULT_LABEL)


async def test_a_waiting_node_is_updated_to_its_machine_class_and_answered_successful() -> None:
    target, control = FakeTarget(), FakeControl()
    runs = Runs(target, done_after(2))
    pool(control)
    target.put_node(waiting_node())
    async for _agent in running(target, control, runs):
        await until(lambda: result(target) == ns.SUCCESSFUL, target.activity)
    first = runs.requests[0]
    assert (first.namespace, first.name) == (NS, "n1")
    assert first.capabilities == ("ntp", "kubernetes_version")
    assert first.inputs["kubernetes_version"]["kubernetes_version_target"] == "v1.31.1"
    assert first.labels["keep"] == "me"
    assert first.addresses == (("InternalIP", "10.79.9.21"),), "where the host is, unless annotated or listed"
    annotations = ns.node_annotations(target.nodes["n1"])
    assert ns.CLAIM_ANNOTATION not in annotations and ns.ANSWERED_ANNOTATION in annotations
    assert target.reasons("n1") == ["InPlaceUpdateStarted", "InPlaceUpdateSucceeded"]
    assert len(runs.requests) == 3  # answered once, then left alone


async def test_the_cluster_api_unavailable_writes_no_result_and_no_event_then_the_update_goes_on() -> None:
    """The run service's ``cluster API unavailable: ...`` (the API server away or busy): nothing was
    decided, so the Node gets no result and no Event (not even InPlaceUpdateStarted); the next polls
    go on as before."""
    target, control = FakeTarget(), FakeControl()
    unavailable = Progress(
        ProgressState.IN_PROGRESS,
        "cluster API unavailable: get Node n1: the API server answered 503",
        1,
        unavailable=True,
    )

    def answer(request: RunRequest, calls: int) -> Progress:
        if calls < 3:
            return unavailable
        return done_after(1)(request, calls - 3)

    runs = Runs(target, answer)
    pool(control)
    target.put_node(waiting_node())
    async for _agent in running(target, control, runs):
        await until(lambda: len(runs.requests) >= 3, target.activity)
        assert target.reasons("n1") == [] and result(target) is None
        await until(lambda: result(target) == ns.SUCCESSFUL, target.activity)
    assert target.reasons("n1") == ["InPlaceUpdateStarted", "InPlaceUpdateSucceeded"]


async def test_polls_of_a_running_update_read_nothing_from_the_control_cluster() -> None:
    target, control = FakeTarget(), FakeControl()
    runs = Runs(target, done_after(20))
    pool(control)
    target.put_node(waiting_node())
    async for _agent in running(target, control, runs):
        await until(lambda: len(runs.requests) >= 20, target.activity)
    assert control.calls.count["watch"] == 4  # one list-then-watch per kind, at the start
    assert control.calls.count["get"] == 0 and control.calls.count["list_all"] == 0


async def test_a_changed_machine_class_is_a_new_desired_state_without_a_read() -> None:
    target, control = FakeTarget(), FakeControl()
    runs = Runs(target, lambda request, calls: Progress(ProgressState.IN_PROGRESS, "running", 1))
    pool(control)
    target.put_node(waiting_node())
    async for _agent in running(target, control, runs):
        await until(lambda: len(runs.requests) >= 2, target.activity)
        changed = copy.deepcopy(control.objects["MachineClass"]["pool-v2"])
        changed["providerSpec"]["inPlaceUpdate"] = {"kubernetesVersion": "v1.31.2"}
        control.put(changed)
        await until(lambda: runs.requests[-1].capabilities == ("kubernetes_version",), target.activity)
    assert runs.requests[-1].inputs["kubernetes_version"]["kubernetes_version_target"] == "v1.31.2"
    assert control.calls.count["get"] == 0 and control.calls.count["list_all"] == 0


async def test_a_node_without_a_desired_state_is_answered_failed_once() -> None:
    target, control = FakeTarget(), FakeControl()
    runs = Runs(target, done_after(0))
    pool(control)
    target.put_node(waiting_node(machine=None))
    async for _agent in running(target, control, runs):
        await until(lambda: result(target) == ns.FAILED, target.activity)
    reason = ns.node_annotations(target.nodes["n1"])[ns.FAILED_REASON_ANNOTATION]
    assert reason == "NoDesiredState: Node n1 has no label node.gardener.cloud/machine-name"
    assert runs.requests == [] and target.reasons("n1") == ["InPlaceUpdateFailed"]
    assert target.calls.count["patch_node_metadata"] == 1


async def test_an_invalid_desired_state_names_the_provider_spec_path() -> None:
    target, control = FakeTarget(), FakeControl()
    runs = Runs(target, done_after(0))
    pool(control, {"kubernetesVersion": "1.31"})
    target.put_node(waiting_node())
    async for _agent in running(target, control, runs):
        await until(lambda: result(target) == ns.FAILED, target.activity)
    reason = ns.node_annotations(target.nodes["n1"])[ns.FAILED_REASON_ANNOTATION]
    assert reason.startswith("InvalidDesiredState: providerSpec.inPlaceUpdate.kubernetesVersion: ")


async def test_a_retriable_failure_is_answered_failed_and_then_successful() -> None:
    target, control = FakeTarget(), FakeControl()

    def answer(request: RunRequest, calls: int) -> Progress:
        if calls < 2:
            return Progress(
                ProgressState.IN_PROGRESS, "host unreachable, retrying (attempt 2)", 1, retrying=True
            )
        return Progress(ProgressState.DONE, "update applied")

    runs = Runs(target, answer)
    pool(control)
    target.put_node(waiting_node())
    async for _agent in running(target, control, runs):
        await until(lambda: result(target) == ns.SUCCESSFUL, target.activity)
    assert target.reasons("n1") == ["InPlaceUpdateStarted", "InPlaceUpdateFailed", "InPlaceUpdateSucceeded"]
    assert ns.FAILED_REASON_ANNOTATION not in ns.node_annotations(target.nodes["n1"])


async def test_the_critical_components_taint_is_removed_once_mcm_is_done() -> None:
    target, control = FakeTarget(), FakeControl()
    runs = Runs(target, done_after(0))
    node = waiting_node()
    del node["metadata"]["labels"][ns.CANDIDATE_LABEL]
    key, effect = ns.CRITICAL_TAINT
    node["spec"] = {"taints": [{"key": key, "effect": effect}, {"key": "other", "effect": "NoSchedule"}]}
    target.put_node(node)
    async for _agent in running(target, control, runs):
        await until(lambda: len(target.nodes["n1"]["spec"]["taints"]) == 1, target.activity)
    assert target.nodes["n1"]["spec"]["taints"] == [{"key": "other", "effect": "NoSchedule"}]
    assert runs.requests == []


async def test_an_object_whose_watch_event_is_still_on_its_way_is_read_once() -> None:
    target = FakeTarget()
    control = FakeControl(target.activity)
    runs = Runs(target, done_after(0))
    pool(control)
    async for _agent in running(target, control, runs):
        await until(lambda: control.calls.count["watch"] == 4, target.activity)
        # then MCM points the pool at a new MachineClass: the MachineDeployment's change arrives by
        # watch, the MachineSets' and the MachineClass's are still on their way (written behind the
        # watchers' back)
        later = copy.deepcopy(control.objects["MachineClass"]["pool-v2"])
        later["metadata"]["name"] = "pool-v3"
        later["providerSpec"]["inPlaceUpdate"] = {"kubernetesVersion": "v1.31.3"}
        control.objects["MachineClass"]["pool-v3"] = later
        for machine_set in control.objects["MachineSet"].values():
            machine_set["spec"]["template"]["spec"]["class"]["name"] = "pool-v3"
        deployment = copy.deepcopy(control.objects["MachineDeployment"]["pool"])
        deployment["spec"]["template"]["spec"]["class"]["name"] = "pool-v3"
        control.put(deployment)
        target.put_node(waiting_node())
        await until(lambda: result(target) == ns.SUCCESSFUL, target.activity)
    # the copy had the old MachineSets: they were listed once, and the MachineClass read once
    assert (control.calls.count["list_all"], control.calls.count["get"]) == (1, 1)
    assert runs.requests[0].inputs["kubernetes_version"]["kubernetes_version_target"] == "v1.31.3"


async def test_the_agent_reads_no_node_it_watches_however_often_it_polls_or_resyncs() -> None:
    """Its Node tasks work on the watched copy (and on what its own patches answered): a running update
    polled 20 times and resyncs every 10 ms send the target cluster no read, only the writes of the
    update (claim, result) and its Events. 50 idle Nodes in the pool cost nothing either."""
    target, control = FakeTarget(), FakeControl()
    runs = Runs(target, done_after(20))
    pool(control)
    target.put_node(waiting_node())
    for i in range(50):
        idle = waiting_node(f"idle-{i}", machine=None)
        del idle["metadata"]["labels"][ns.CANDIDATE_LABEL]
        target.put_node(idle)
    async for _agent in running(target, control, runs, resync_seconds=0.01):
        await until(lambda: result(target) == ns.SUCCESSFUL, target.activity)
    assert len(runs.requests) == 21
    assert set(target.calls.count) == {"watch_nodes", "patch_node_metadata", "post_event"}
    assert target.calls.count["watch_nodes"] == 1
    assert target.calls.count["patch_node_metadata"] == 2, "the claim and the final result"


async def test_a_node_deleted_while_its_update_runs_ends_its_task() -> None:
    """The watch reports it gone: the agent stops polling for it and writes nothing more."""
    target, control = FakeTarget(), FakeControl()
    runs = Runs(target, lambda request, calls: Progress(ProgressState.IN_PROGRESS, "running", 1))
    pool(control)
    target.put_node(waiting_node())
    async for agent in running(target, control, runs):
        await until(lambda: len(runs.requests) >= 3, target.activity)
        task = agent._tasks["n1"]  # the Node's task, polling every 20 ms
        target.delete_node("n1")
        async with asyncio.timeout(5):
            await task  # it ends by itself
        polls, writes = len(runs.requests), target.calls.count["patch_node_metadata"]
        target.put_node(waiting_node("other", machine=None))  # later activity: n1 is still left alone
        await until(lambda: result(target, "other") == ns.FAILED, target.activity)
        assert (len(runs.requests), target.calls.count["patch_node_metadata"]) == (polls, writes + 1)


def like_the_service(request: RunRequest, calls: int) -> Progress:
    """The run service's answers to a held request (tests/runs/test_service.py checks the service)."""
    if request.hold is not None and request.hold.cancel:
        return Progress(ProgressState.FAILED, request.hold.message, cancelled=True)
    if request.hold is not None:
        return Progress(ProgressState.IN_PROGRESS, request.hold.message, 30, waiting="pause")
    return Progress(ProgressState.DONE, "update applied")


def annotate_deployment(control: FakeControl, value: str | None) -> None:
    deployment = copy.deepcopy(control.objects["MachineDeployment"]["pool"])
    annotations = deployment["metadata"].setdefault("annotations", {})
    if value is None:
        annotations.pop("inplace-extension.io/pause", None)
    else:
        annotations["inplace-extension.io/pause"] = value
    control.put(deployment)


async def test_the_pause_annotation_on_the_deployment_holds_cancels_and_resumes_the_node() -> None:
    """Resync is an hour here: each step is woken by the MachineDeployment's watch event alone."""
    target, control = FakeTarget(), FakeControl()
    runs = Runs(target, like_the_service)
    pool(control)
    annotate_deployment(control, "true")
    target.put_node(waiting_node())
    paused = f"paused by MachineDeployment {NS}/pool (annotation inplace-extension.io/pause)"
    cancelled = f"cancelled by MachineDeployment {NS}/pool (annotation inplace-extension.io/pause=cancel)"
    async for _agent in running(target, control, runs):
        await until(lambda: target.reasons("n1") == ["InPlaceUpdateWaiting"], target.activity)
        assert runs.requests[-1].hold is not None
        assert runs.requests[-1].hold.message == paused
        assert result(target) is None, "a paused Node gets no result: MCM keeps it waiting"
        annotate_deployment(control, "cancel")
        await until(lambda: result(target) == ns.FAILED, target.activity)
        annotations = ns.node_annotations(target.nodes["n1"])
        assert annotations[ns.FAILED_REASON_ANNOTATION] == cancelled
        assert ns.ANSWERED_ANNOTATION not in annotations, "not final: removing the cancel resumes"
        annotate_deployment(control, None)
        await until(lambda: result(target) == ns.SUCCESSFUL, target.activity)
    assert target.reasons("n1") == ["InPlaceUpdateWaiting", "InPlaceUpdateFailed", "InPlaceUpdateSucceeded"]
    assert [e.message for e in target.events if e.reason != "InPlaceUpdateSucceeded"] == [paused, cancelled]
    assert runs.requests[-1].hold is None


TIMED_OUT = 'health check "ceph" did not hold within 2h before the update (object.ok on CephCluster r/ceph)'


async def test_a_health_check_past_its_timeout_fails_the_node_until_it_holds_then_it_updates() -> None:
    """The run service answers a Failure that is not remembered (tests/runs/test_health_wait.py): the
    failed result is not final, the agent's resync looks again, and the update starts once it holds."""
    target, control = FakeTarget(), FakeControl()

    def health(request: RunRequest, calls: int) -> Progress:
        if not runs.released:
            return Progress(ProgressState.FAILED, TIMED_OUT, transient=True)
        return Progress(ProgressState.DONE, "update applied")

    runs = Runs(target, health)
    pool(control)
    target.put_node(waiting_node())
    async for _agent in running(target, control, runs, resync_seconds=0.05):
        await until(lambda: result(target) == ns.FAILED, target.activity)
        annotations = ns.node_annotations(target.nodes["n1"])
        assert annotations[ns.FAILED_REASON_ANNOTATION] == TIMED_OUT
        assert ns.ANSWERED_ANNOTATION not in annotations, "not final: the Node is looked at again"
        await until(lambda: len(runs.requests) >= 4, target.activity)  # the resync looks again
        assert result(target) == ns.FAILED
        runs.released.add("n1")  # the check holds
        await until(lambda: result(target) == ns.SUCCESSFUL, target.activity)
    assert target.reasons("n1") == ["InPlaceUpdateFailed", "InPlaceUpdateSucceeded"], "one Event each"
    assert ns.ANSWERED_ANNOTATION in ns.node_annotations(target.nodes["n1"])


OURS = {ns.ANSWERED_ANNOTATION, ns.CLAIM_ANNOTATION}


async def test_our_annotations_are_removed_once_mcm_is_done_with_the_node() -> None:
    target, control = FakeTarget(), FakeControl()
    runs = Runs(target, done_after(0))
    pool(control)
    target.put_node(waiting_node())
    async for _agent in running(target, control, runs):
        await until(lambda: result(target) == ns.SUCCESSFUL, target.activity)
        kept = ns.node_annotations(target.nodes["n1"])
        assert ns.ANSWERED_ANNOTATION in kept, "kept while MCM has not consumed the result"
        # MCM consumes the result: the candidate and result labels go (a dead replica's claim stays)
        done = copy.deepcopy(target.nodes["n1"])
        for label in (ns.CANDIDATE_LABEL, ns.RESULT_LABEL):
            del done["metadata"]["labels"][label]
        done["metadata"]["annotations"][ns.CLAIM_ANNOTATION] = "dead-replica 1"
        target.put_node(done)
        await until(lambda: not OURS & set(ns.node_annotations(target.nodes["n1"])), target.activity)
    assert ns.node_labels(target.nodes["n1"])["keep"] == "me"
    assert len(runs.requests) == 1, "no second update"


class PlayingRuns(Runs):
    """A play in flight until the test ends it: polls answer ``running`` (in flight) until then, and
    ``wait_end`` waits for that end as the run service does."""

    def __init__(self, target: FakeTarget) -> None:
        super().__init__(target, self._answer)
        self.ended = asyncio.Event()
        self.ended_at = 0.0  # the loop's time when the play ended

    def _answer(self, request: RunRequest, calls: int) -> Progress:
        if self.ended.is_set():
            return Progress(ProgressState.DONE, "update applied")
        return Progress(ProgressState.IN_PROGRESS, "running: ntp", 10, in_flight=True)

    async def wait_end(self, request: RunRequest, seconds: float) -> bool:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.ended.wait(), seconds)
        return self.ended.is_set()

    def end(self) -> None:
        self.ended_at = asyncio.get_running_loop().time()
        self.ended.set()


async def end_to_answer(target: FakeTarget, runs: PlayingRuns) -> float:
    """Seconds from the play's end to the Node's successful result, the agent polling every 30 s; fails
    after 5 s."""
    control = FakeControl()
    pool(control)
    target.put_node(waiting_node())
    async for _agent in running(target, control, runs, poll_seconds=30.0):
        await until(lambda: len(runs.requests) >= 1, target.activity)
        assert result(target) is None
        runs.end()
        await until(lambda: result(target) == ns.SUCCESSFUL, target.activity, seconds=5.0)
        answered = asyncio.get_running_loop().time()
    return answered - runs.ended_at


async def test_the_agent_answers_as_the_play_ends_not_at_its_next_tick() -> None:
    """With a poll every 30 s, the Node's result follows the play's end at once: the agent waits for the
    end (wait_end) between its polls, and polls again when it comes."""
    target = FakeTarget()
    assert await end_to_answer(target, PlayingRuns(target)) < 0.3


class WatchedTarget(FakeTarget):
    """The fake target that says when the agent has taken a Node's change in from its watch (``taken``:
    the agent asked for the next change, so its handling of the last one, the wake of the Node's task,
    has run)."""

    def __init__(self) -> None:
        super().__init__()
        self.taken = asyncio.Event()

    def watch_nodes(self, connected: asyncio.Event | None = None) -> AsyncIterator[NodeSeen]:
        changes = super().watch_nodes(connected)

        async def nodes() -> AsyncIterator[NodeSeen]:
            async for seen in changes:
                yield seen
                self.taken.set()

        return nodes()


class KubeletRestartExecutor(PlayingRuns):
    """A real play's end on a real node: the kubelet the play restarted writes its Node while the poll
    that answers done is on its way, and the watch event of that write reaches the agent before the poll
    returns. The agent's answer, guarded by the resourceVersion it last saw, meets a Conflict."""

    def __init__(self, target: WatchedTarget) -> None:
        super().__init__(target)
        self._target = target
        self.done_answers = 0

    async def poll(self, request: RunRequest) -> Progress:
        progress = await super().poll(request)
        if progress.state is ProgressState.DONE:
            self.done_answers += 1
            if self.done_answers == 1:
                node = copy.deepcopy(self._target.nodes["n1"])
                node["status"]["conditions"].append({"type": "MemoryPressure", "status": "False"})
                self._target.taken.clear()
                self._target.put_node(node)
                await self._target.taken.wait()
        return progress


async def test_a_wake_during_a_step_is_not_lost() -> None:
    """The Node's watch event that arrives while a step runs (here the kubelet's write that made the
    step's answer a Conflict) wakes the next wait at once: the answer follows the play's end, not the
    next tick 30 s later."""
    target = WatchedTarget()
    runs = KubeletRestartExecutor(target)
    assert await end_to_answer(target, runs) < 0.3
    assert runs.done_answers == 2, "the first answer met the Conflict, the second one was written"
    assert {"type": "MemoryPressure", "status": "False"} in target.nodes["n1"]["status"]["conditions"]
