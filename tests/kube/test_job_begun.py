"""Whether a Job's play has begun (kube/jobs.py ``not_begun``): what a withdrawal may take back is only a
Job none of whose Pods started. A started Pod deleted mid-play is gone from the Pod list before the Job
is marked failed; the Job's count of terminated Pods says it began."""

from __future__ import annotations

from typing import Any

from inplace_extension.kube.jobs import not_begun


def pod(phase: str | None) -> dict[str, Any]:
    return {"metadata": {"name": "p"}, "status": {} if phase is None else {"phase": phase}}


def test_a_job_whose_only_pod_is_pending_has_not_begun() -> None:
    assert not_begun({"status": {"active": 1}}, [pod("Pending")])
    assert not_begun({}, [pod(None)])
    assert not_begun({"status": {}}, []), "no Pod yet, nothing terminated: not begun"


def test_a_pod_out_of_pending_has_begun() -> None:
    for phase in ("Running", "Succeeded", "Failed", "Unknown"):
        assert not not_begun({"status": {"active": 1}}, [pod(phase)]), phase


def test_a_started_pod_deleted_mid_play_has_begun_while_the_job_controller_counts_it() -> None:
    # the Pod is gone; the controller has put its uid among the uncounted, then counts it as failed
    uncounted = {"status": {"active": 0, "uncountedTerminatedPods": {"failed": ["uid-1"]}}}
    assert not not_begun(uncounted, [])
    assert not not_begun({"status": {"failed": 1}}, [])
    assert not not_begun({"status": {"succeeded": 1}}, [])
    assert not not_begun({"status": {"uncountedTerminatedPods": {"succeeded": ["uid-1"]}}}, [])
