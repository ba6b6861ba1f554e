"""What the agent reads from a Node and what it writes back (pure)."""

from __future__ import annotations

from typing import Any

from inplace_extension.mcm import node_state as ns


def node(reason: str | None = None, labels: dict[str, str] | None = None, **extra: Any) -> dict[str, Any]:
    conditions = [{"type": "Ready", "status": "True"}]
    if reason:
        conditions.append({"type": "InPlaceUpdate", "status": "True", "reason": reason})
    return {
        "metadata": {
            "name": "n",
            "resourceVersion": "7",
            "labels": labels or {},
            **extra.get("metadata", {}),
        },
        "spec": extra.get("spec", {}),
        "status": {"conditions": conditions},
    }


CANDIDATE = {ns.CANDIDATE_LABEL: "true"}


def test_wants_update_only_when_mcm_is_waiting() -> None:
    assert ns.wants_update(node("ReadyForUpdate", CANDIDATE))
    assert ns.wants_update(node("UpdateFailed", CANDIDATE))
    assert not ns.wants_update(node("SelectedForUpdate", CANDIDATE))
    assert not ns.wants_update(node("UpdateSuccessful", CANDIDATE))
    assert not ns.wants_update(node("ReadyForUpdate", {}))
    assert not ns.wants_update(node(None, CANDIDATE))


def test_taint_removal_waits_for_mcm_to_finish_and_ready() -> None:
    taint = {"spec": {"taints": [{"key": ns.CRITICAL_TAINT[0], "effect": "NoSchedule"}]}}
    assert ns.wants_taint_removal(node("UpdateSuccessful", {}, **taint))
    assert not ns.wants_taint_removal(node("UpdateSuccessful", CANDIDATE, **taint))
    assert not ns.wants_taint_removal(node("UpdateSuccessful", {}))
    not_ready = node("UpdateSuccessful", {}, **taint)
    not_ready["status"]["conditions"][0]["status"] = "False"
    assert not ns.wants_taint_removal(not_ready)


def test_claims() -> None:
    free = node("ReadyForUpdate", CANDIDATE)
    assert ns.claimable(free, "me")
    mine = node(metadata={"annotations": {ns.CLAIM_ANNOTATION: ns.claim_value("me", 60, now=1000)}})
    assert ns.claimable(mine, "me", now=1001)
    assert not ns.claimable(mine, "other", now=1001)
    assert ns.claimable(mine, "other", now=1061), "an expired claim (dead replica) is taken over"
    garbage = node(metadata={"annotations": {ns.CLAIM_ANNOTATION: "x notanumber"}})
    assert ns.claimable(garbage, "other")


def test_results() -> None:
    labels, annotations = ns.result_metadata(True)
    assert labels == {ns.RESULT_LABEL: "successful"}
    assert annotations == {ns.FAILED_REASON_ANNOTATION: None, ns.CLAIM_ANNOTATION: None}
    labels, annotations = ns.result_metadata(False, "x" * 5000, release=False)
    assert labels == {ns.RESULT_LABEL: "failed"}
    assert annotations == {ns.FAILED_REASON_ANNOTATION: "x" * ns.MAX_REASON_LEN}
    done = node(labels={ns.RESULT_LABEL: "successful"})
    assert ns.result_written(done, True)
    assert not ns.result_written(done, False, "boom")


def test_answered_names_the_desired_state_while_the_result_label_is_there() -> None:
    labels, annotations = ns.result_metadata(False, "boom", answered_key="fp|")
    assert annotations[ns.ANSWERED_ANNOTATION] == ns.answer_digest("fp|") != ns.answer_digest("fp|retry-1")
    answered = node(labels=labels, metadata={"annotations": {k: v for k, v in annotations.items() if v}})
    assert ns.answered(answered, "fp|")
    assert not ns.answered(answered, "fp|retry-1"), "a new retry token is a new request"
    assert not ns.answered(answered, "other-fp|"), "a new desired state"
    consumed = node(metadata={"annotations": {ns.ANSWERED_ANNOTATION: ns.answer_digest("fp|")}})
    assert not ns.answered(consumed, "fp|"), "MCM removed the result label: the next rollout is new"
    assert ns.result_written(answered, False, "boom", answered_key="fp|")
    assert not ns.result_written(answered, False, "boom", answered_key="other-fp|")
