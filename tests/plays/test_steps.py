"""The phase a poll answers while the play runs, from the play's task events (plays/steps.py)."""

from __future__ import annotations

from pathlib import Path

from inplace_extension.plays.steps import HEALTH_TASK, JOINT_TASK, StepTracker
from inplace_extension.runs.model import NO_CLUSTER_SIDE, RunRequest

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


class StepLog:
    """A cluster side that records the steps it hears started (the rest of ClusterSide: none used)."""

    def __init__(self) -> None:
        self.started: list[str] = []

    def step_started(self, request: RunRequest, capability: str) -> None:
        self.started.append(capability)


def test_the_joint_execution_starts_both_steps_in_order() -> None:
    """update_machine.yml's one module execution of kubeadm_files and kubelet_args is in no role: the
    cluster side hears both steps start with it, kubelet_args (which restarts the kubelet) last, so its
    skip-remediation holds while the execution runs; the phase is kubelet_args."""
    caps = ("kubeadm_files", "kubelet_args", "kubernetes_version")
    request = RunRequest("ns", "m1", FP, caps, {cap: {} for cap in caps})
    phases: list[str] = []
    cluster = StepLog()
    tracker = StepTracker([request], lambda ident, phase: phases.append(phase), cluster)  # type: ignore[arg-type]
    tracker.on_task(request.ident, None, JOINT_TASK)
    tracker.on_task(request.ident, "kubernetes_version", "Read the installed kubelet version")
    assert cluster.started == ["kubeadm_files", "kubelet_args", "kubernetes_version"]
    assert phases == ["kubeadm_files", "kubelet_args", "kubernetes_version"]
    # the play's task carries the name the tracker knows
    play = (Path(__file__).resolve().parents[2] / "playbooks" / "update_machine.yml").read_text()
    assert f"- name: {JOINT_TASK}\n" in play
