"""A rollout as the management cluster records it: per Machine of the owner, CAPI's own conditions
(``Updating``: its in-place update is under way; ``UpToDate``: it has its owner's spec), the ``kubernetes``
executor's record annotation (kubejobs/record.py: attempts, hosts, outcomes, judged by the service's own
state machine, runs/policy.py) and the Events the service posts on the Machine in its Kubernetes-aware
mode (the states before an attempt: waiting for a window, paused, queued; the step running).

Only what belongs to the Machine's current update counts: Events and attempts from the time CAPI set
``Updating`` (an earlier rollout's ``Done`` says nothing of this one). Pure: the objects come as read
(:mod:`inplace_extension.kube.rollout`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from inplace_extension.kube.events import COMPONENT
from inplace_extension.kube.rollout import Owner, Snapshot
from inplace_extension.kubejobs.record import RECORD_ANNOTATION, Record
from inplace_extension.rollout.model import MachineStatus, Rollout, State
from inplace_extension.rollout.standing import begun, ended_status
from inplace_extension.runs import progress
from inplace_extension.runs.attempts import Attempt, OutcomeKind
from inplace_extension.runs.policy import BLOCKED_MESSAGE, Verdict, decide

UPDATING: Final = "Updating"  # CAPI's Machine condition: an in-place update is under way
UP_TO_DATE: Final = "UpToDate"  # CAPI's Machine condition: the Machine has its owner's spec
UPDATE_FAILED: Final = "InPlaceUpdateFailed"  # the Updating condition's reason when UpdateMachine failed
UPDATE_IN_PROGRESS: Final = "in-place-updates.internal.cluster.x-k8s.io/update-in-progress"
# the Event and the condition are written by two processes' clocks (the service's, the controller's)
CLOCK_SKEW_SECONDS: Final = 2.0
# the state each reason of the service's Machine Events says (docs/operations.md lists them)
REASONS: Final = {
    "Waiting": State.WAITING,  # or paused: by its message
    "Queued": State.QUEUED,
    "Started": State.RUNNING,
    "Running": State.RUNNING,
    "Drained": State.RUNNING,
    "Uncordoned": State.RUNNING,
    "DrainFailed": State.RETRYING,
    "JobNotStarted": State.RETRYING,
    "Done": State.DONE,
    "Failed": State.FAILED,  # or blocked: by its message
    "Cancelled": State.FAILED,
}
PAUSED_PREFIX: Final = progress.MESSAGES["paused"].split("{", 1)[0]
RUNNING_PREFIX: Final = progress.MESSAGES["running"].split("{", 1)[0]
BLOCKED_PREFIX: Final = BLOCKED_MESSAGE.split("{", 1)[0]
NOT_BEGUN = "not updated yet: CAPI has not begun its update (UpToDate: {reason})"
UNDER_WAY = "in-place update under way (CAPI: {message})"


@dataclass(frozen=True)
class Seen:
    """One of the service's Events about a Machine."""

    reason: str
    message: str
    time: float
    order: int  # among Events of the same second: the API server's order of creation


def read_cluster(owner: Owner, snapshot: Snapshot, now: float, retry_after: int, budget: int) -> Rollout:
    """``retry_after`` and ``budget``: the service's ``--retry-after-seconds`` and
    ``--max-failed-attempts`` (they tell retrying from blocked in the record)."""
    events: dict[str, list[Seen]] = {}
    for event in snapshot.events:
        seen = _seen(event)
        if seen is not None:
            events.setdefault(str((event.get("involvedObject") or {}).get("name", "")), []).append(seen)
    machines = sorted(snapshot.machines, key=lambda m: str((m.get("metadata") or {}).get("name", "")))
    return Rollout(
        str(owner),
        tuple(
            machine_status(
                m, events.get(str((m.get("metadata") or {}).get("name", "")), []), now, retry_after, budget
            )
            for m in machines
        ),
    )


def machine_status(
    machine: dict[str, Any], events: Sequence[Seen], now: float, retry_after: int, budget: int
) -> MachineStatus:
    metadata = machine.get("metadata") or {}
    namespace, name = str(metadata.get("namespace", "")), str(metadata.get("name", ""))
    conditions = {str(c.get("type")): c for c in (machine.get("status") or {}).get("conditions") or []}
    updating = conditions.get(UPDATING) or {}
    under_way = updating.get("status") == "True" or UPDATE_IN_PROGRESS in (metadata.get("annotations") or {})
    began = _time(updating.get("lastTransitionTime")) if under_way else None
    current = [e for e in events if began is None or e.time >= began - CLOCK_SKEW_SECONDS]
    last = max(current, key=lambda e: (e.time, e.order), default=None)
    attempts = [a for a in _attempts(metadata) if began is None or a.started >= began - CLOCK_SKEW_SECONDS]
    if not under_way:
        up_to_date = conditions.get(UP_TO_DATE) or {}
        if up_to_date.get("status") == "False":
            reason = str(up_to_date.get("message") or up_to_date.get("reason") or "not up to date")
            return MachineStatus(namespace, name, State.PENDING, NOT_BEGUN.format(reason=reason))
        done = last if last is not None and last.reason == "Done" else None
        applied = _applied(attempts)
        return MachineStatus(
            namespace,
            name,
            State.DONE,
            done.message if done is not None else "up to date",
            attempt=applied.number if applied is not None else None,
            host=applied.address if applied is not None else None,
            since=done.time
            if done is not None
            else _time((conditions.get(UP_TO_DATE) or {}).get("lastTransitionTime")),
        )
    from_record = _from_record(namespace, name, attempts, last, now, retry_after, budget)
    if from_record is not None:
        return from_record
    if last is None:
        message = UNDER_WAY.format(message=updating.get("message") or updating.get("reason") or "Updating")
        state = State.FAILED if updating.get("reason") == UPDATE_FAILED else State.RUNNING
        return MachineStatus(namespace, name, state, message, since=began)
    state, step = _event_state(last)
    return MachineStatus(namespace, name, state, last.message, step, since=last.time)


def _from_record(
    namespace: str,
    name: str,
    attempts: list[Attempt],
    last: Seen | None,
    now: float,
    retry_after: int,
    budget: int,
) -> MachineStatus | None:
    """The state by the ``kubernetes`` executor's record of this update; None without one, or when no
    attempt is under way or ended in a way the record decides (the Events say what comes before)."""
    ran = begun(attempts)
    if not ran:
        return None
    final = ran[-1]
    standing = decide(ran, final.retry_token, now, retry_after, budget)
    ended = final.outcome.finished if final.outcome is not None else None
    if standing.verdict is Verdict.DONE:
        applied = _applied(ran)
        if last is not None and last.reason != "Done" and applied is not None and not applied.gate_passed:
            # applied on the host; the service's health gate has the last word (its Events say on what)
            message = last.message if last.message.startswith("health") else "update applied; health gate"
            return MachineStatus(
                namespace,
                name,
                State.RUNNING,
                message,
                "health gate",
                since=ended,
                attempt=final.number,
                host=final.address,
            )
        finished = applied.outcome.finished if applied is not None and applied.outcome is not None else None
        return MachineStatus(
            namespace,
            name,
            State.DONE,
            progress.APPLIED,
            since=finished,
            attempt=final.number,
            host=final.address,
        )
    settled = ended_status(namespace, name, standing, final)
    if settled is not None:
        return settled
    if final.outcome is None:  # its Job plays it
        step = None
        message = progress.running(progress.STARTING)
        if last is not None and last.time >= final.started - CLOCK_SKEW_SECONDS:
            _, step = _event_state(last)  # its Job plays: running, in the step its Events name
            message = last.message
        return MachineStatus(
            namespace,
            name,
            State.RUNNING,
            message,
            step,
            since=final.started,
            attempt=final.number,
            host=final.address,
        )
    return None


def _event_state(event: Seen) -> tuple[State, str | None]:
    """The state (and the running step) an Event of the service says."""
    state = REASONS.get(event.reason, State.UNKNOWN)
    if state is State.WAITING and event.message.startswith(PAUSED_PREFIX):
        return State.PAUSED, None
    if state is State.FAILED and event.message.startswith(BLOCKED_PREFIX):
        return State.BLOCKED, None
    if event.reason == "Running" and event.message.startswith(RUNNING_PREFIX):
        return State.RUNNING, event.message.removeprefix(RUNNING_PREFIX)
    return state, None


def _attempts(metadata: dict[str, Any]) -> list[Attempt]:
    """The attempts the ``kubernetes`` executor's record on the Machine holds (none without one)."""
    value = (metadata.get("annotations") or {}).get(RECORD_ANNOTATION)
    try:
        ident = json.loads(value).get("ident") if value else None
    except (ValueError, AttributeError):
        ident = None
    if not isinstance(ident, str):
        return []
    return Record.decode(value, ident).to_attempts()


def _applied(attempts: Sequence[Attempt]) -> Attempt | None:
    return next(
        (a for a in reversed(attempts) if a.outcome is not None and a.outcome.kind is OutcomeKind.SUCCESSFUL),
        None,
    )


def _seen(event: dict[str, Any]) -> Seen | None:
    """One of the service's Events about a Machine, or None for another component's."""
    source = (event.get("source") or {}).get("component") or event.get("reportingComponent")
    if source != COMPONENT or (event.get("involvedObject") or {}).get("kind") != "Machine":
        return None
    metadata = event.get("metadata") or {}
    when = _time(event.get("lastTimestamp") or event.get("eventTime") or metadata.get("creationTimestamp"))
    version = str(metadata.get("resourceVersion") or "0")
    return Seen(
        str(event.get("reason", "")),
        str(event.get("message", "")),
        when or 0.0,
        # Events are only created (never updated: kube/events.py), so a later resourceVersion is a later
        # Event; it breaks ties between Events of the same second only
        int(version) if version.isdigit() else 0,
    )


def _time(value: object) -> float | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None
