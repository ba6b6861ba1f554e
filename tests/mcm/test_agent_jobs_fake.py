"""The MCM agent with the ``kubernetes`` executor (the run service over kubejobs' JobBackend) against the
in-memory fakes: the record is an annotation on the fake target's Node, so every record write is also a
watch event that wakes the Node's task, as on a real API server. The Jobs are tests/kubefake.py's."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest
from kubefake import FakeControl, FakeJobs, FakeTarget
from kubejobs.support import job_backend, outcome
from run_deps import run_service
from runs.test_service import KEY

from inplace_extension.kube.errors import Conflict
from inplace_extension.kube.port import Annotation, RecordRef
from inplace_extension.kubejobs.backend import JOB_LOOK_SECONDS
from inplace_extension.mcm import node_state as ns
from inplace_extension.runs.attempts import OutcomeKind
from inplace_extension.runs.model import Progress, RunRequest
from inplace_extension.runs.service import RunService
from inplace_extension.settings import Settings

from .test_agent_fake import pool, result, running, until, waiting_node

pytestmark = pytest.mark.anyio
T = TypeVar("T")


class NodeRecords:
    """The RecordStore port on the fake target's Nodes: the JobBackend's worker threads read and write the
    record annotation on the event loop (the fake is not thread-safe), each write a Node watch event."""

    def __init__(self, target: FakeTarget, loop: asyncio.AbstractEventLoop) -> None:
        self._target, self._loop = target, loop

    def _on_loop(self, work: Callable[[], T]) -> T:
        async def run() -> T:
            return work()

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(10)

    def read(self, ref: RecordRef, key: str) -> Annotation | None:
        def read() -> Annotation | None:
            node = self._target.nodes.get(ref.name)
            if node is None:
                return None
            value = ns.node_annotations(node).get(key)
            return Annotation(value, node["metadata"]["resourceVersion"], ref.name)

        return self._on_loop(read)

    def write(self, ref: RecordRef, key: str, value: str | None, resource_version: str) -> None:
        def write() -> None:
            node = self._target.nodes[ref.name]
            if node["metadata"]["resourceVersion"] != resource_version:
                raise Conflict(f"annotate {ref}: the API server answered 409", 409)
            annotations = dict(ns.node_annotations(node))
            if value is None:
                annotations.pop(key, None)
            else:
                annotations[key] = value
            self._target.put_node({**node, "metadata": {**node["metadata"], "annotations": annotations}})

        self._on_loop(write)


class Later:
    """Wall-clock time plus ``ahead`` seconds, which the test moves: a play past its expected end."""

    def __init__(self) -> None:
        self.ahead = 0.0

    def __call__(self) -> float:
        return time.time() + self.ahead


def service(tmp_path: Path, target: FakeTarget, jobs: FakeJobs, clock: Later) -> RunService:
    inventory = tmp_path / "inventory.yaml"
    key = tmp_path / "id"  # the agent copies it into each Job's Secret
    key.write_text("the host's private key\n")
    inventory.write_text(
        f'hosts:\n  - match: {{name: "n*"}}\n    address: 10.79.9.21\n    known_hosts: "{KEY}"\n'
        f"defaults: {{user: ansible, private_key_file: {key}}}\n"
    )
    settings = Settings(
        inventory=inventory,
        allowed_cidrs=["10.79.9.0/24"],
        runs_dir=tmp_path / "runs",
        retry_after_seconds=1,
        executor="kubernetes",
    )
    records = NodeRecords(target, asyncio.get_running_loop())
    backend = job_backend(jobs, records, lambda request: RecordRef("Node", request.name), clock)
    return run_service(settings, clock=clock, backend=backend)


class Counted:
    """The run service, its polls counted (what the agent asked of it)."""

    def __init__(self, service: RunService) -> None:
        self.service = service
        self.polls = 0

    async def poll(self, request: RunRequest) -> Progress:
        self.polls += 1
        return await self.service.poll(request)

    async def held(self, request: RunRequest) -> Progress | None:
        return await self.service.held(request)

    async def wait_end(self, request: RunRequest, seconds: float) -> bool:
        return await self.service.wait_end(request, seconds)


class LookedAtJobs(FakeJobs):
    """The fake Jobs, each read of a Job alone (an end wait's look, a second into the wait: never one
    that a wake cancelled at once) announced on ``looked``."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self._loop = loop
        self.looked = asyncio.Event()

    def job_finished(self, namespace: str, name: str) -> bool | None:
        self._loop.call_soon_threadsafe(self.looked.set)
        return super().job_finished(namespace, name)


async def test_between_its_polls_the_agent_waits_for_the_jobs_end(tmp_path: Path) -> None:
    """With the kubernetes executor too the agent waits for the play's end between its polls: polling
    every 30 s, it answers the Job's outcome within a look of the Job's end (JOB_LOOK_SECONDS), not at its
    next tick. While it waits it reads the Job alone, once a second, and polls nothing."""
    target, control, jobs = FakeTarget(), FakeControl(), LookedAtJobs(asyncio.get_running_loop())
    pool(control)
    target.put_node(waiting_node())
    executor = Counted(service(tmp_path, target, jobs, Later()))
    async for _agent in running(target, control, executor, poll_seconds=30.0):
        await asyncio.wait_for(jobs.looked.wait(), 10.0)  # the Job launched, its end waited for
        polls, looks, reads = executor.polls, jobs.calls.count["job_state"], jobs.calls.count["job_finished"]
        window = 2.5
        await asyncio.sleep(window)  # the play goes on: what the waiting agent asks meanwhile, counted
        polls, looks = executor.polls - polls, jobs.calls.count["job_state"] - looks
        reads = jobs.calls.count["job_finished"] - reads
        assert polls == 0, f"{polls} polls while it waits"
        assert looks == 0, f"{looks} full looks at the Job and its Pods while it waits"
        assert 1 <= reads <= window / JOB_LOOK_SECONDS + 1, f"{reads} reads of the Job in {window} s"
        before = executor.polls
        jobs.finish(jobs.only_job().manifest["metadata"]["name"], outcome(OutcomeKind.SUCCESSFUL, 1.0))
        # a look every JOB_LOOK_SECONDS, then one poll; slack for a loaded machine, far below the 30 s tick
        await until(lambda: result(target) == ns.SUCCESSFUL, target.activity, seconds=JOB_LOOK_SECONDS + 4.0)
        assert executor.polls - before == 1, "the poll after the wait answers the outcome"


async def test_a_job_that_ends_is_answered_while_the_node_keeps_changing(tmp_path: Path) -> None:
    """The Node changes all the time during the play (the kubelet's status, other writers): each change
    wakes the Node's task. Once the Job ends, its outcome is recorded and the Node answered."""
    target, control, jobs = FakeTarget(), FakeControl(), FakeJobs()
    pool(control)
    target.put_node(waiting_node())
    clock = Later()
    executor = service(tmp_path, target, jobs, clock)

    async def churn() -> None:
        for beat in itertools.count():  # as the kubelet's status updates, only far more often
            node = target.nodes["n1"]
            target.put_node({**node, "status": {**node["status"], "beat": beat}})
            await asyncio.sleep(0.05)

    async for _agent in running(target, control, executor, poll_seconds=0.5):
        await until(lambda: bool(jobs.jobs), target.activity)
        clock.ahead = 3600.0  # the play is held past its expected end (its health gate, say)
        noise = asyncio.create_task(churn())
        try:
            await asyncio.sleep(2.0)
            name = jobs.only_job().manifest["metadata"]["name"]
            jobs.finish(name, outcome(OutcomeKind.SUCCESSFUL, 1.0))
            await until(lambda: result(target) == ns.SUCCESSFUL, target.activity, seconds=15.0)
        finally:
            noise.cancel()
