"""What a Node says to the MCM agent, and the metadata the agent writes back (pure; no I/O).

MCM's keys (docs/mcm-contract.md, "Keys and values"): MCM sets the ``InPlaceUpdate`` condition, the
candidate/selected labels, cordon, drain and its taints; the node-side updater writes only the
``update-result`` label and the ``update-failed-reason`` annotation. Ours: the claim annotation (single-acting
replicas), the answered annotation (which desired state a final answer was for, so that no replica, nor a
restarted agent, acts on it again) and the retry annotation a user sets to retry a failed task (shared with
the CAPI side).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

CONDITION: Final = "InPlaceUpdate"
READY_FOR_UPDATE: Final = "ReadyForUpdate"
UPDATE_FAILED: Final = "UpdateFailed"
CANDIDATE_LABEL: Final = "node.machine.sapcloud.io/candidate-for-update"
RESULT_LABEL: Final = "node.machine.sapcloud.io/update-result"
SUCCESSFUL: Final = "successful"
FAILED: Final = "failed"
FAILED_REASON_ANNOTATION: Final = "node.machine.sapcloud.io/update-failed-reason"
CRITICAL_TAINT: Final = ("node.gardener.cloud/critical-components-not-ready", "NoSchedule")
CLAIM_ANNOTATION: Final = "inplace-extension.io/mcm-agent-claim"
ANSWERED_ANNOTATION: Final = "inplace-extension.io/mcm-agent-answered"
MAX_REASON_LEN: Final = 1024  # MCM copies the reason into a condition message and the Machine status


def name(node: Mapping[str, Any]) -> str:
    return str(node.get("metadata", {}).get("name", ""))


def node_labels(node: Mapping[str, Any]) -> dict[str, str]:
    return dict(node.get("metadata", {}).get("labels") or {})


def node_annotations(node: Mapping[str, Any]) -> dict[str, str]:
    return dict(node.get("metadata", {}).get("annotations") or {})


def node_addresses(node: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    """The Node's ``status.addresses`` as (type, address), in the kubelet's order: where the host is when
    neither the address annotation nor the inventory says (the CAPI side reads the Machine's)."""
    found = node.get("status", {}).get("addresses") or []
    return tuple((str(a.get("type", "")), str(a.get("address", ""))) for a in found if isinstance(a, Mapping))


def resource_version(node: Mapping[str, Any]) -> str:
    return str(node.get("metadata", {}).get("resourceVersion", ""))


def condition(node: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    for cond in node.get("status", {}).get("conditions") or []:
        if cond.get("type") == kind:
            return dict(cond)
    return None


def in_place_reason(node: Mapping[str, Any]) -> str | None:
    cond = condition(node, CONDITION)
    return str(cond.get("reason")) if cond and cond.get("status") == "True" else None


def wants_update(node: Mapping[str, Any]) -> bool:
    """MCM drained the Node and waits for us (ReadyForUpdate), or our last answer was ``failed``
    (UpdateFailed: retriable failures retry, a retry annotation restarts a failed task)."""
    return CANDIDATE_LABEL in node_labels(node) and in_place_reason(node) in (READY_FOR_UPDATE, UPDATE_FAILED)


def is_ready(node: Mapping[str, Any]) -> bool:
    cond = condition(node, "Ready")
    return cond is not None and cond.get("status") == "True"


def has_critical_taint(node: Mapping[str, Any]) -> bool:
    key, effect = CRITICAL_TAINT
    taints = node.get("spec", {}).get("taints") or []
    return any(t.get("key") == key and t.get("effect") == effect for t in taints)


def wants_taint_removal(node: Mapping[str, Any]) -> bool:
    """MCM finished the Node (its candidate label is gone) and added the critical-components taint;
    outside Gardener nothing else removes it, and a leftover one breaks MCM's next rollout."""
    return has_critical_taint(node) and CANDIDATE_LABEL not in node_labels(node) and is_ready(node)


# -- our writes ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Claim:
    holder: str
    expires: float


def claim_of(node: Mapping[str, Any]) -> Claim | None:
    value = node_annotations(node).get(CLAIM_ANNOTATION, "")
    holder, _, expires = value.partition(" ")
    try:
        return Claim(holder, float(expires)) if holder else None
    except ValueError:
        return None


def claimable(node: Mapping[str, Any], agent_id: str, now: float | None = None) -> bool:
    """Free, ours, or expired (its holder died): another live replica's claim is respected."""
    claim = claim_of(node)
    return claim is None or claim.holder == agent_id or claim.expires <= (now or time.time())


def claim_value(agent_id: str, seconds: float, now: float | None = None) -> str:
    return f"{agent_id} {int((now or time.time()) + seconds)}"


def leftovers(node: Mapping[str, Any]) -> tuple[str, ...]:
    """Our annotations left on a Node MCM is done with (no candidate label, no result label): the answered
    annotation only means something while the result label is there, and a claim only while MCM waits
    for an update (a dead replica's may stay). None of ours stays behind a finished rollout."""
    labels = node_labels(node)
    if CANDIDATE_LABEL in labels or RESULT_LABEL in labels:
        return ()
    annotations = node_annotations(node)
    return tuple(key for key in (CLAIM_ANNOTATION, ANSWERED_ANNOTATION) if key in annotations)


def answer_digest(key: str) -> str:
    """What the answered annotation says for a desired state (``<fingerprint or error>|<retry token>``):
    short and opaque, an error message stays in ``update-failed-reason``."""
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def answered(node: Mapping[str, Any], key: str) -> bool:
    """A final answer for this desired state is on the Node, by any replica. MCM removes the result
    label when it is done with the Node: the next rollout, even to the same desired state, is new."""
    return RESULT_LABEL in node_labels(node) and node_annotations(node).get(ANSWERED_ANNOTATION) == (
        answer_digest(key)
    )


def result_metadata(
    successful: bool, reason: str = "", release: bool = True, answered_key: str | None = None
) -> tuple[dict[str, str], dict[str, str | None]]:
    """(labels, annotations) of a result; ``None`` removes a key. ``release``: also drop our claim
    (a final answer; a retriable failure keeps it while we retry). ``answered_key``: the desired state a
    final answer is for (the answered annotation)."""
    notes: dict[str, str | None] = {CLAIM_ANNOTATION: None} if release else {}
    if answered_key is not None:
        notes[ANSWERED_ANNOTATION] = answer_digest(answered_key)
    if successful:
        return {RESULT_LABEL: SUCCESSFUL}, {FAILED_REASON_ANNOTATION: None, **notes}
    return {RESULT_LABEL: FAILED}, {FAILED_REASON_ANNOTATION: reason[:MAX_REASON_LEN], **notes}


def result_written(
    node: Mapping[str, Any],
    successful: bool,
    reason: str = "",
    release: bool = True,
    answered_key: str | None = None,
) -> bool:
    """The Node already says this result (no patch needed)."""
    want_labels, want_annotations = result_metadata(successful, reason, release, answered_key)
    have_labels, have_annotations = node_labels(node), node_annotations(node)
    return all(have_labels.get(k) == v for k, v in want_labels.items()) and all(
        have_annotations.get(k) == v for k, v in want_annotations.items()
    )
