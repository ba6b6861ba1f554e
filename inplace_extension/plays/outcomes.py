"""What attempts ended as: one host's attempt classified from its batch's ansible-runner artifacts (the
runner's status and rc, this host's job events, the failed task's label, whether the host's stamp
confirms the fingerprint: the ``inplace_host_state`` module's answer, and the steps it skipped as
unchanged), and an ident's attempts loaded with their outcomes. Plain file reading only.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from inplace_extension.plays.artifacts import BatchRef, attempt_dirs, mtime, read_json, runner_status
from inplace_extension.plays.steps import DRAIN_TASK, JOINT_TASK
from inplace_extension.runs.attempts import Attempt, Outcome, OutcomeKind

# ansible-playbook exit codes for "could not even start": error, parser error, bad options, unexpected error
PLAYBOOK_ERROR_RCS = frozenset({1, 4, 5, 250})
HOST_STATE_MODULE = "inplace_host_state"  # playbooks/library: the host lock and stamp
HEALTH_MODULE = "inplace_health_commands"  # playbooks/library: the health gate's command checks
JOINT_MODULE = "inplace_joint_steps"  # playbooks/library: several built-in steps in one execution
# what that module's failure may say; anything else (a bug, an Ansible error) gets the generic message
HEALTH_FAILURE_RE = re.compile(
    r"^health gate: check [a-z][a-z0-9_]{0,62}: "
    r"(exit status \d{1,3}|killed by signal \d{1,2}|timed out|cannot start \([A-Za-z]{1,40}\))$"
)


def _events(batch: BatchRef) -> list[dict[str, Any]]:
    """This host's events of the batch (plus the host-less play events), in order."""
    events = []
    for path in (batch.dir / "artifacts" / batch.ident / "job_events").glob("*.json"):
        event = read_json(path)
        if event is None:
            continue
        host = (event.get("event_data") or {}).get("host")
        if host is None or host == batch.host:
            events.append(event)
    events.sort(key=lambda e: int(e.get("counter", 0)))
    return events


def _rc(batch_dir: Path, ident: str) -> int | None:
    try:
        return int((batch_dir / "artifacts" / ident / "rc").read_text(encoding="utf-8").strip())
    except (OSError, ValueError):
        return None


def task_label(name: str) -> str:
    """A task name fit for a CAPI message. ansible-core renders task names in its events, so the roles
    template only checked values into names (tests/playbooks/test_task_names.py); a part Ansible left
    unrendered is cut off."""
    head = name.split("{{", 1)[0].strip().rstrip(":").strip()
    return (head or "unnamed task")[:120]


def _ran_module(data: dict[str, Any], module: str) -> bool:
    """The event is of a task that ran ``module`` (one of playbooks/library's)."""
    action = str(data.get("resolved_action") or data.get("task_action") or "")
    return action.rsplit(".", 1)[-1] == module


def failed_step(data: dict[str, Any]) -> str:
    """The step a failed task belongs to: its role's, or for the joint execution of several built-in
    steps the one its answer names (``step``); else the play's own (``update_machine``)."""
    step = (data.get("res") or {}).get("step") if _ran_module(data, JOINT_MODULE) else None
    return str(data.get("role") or step or "update_machine")


def health_failure(data: dict[str, Any]) -> str | None:
    """The stable Failure message of a failed command check (``health gate: check app: exit status 1``)."""
    message = str((data.get("res") or {}).get("msg") or "")
    if _ran_module(data, HEALTH_MODULE) and HEALTH_FAILURE_RE.match(message):
        return message
    return None


def _host_state_answers(data: dict[str, Any]) -> list[dict[str, Any]]:
    """What an event says of the host lock and stamp: the ``inplace_host_state`` module's answer, and
    those of a role's module: ``host_lock``, the lock it took before the first step's work, and
    ``host_stamp``, the stamp it wrote after the last step's work."""
    res = data.get("res") or {}
    answers = [res] if _ran_module(data, HOST_STATE_MODULE) else []
    for rider in (res.get("host_lock"), res.get("host_stamp")):
        if isinstance(rider, dict):
            answers.append(rider)
    return answers


def _lock_not_had(data: dict[str, Any]) -> bool:
    """A failed event of a role's module that could not take the host lock (``host_lock`` says it is
    not held: the wait timed out)."""
    rider = (data.get("res") or {}).get("host_lock")
    return isinstance(rider, dict) and rider.get("locked") is False and not rider.get("up_to_date")


def stamp_confirmed(events: Sequence[dict[str, Any]], fingerprint: str) -> bool:
    """True when the host's events show its stamp holding ``fingerprint``.

    playbooks/update_machine.yml reports it through the ``inplace_host_state`` code: ``state=locked``
    returns ``up_to_date`` with ``applied_fingerprint`` when the host already had it (the run ends
    early), ``state=stamped`` (the stamp task, or the last step's module: ``host_stamp``) returns the
    ``fingerprint`` it wrote.
    """
    for event in events:
        data = event.get("event_data") or {}
        if event.get("event") != "runner_on_ok":
            continue
        for res in _host_state_answers(data):
            if res.get("up_to_date") is True and res.get("applied_fingerprint") == fingerprint:
                return True
            if res.get("changed") is True and res.get("fingerprint") == fingerprint:
                return True
    return False


def skipped_steps(events: Sequence[dict[str, Any]]) -> tuple[str, ...]:
    """The steps the play skipped because the host's stamp showed them applied with the same inputs:
    ``unchanged`` in the answer of the ``inplace_host_state`` module's lock task, or of the first step's
    module that took the lock (all of them when the host already had the whole update)."""
    for event in events:
        data = event.get("event_data") or {}
        if event.get("event") != "runner_on_ok":
            continue
        for res in _host_state_answers(data):
            unchanged = res.get("unchanged")
            if isinstance(unchanged, list):
                return tuple(str(step) for step in unchanged)
    return ()


def classify(batch: BatchRef, fingerprint: str, finished: float | None = None) -> Outcome:
    """What one host's attempt ended as, from its batch's ansible-runner artifacts (finished or dead)."""
    status = runner_status(batch.dir, batch.ident)
    rc = _rc(batch.dir, batch.ident)
    when = finished if finished is not None else mtime(batch.dir / "artifacts" / batch.ident)
    detail = f"status={status or 'none'} rc={rc}"
    if status is None:
        return Outcome(
            OutcomeKind.INTERRUPTED, detail=detail + " (no final status: run killed)", finished=when
        )
    events = _events(batch)
    # the stamp is the update's last step: whatever fails after it (the lock release) changed nothing
    if stamp_confirmed(events, fingerprint):
        return Outcome(OutcomeKind.SUCCESSFUL, detail=detail, finished=when, skipped=skipped_steps(events))
    if status == "successful":
        return Outcome(
            OutcomeKind.INTERRUPTED, detail=detail + " (no stamp with this fingerprint)", finished=when
        )
    failed = [
        e
        for e in events
        if e.get("event") == "runner_on_failed" and not (e.get("event_data") or {}).get("ignore_errors")
    ]
    if any(e.get("event") == "runner_on_unreachable" for e in events):
        return Outcome(OutcomeKind.UNREACHABLE, detail=detail, finished=when)
    if failed:
        data = failed[0].get("event_data") or {}
        if (
            _ran_module(data, HOST_STATE_MODULE)
            or _lock_not_had(data)
            or (data.get("res") or {}).get("lost_lock") is True
        ):
            # waiting for the host lock timed out (in the lock task or the first step's module), or a
            # stale-lock takeover took it from us (also found by the last step's module when it came to
            # write the stamp): another run owns the host right now, which is not a failure of this update
            return Outcome(OutcomeKind.HOST_BUSY, detail=detail, finished=when)
        return Outcome(
            OutcomeKind.TASK_FAILED,
            capability=failed_step(data),
            task=task_label(str(data.get("task") or "")),
            detail=detail,
            finished=when,
            message=health_failure(data),
        )
    if (
        status == "failed"
        and rc in PLAYBOOK_ERROR_RCS
        and not any(e.get("event") == "playbook_on_play_start" for e in events)
    ):
        # ansible-playbook refused to start the play (parse error, bad option): retrying cannot help
        return Outcome(
            OutcomeKind.TASK_FAILED,
            capability="update_machine",
            task=f"load playbook (rc {rc})",
            detail=detail,
            finished=when,
        )
    # failed without a failed task of this host: ansible-playbook killed, or another host's failure
    # ended the play for all (update_machine.yml has any_errors_fatal)
    return Outcome(OutcomeKind.INTERRUPTED, detail=detail + " (no failed task)", finished=when)


def past_drain_point(meta: dict[str, Any]) -> bool:
    """Whether the play of an attempt without an outcome may have disrupted its machine, by the events
    the play itself wrote (they are on disk whether or not the service that started it lived on):
    it reached its drain point (``drain_before`` in meta.json: the service drains the Node there), or,
    with no drain point, it began a step. An attempt whose play has no events did nothing, unless it
    resumed one that had passed its own (``resumes``): the machine is as disrupted as that one left it."""
    if meta.get("resumes") is True:
        return True
    batch = BatchRef.from_meta(meta)
    if batch is None:
        return False  # its service died before the play was started
    started = [
        e.get("event_data") or {}
        for e in _events(batch)
        if e.get("event") == "runner_on_start" and (e.get("event_data") or {}).get("host") == batch.host
    ]
    if "drain_before" in meta and meta["drain_before"] is not None:
        return any(data.get("task") == DRAIN_TASK for data in started)
    # no drain point (or not recorded: an attempt of an older version): any step may change the host
    return any(data.get("role") or data.get("task") in (DRAIN_TASK, JOINT_TASK) for data in started)


def current_task(batch: BatchRef) -> tuple[str, str] | None:
    """The task this host's play began last, as ``(role, task)`` (role "" for a task of the play's own),
    by its events so far (ansible-runner writes them as the play goes); None before its first task."""
    for event in reversed(_events(batch)):
        data = event.get("event_data") or {}
        if event.get("event") == "runner_on_start" and data.get("host") == batch.host:
            return str(data.get("role") or ""), str(data.get("task") or "")
    return None


def _started(meta: dict[str, Any], path: Path) -> float:
    """When the attempt started: meta.json's ``started``, else when its directory was made."""
    started = meta.get("started")
    return float(started) if isinstance(started, int | float) else mtime(path)


def load_attempts(ident_dir: Path, fingerprint: str, episode: str | None) -> list[Attempt]:
    """The attempts of one ident in ``episode`` (local/episode.py; None: of every episode), oldest first.
    Attempts without ``outcome.json`` are classified from their batch's ansible-runner artifacts when
    those are final, else left with ``outcome=None``."""
    attempts = []
    for number, path in sorted(attempt_dirs(ident_dir)):
        meta = read_json(path / "meta.json") or {}
        began_in = str(meta.get("episode", ""))
        if episode is not None and began_in != episode:
            continue  # an earlier episode of this desired state: kept on disk, answers nothing
        summary = read_json(path / "outcome.json")
        outcome = Outcome.from_json(summary) if summary else None
        batch = BatchRef.from_meta(meta)
        if outcome is None and batch is not None and runner_status(batch.dir, batch.ident) is not None:
            outcome = classify(batch, fingerprint)
        address = meta.get("address")
        attempts.append(
            Attempt(
                number,
                path,
                str(meta.get("retry_token", "")),
                outcome,
                address if isinstance(address, str) else None,
                _started(meta, path),
                began_in,
                past_drain_point=outcome is not None or past_drain_point(meta),
            )
        )
    return attempts
