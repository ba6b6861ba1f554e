"""The phase a poll answers while the play runs, from the play's task events (runs/steps.py)."""

from __future__ import annotations

from inplace_extension.runs.model import NO_CLUSTER_SIDE, RunRequest
from inplace_extension.runs.steps import HEALTH_TASK, StepTracker

FP = "ab" * 32


def test_phases_follow_the_roles_then_the_health_gate_then_finishing() -> None:
    request = RunRequest("ns", "m1", FP, ("kubeadm_files",), {"kubeadm_files": {}})
    phases: list[tuple[str, str]] = []
    tracker = StepTracker([request], lambda ident, phase: phases.append((ident, phase)), NO_CLUSTER_SIDE)
    for role, task in [
        (None, "Take the host lock and read the applied fingerprint"),
        ("kubeadm_files", "Write the files"),
        (None, HEALTH_TASK),
        (None, "Write the stamp of the applied fingerprint"),
    ]:
        tracker.on_task(request.ident, role, task)
    assert [phase for _, phase in phases] == [
        "starting",
        "kubeadm_files",
        "health gate: running the command checks on the host",
        "finishing",
    ]
