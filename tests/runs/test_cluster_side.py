"""RunService with a fake cluster side (the Kubernetes-aware mode's seam) and a fake runner: the host
from the live Machine, a drain failure as a remembered Failure, the health gate, the call order."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path

import anyio
import pytest
from run_deps import run_service

from inplace_extension.runs.model import Blocked, Hold, Progress, ProgressState, RunRequest
from inplace_extension.runs.resolve import pick_address
from inplace_extension.runs.service import RunService
from inplace_extension.runs.windows import MaintenanceWindow, Schedule

from .cluster_settings import cluster_side_settings
from .fakes import FakeRunner, unreachable_events
from .test_service import req, settle

pytestmark = pytest.mark.anyio


class FakeClusterSide:
    def __init__(self) -> None:
        self.addrs: list[tuple[str, str]] = []
        self.drain_failure: Blocked | None = None
        self.drain_before: str | None = "kubeadm_files"  # the first disruptive step of req()'s
        self.gate: list[Progress] = []  # answers of settle(), in turn; then done
        self.held: Hold | None = None
        self.cleaned: list[bool] = []  # answers of failed(), in turn; then clean
        self.calls: list[str] = []
        self.lock = threading.Lock()

    def _log(self, call: str) -> None:
        with self.lock:
            self.calls.append(call)

    def addresses(self, request: RunRequest) -> Sequence[tuple[str, str]]:
        self._log("addresses")
        return self.addrs

    def hold(self, request: RunRequest) -> Hold | None:
        return self.held

    def before_play(self, request: RunRequest) -> Blocked | None:
        self._log("before_play")
        return None

    def drain_point(self, request: RunRequest) -> str | None:
        return self.drain_before

    def drain(self, request: RunRequest, report: Callable[[str], None]) -> Blocked | None:
        self._log("drain")
        report("draining: 1 pod left")
        return self.drain_failure

    def step_started(self, request: RunRequest, capability: str) -> None:
        self._log(f"step {capability}")

    def after_play(self, request: RunRequest) -> None:
        self._log("after_play")

    def settle(self, request: RunRequest, applied_at: float, address: str | None) -> Progress:
        self._log(f"settle {address}")
        return self.gate.pop(0) if self.gate else Progress(ProgressState.DONE, "update applied")

    def failed(self, request: RunRequest, message: str) -> bool:
        self._log(f"failed {message}")
        return self.cleaned.pop(0) if self.cleaned else True

    def state(self, request: RunRequest, reason: str, message: str, warning: bool = False) -> None:
        self._log(f"state {reason}: {message}")


@pytest.fixture
def side() -> FakeClusterSide:
    return FakeClusterSide()


@pytest.fixture
def svc(tmp_path: Path, fake: FakeRunner, side: FakeClusterSide) -> Iterator[RunService]:
    # no entry matches: the address must come from the Machine; the defaults give the SSH settings
    service = run_service(cluster_side_settings(tmp_path), cluster=side)
    yield service
    service.close()


def test_the_first_ip_of_the_first_preferred_type_wins() -> None:
    addresses = [
        ("Hostname", "node-1"),
        ("ExternalIP", "203.0.113.9"),
        ("InternalIP", "nope"),
        ("InternalIP", "10.0.0.9"),
    ]
    assert pick_address(addresses, ("InternalIP", "ExternalIP")) == "10.0.0.9"
    assert pick_address(addresses, ("ExternalIP", "InternalIP")) == "203.0.113.9"
    assert pick_address(addresses, ("Hostname",)) is None  # host names are never resolved


async def test_the_host_comes_from_the_machine_status_and_the_run_is_wrapped(
    svc: RunService, fake: FakeRunner, side: FakeClusterSide
) -> None:
    side.addrs = [("ExternalIP", "10.79.9.77"), ("InternalIP", "10.79.9.66")]
    side.gate = [Progress(ProgressState.IN_PROGRESS, "health gate: waiting for Node n1 to be Ready")]
    request = req("x1")
    progress = await settle(svc, request)
    assert progress.message == "health gate: waiting for Node n1 to be Ready"
    assert (progress.state, progress.retry_after_seconds) == (ProgressState.IN_PROGRESS, 1)
    assert fake.started[0].target.address == "10.79.9.66"
    assert (await svc.poll(request)).state is ProgressState.DONE
    assert (await svc.poll(request)).state is ProgressState.DONE
    assert side.calls == [
        "addresses",
        "state Queued: queued",
        "state Started: started on host 10.79.9.66 (machine status)",
        "before_play",
        "step ntp",  # not disruptive: before the drain, on a schedulable Node
        "drain",
        "step kubeadm_files",
        "after_play",
        "settle 10.79.9.66",
        "settle 10.79.9.66",  # once the gate passed, the answer is remembered: no third call
        "state Done: update applied",  # said by the service once the checks of cluster objects hold too
    ]


async def test_no_address_anywhere_is_host_not_found(svc: RunService, side: FakeClusterSide) -> None:
    progress = await svc.poll(req("x2"))
    assert progress.state is ProgressState.FAILED
    assert progress.message == (
        "HostNotFound: no inventory entry matches this Machine and it has no inplace-extension.io/address "
        "annotation, nor an InternalIP/ExternalIP address in its status"
    )
    side.addrs = [("InternalIP", "192.0.2.1")]
    refused = await svc.poll(req("x2"))
    assert refused.message == "HostNotAllowed: the address from the machine status is outside --allowed-cidrs"


async def test_a_drain_failure_stops_the_play_at_the_drain_point_says_what_was_applied_and_is_remembered(
    svc: RunService, fake: FakeRunner, side: FakeClusterSide
) -> None:
    side.addrs = [("InternalIP", "10.79.9.66")]
    drained = "drain: timed out after 3s with 1 pod left on Node n1"
    side.drain_failure = Blocked(drained)
    request = req("x3")
    first = await settle(svc, request)
    message = f"{drained}; applied before the drain: ntp"
    assert (first.state, first.message) == (ProgressState.FAILED, message)
    assert (await svc.poll(request)).message == message
    assert fake.count("x3") == 1  # one play: ntp applied, stopped before kubeadm_files
    assert "step kubeadm_files" not in side.calls
    assert side.calls.index("step ntp") < side.calls.index("drain")
    assert side.calls.count(f"failed {message}") == 1  # clean-up and Event once, not per poll
    assert side.calls.index("after_play") < side.calls.index(f"failed {message}")


async def test_a_failure_whose_clean_up_the_api_server_refused_is_cleaned_up_on_a_later_poll(
    svc: RunService, fake: FakeRunner, side: FakeClusterSide
) -> None:
    side.addrs = [("InternalIP", "10.79.9.66")]
    side.drain_failure = Blocked("drain: timed out after 3s with 1 pod left on Node n1")
    side.cleaned = [False, False]  # the API server is away for the first two tries
    request = req("x6")
    first = await settle(svc, request)
    assert first.state is ProgressState.FAILED
    for _ in range(3):
        assert (await svc.poll(request)).message == first.message
    assert side.calls.count(f"failed {first.message}") == 3  # until it could clean up, then never again


async def test_no_drain_point_no_drain(svc: RunService, fake: FakeRunner, side: FakeClusterSide) -> None:
    side.addrs = [("InternalIP", "10.79.9.66")]
    side.drain_before = None
    side.drain_failure = Blocked("never asked")
    assert (await settle(svc, req("x5"))).state is ProgressState.DONE
    assert "drain" not in side.calls and "step kubeadm_files" in side.calls


async def test_an_unreachable_api_server_is_retried_with_backoff(
    svc: RunService, fake: FakeRunner, side: FakeClusterSide
) -> None:
    side.addrs = [("InternalIP", "10.79.9.66")]
    side.drain_failure = Blocked("drain: the API server is unreachable (ConnectError)", retriable=True)
    request = req("x4")
    waiting = await settle(svc, request)
    assert (waiting.state, waiting.message) == (
        ProgressState.IN_PROGRESS,
        "run interrupted, retrying (attempt 2)",
    )
    assert not any(call.startswith("failed") for call in side.calls)
    assert fake.count("x4") == 1 and "step kubeadm_files" not in side.calls


async def test_waiting_for_a_window_posts_one_event_and_the_health_gate_is_a_wait(
    tmp_path: Path, fake: FakeRunner, side: FakeClusterSide
) -> None:
    settings = cluster_side_settings(tmp_path)
    clock = [datetime(2026, 12, 1, 21, 0, tzinfo=UTC).timestamp()]
    nights = Schedule((MaintenanceWindow("nights", "0 22 * * *", 3600),))
    service = run_service(settings, cluster=side, windows=nights, clock=lambda: clock[0])
    side.addrs = [("InternalIP", "10.79.9.20")]
    side.gate = [Progress(ProgressState.IN_PROGRESS, "health gate: waiting for Node m1 to be Ready")]
    try:
        message = 'waiting for maintenance window "nights" (opens 2026-12-01T22:00Z)'
        for _ in range(3):
            answer = await service.poll(req())
            assert (answer.message, answer.waiting, answer.retry_after_seconds) == (message, "window", 300)
        assert side.calls == [f"state Waiting: {message}"], "one Event, nothing else in the cluster"
        clock[0] += 3600
        gate = await settle(service, req())
        assert (gate.message, gate.waiting) == (
            "health gate: waiting for Node m1 to be Ready",
            "health_check",
        )
    finally:
        service.close()


PAUSED = "paused by MachineDeployment default/md-0 (annotation inplace-extension.io/pause)"
CANCELLED = "cancelled by Cluster default/c1 (annotation inplace-extension.io/pause=cancel)"


async def test_a_pause_holds_new_runs_until_it_is_removed(
    svc: RunService, fake: FakeRunner, side: FakeClusterSide
) -> None:
    side.addrs = [("InternalIP", "10.79.9.20")]
    side.held = Hold(PAUSED)
    for _ in range(2):
        answer = await svc.poll(req())
        assert (answer.state, answer.message, answer.waiting) == (ProgressState.IN_PROGRESS, PAUSED, "pause")
        assert answer.retry_after_seconds == 30
    assert fake.count("m1") == 0
    assert side.calls == [f"state Waiting: {PAUSED}"]
    side.held = None  # the annotation was removed: resumed
    assert (await settle(svc, req())).state is ProgressState.DONE
    assert fake.count("m1") == 1


async def test_cancel_fails_every_machine_whose_next_attempt_has_not_started(
    svc: RunService, fake: FakeRunner, side: FakeClusterSide
) -> None:
    """m1 started and is in its retry backoff, m2 never started: the cancel fails both (one Event each),
    while m3, whose play is in flight, finishes; removing the annotation lets m1 and m2 start."""
    side.addrs = [("InternalIP", "10.79.9.20")]
    fake.scripts["m1"] = [lambda spec: ("failed", 4, unreachable_events())]
    started = await settle(svc, req("m1"))
    assert started.message == "host unreachable, retrying (attempt 2)"
    fake.gate = threading.Event()
    await svc.poll(req("m3"))
    deadline = time.monotonic() + 10
    while fake.count("m3") == 0:
        assert time.monotonic() < deadline, "m3's play never started"
        await anyio.sleep(0.01)
    side.held = Hold(CANCELLED, cancel=True)
    for name in ("m1", "m2"):
        for _ in range(2):
            assert await svc.poll(req(name)) == Progress(ProgressState.FAILED, CANCELLED, cancelled=True)
    assert (fake.count("m1"), fake.count("m2")) == (1, 0)
    assert side.calls.count(f"state Cancelled: {CANCELLED}") == 2  # one per Machine, not per poll
    assert (await svc.poll(req("m3"))).state is ProgressState.IN_PROGRESS  # its play goes on
    fake.gate.set()
    assert (await settle(svc, req("m3"))).state is ProgressState.DONE
    side.held = None  # the annotation removed
    for name in ("m1", "m2"):
        deadline = time.monotonic() + 10
        while (progress := await settle(svc, req(name))).retrying:  # m1's backoff (1 s) may not be over
            assert time.monotonic() < deadline, progress
            await anyio.sleep(0.05)
        assert progress.state is ProgressState.DONE
    assert (fake.count("m1"), fake.count("m2"), fake.count("m3")) == (2, 1, 1)
