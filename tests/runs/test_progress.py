"""The one table of progress messages (runs/progress.py): what the engine answers matches the pattern the
end-to-end tests check polled messages with, and nothing else does."""

from __future__ import annotations

import pytest

from inplace_extension.local.registry import EntryState, EntryView
from inplace_extension.plays.steps import HEALTH_TASK, StepTracker
from inplace_extension.runs import progress
from inplace_extension.runs.attempts import OutcomeKind
from inplace_extension.runs.model import NO_CLUSTER_SIDE, RunRequest
from inplace_extension.runs.policy import Verdict, decide

from .test_policy import att

CAPABILITIES = ("kubeadm_files", "ntp")
MESSAGES = progress.pattern(CAPABILITIES)


def test_every_phase_of_a_play_is_a_message_of_the_table() -> None:
    request = RunRequest("ns", "m1", "ab" * 32, CAPABILITIES, {c: {} for c in CAPABILITIES})
    phases: list[str] = []
    tracker = StepTracker([request], lambda ident, phase: phases.append(phase), NO_CLUSTER_SIDE)
    for role, task in [(None, "lock"), ("kubeadm_files", "write"), ("ntp", "configure"), (None, HEALTH_TASK)]:
        tracker.on_task(request.ident, role, task)
    tracker.on_task(request.ident, None, "stamp")
    answers = [EntryView(EntryState.RUNNING, phase, 0, 0).message() for phase in phases]
    answers.append(EntryView(EntryState.QUEUED, progress.STARTING, 2, 3).message())
    assert progress.HEALTH_COMMANDS in answers
    assert all(MESSAGES.fullmatch(a) for a in answers), answers


@pytest.mark.parametrize("kind", [OutcomeKind.UNREACHABLE, OutcomeKind.HOST_BUSY, OutcomeKind.INTERRUPTED])
def test_a_retry_wait_is_a_message_of_the_table(kind: OutcomeKind) -> None:
    decision = decide([att(1, kind, finished=100.0)], "", 101.0, 10)
    assert decision.verdict is Verdict.WAIT
    assert MESSAGES.fullmatch(decision.message), decision.message


def test_cluster_steps_only_when_asked_and_other_text_never() -> None:
    assert MESSAGES.fullmatch(progress.APPLIED)
    assert not MESSAGES.fullmatch(progress.draining(3))
    with_cluster = progress.pattern(CAPABILITIES, cluster_steps=True)
    assert with_cluster.fullmatch(progress.draining(1)) and with_cluster.fullmatch(progress.draining(3))
    assert with_cluster.fullmatch(progress.health_waiting("waiting for Node n1 to be Ready"))
    for other in ["running: users", "running: ntp and more", "queued: position x of 2", "update applied!"]:
        assert not with_cluster.fullmatch(other), other


def test_a_pause_is_progress_and_a_cancel_is_not() -> None:
    """The pause and cancel messages of both callers (the CAPI side, the MCM agent) come from the table;
    a cancel is a Failure, so no poll of an update going on may answer it."""
    owner = "MachineDeployment machines/pool"
    paused = progress.paused(owner, "inplace-extension.io/pause")
    assert paused == "paused by MachineDeployment machines/pool (annotation inplace-extension.io/pause)"
    assert MESSAGES.fullmatch(paused)
    cancelled = progress.cancelled(owner, "inplace-extension.io/pause", "cancel")
    assert cancelled == (
        "cancelled by MachineDeployment machines/pool (annotation inplace-extension.io/pause=cancel)"
    )
    assert not progress.pattern(CAPABILITIES, cluster_steps=True).fullmatch(cancelled)
    unreadable = progress.pause_unreadable("Cluster default/c1", "connection refused")
    assert not MESSAGES.fullmatch(unreadable)
    assert progress.pattern(CAPABILITIES, cluster_steps=True).fullmatch(unreadable)


def test_a_health_check_past_its_timeout_before_the_start_is_a_failure_spelled_like_the_file() -> None:
    timed_out = progress.health_check_timed_out("ceph", 5400, "object.ok", "CephCluster rook-ceph/ceph")
    assert timed_out == (
        'health check "ceph" did not hold within 1h30m before the update (object.ok on CephCluster '
        "rook-ceph/ceph)"
    )
    assert not progress.pattern(CAPABILITIES, cluster_steps=True).fullmatch(timed_out)
    assert [progress.duration(s) for s in (7200, 90, 3661, 45)] == ["2h", "1m30s", "1h1m1s", "45s"]
