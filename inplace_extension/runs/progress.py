"""The messages UpdateMachine answers (and the MCM agent writes) while an update is queued, running,
retrying, held or applied, and when an operator cancels it.

One table (:data:`MESSAGES`) holds every such message the engine produces; the functions below fill it
in, and :func:`pattern` turns the same table into a regular expression, so a test that checks the
messages a poll may see cannot miss one that is added here. Other failure messages are not progress:
they come from the play's outcome (outcomes.py) or the cluster steps and are checked where they are made.
"""

from __future__ import annotations

import re
import string
from collections.abc import Iterable

from inplace_extension.runs.attempts import OutcomeKind

# the steps of a run besides its capabilities: before the first capability's task and after the last
STARTING = "starting"
FINISHING = "finishing"
# why a run is retried later, by the outcome of its last attempt
RETRY_REASONS = {
    OutcomeKind.UNREACHABLE: "host unreachable",
    OutcomeKind.HOST_BUSY: "host locked by another run",
}
RETRY_REASON_OTHER = "run interrupted"

# name -> template; a field in braces is filled in by the function of the same name below
MESSAGES = {
    "queued": "queued: position {position} of {queued}",
    "running": "running: {step}",
    "health_commands": "health gate: running the command checks on the host",
    "retrying": "{reason}, retrying (attempt {attempt})",
    "draining": "draining: {pods} left",
    "health_waiting": "health gate: {waiting}",
    "applied": "update applied",
    "window": 'waiting for maintenance window "{window}" (opens {opens})',
    "paused": "paused by {owner} (annotation {annotation})",
    "pause_unreadable": "pause: cannot read {owner} ({problem})",
    "record_unreadable": "record: cannot read {where} ({problem})",
    "api_unavailable": "cluster API unavailable: {problem}",
    "job_not_starting": "Job {job}: {problem}",
    "cancelled": "cancelled by {owner} (annotation {annotation}={value})",
    "health_check": 'waiting for health check "{check}" ({detail})',
    "health_check_failed": (
        'health gate: health check "{check}" did not hold within {seconds}s after the update '
        "({expression} on {target})"
    ),
    "health_check_timed_out": (
        'health check "{check}" did not hold within {timeout} before the update ({expression} on {target})'
    ),
}

# only the Kubernetes-aware mode's cluster steps (and the kubernetes health checks) answer these
CLUSTER_STEPS = frozenset(
    {
        "draining",
        "health_waiting",
        "pause_unreadable",
        "record_unreadable",
        "api_unavailable",
        "job_not_starting",
        "health_check",
    }
)
# answered as a Failure (the MCM agent: a failed result), never while an update goes on
FAILURES = frozenset({"cancelled", "health_check_failed", "health_check_timed_out"})

HEALTH_COMMANDS = MESSAGES["health_commands"]
APPLIED = MESSAGES["applied"]


def queued(position: int, waiting: int) -> str:
    return MESSAGES["queued"].format(position=position, queued=waiting)


def running(step: str) -> str:
    """``step`` is :data:`STARTING`, a capability or :data:`FINISHING`; a phase that is a message of
    its own (the health gate's, the drain's) is answered as it is."""
    if ": " in step:
        return step
    return MESSAGES["running"].format(step=step)


def api_unavailable(problem: str) -> str:
    """A call to the cluster's API server had no answer, or a 429 or 5xx (``problem`` names the call):
    nothing was decided, the next poll asks again."""
    return MESSAGES["api_unavailable"].format(problem=problem)


def job_not_starting(job: str, problem: str) -> str:
    """The ``kubernetes`` executor's Job ``job`` has a Pod that cannot start (``problem``: why, from the
    Pod's status: ``Pod cannot be scheduled: 0/3 nodes are available: ...``)."""
    return MESSAGES["job_not_starting"].format(job=job, problem=problem)


def record_unreadable(where: str, problem: str) -> str:
    """The ``kubernetes`` executor could not read (or write) the update's record on ``where`` (the API
    server away): nothing starts, the next poll tries again."""
    return MESSAGES["record_unreadable"].format(where=where, problem=problem)


def retrying(last: OutcomeKind, attempt: int) -> str:
    reason = RETRY_REASONS.get(last, RETRY_REASON_OTHER)
    return MESSAGES["retrying"].format(reason=reason, attempt=attempt)


def draining(pods: int) -> str:
    return MESSAGES["draining"].format(pods=f"{pods} pod{'' if pods == 1 else 's'}")


def health_waiting(waiting: str) -> str:
    """The Kubernetes-aware health gate is still waiting: ``waiting`` says on what."""
    return MESSAGES["health_waiting"].format(waiting=waiting)


def window(name: str, opens: str) -> str:
    """Its next attempt not started: outside its maintenance windows; ``opens`` is ``2026-12-01T22:00Z``."""
    return MESSAGES["window"].format(window=name, opens=opens)


def paused(owner: str, annotation: str) -> str:
    """Its next attempt not started: an operator's ``annotation`` on ``owner`` (``MachineDeployment
    default/md-0``)."""
    return MESSAGES["paused"].format(owner=owner, annotation=annotation)


def pause_unreadable(owner: str, problem: str) -> str:
    """Its next attempt not started: whether ``owner`` pauses it cannot be told (the API server did
    not answer)."""
    return MESSAGES["pause_unreadable"].format(owner=owner, problem=problem)


def cancelled(owner: str, annotation: str, value: str) -> str:
    """The Failure of an update an operator cancelled before it started."""
    return MESSAGES["cancelled"].format(owner=owner, annotation=annotation, value=value)


def health_check(check: str, detail: str) -> str:
    """Not started, or applied and in the health gate: the ``kubernetes`` health check ``check`` does
    not hold; ``detail`` says why (``<expression> is false on CephCluster rook-ceph/ceph``)."""
    return MESSAGES["health_check"].format(check=check, detail=detail)


def health_check_failed(check: str, seconds: int, expression: str, target: str) -> str:
    """The Failure of an update whose ``kubernetes`` health check did not hold again in the gate's time."""
    return MESSAGES["health_check_failed"].format(
        check=check, seconds=seconds, expression=expression, target=target
    )


def health_check_timed_out(check: str, seconds: int, expression: str, target: str) -> str:
    """The Failure of an update not started yet whose ``kubernetes`` health check did not hold within
    its ``timeout`` (``seconds``): stable, without the reason that may change from call to call."""
    return MESSAGES["health_check_timed_out"].format(
        check=check, timeout=duration(seconds), expression=expression, target=target
    )


def duration(seconds: int) -> str:
    """``seconds`` as the capabilities file spells a duration: ``2h``, ``1h30m``, ``90s`` -> ``1m30s``."""
    hours, rest = divmod(seconds, 3600)
    minutes, rest = divmod(rest, 60)
    parts = [f"{value}{unit}" for value, unit in ((hours, "h"), (minutes, "m"), (rest, "s")) if value]
    return "".join(parts) or "0s"


def pattern(capabilities: Iterable[str], cluster_steps: bool = False) -> re.Pattern[str]:
    """A regular expression matching exactly the progress messages of a run of ``capabilities`` (with
    ``cluster_steps``, also those of the Kubernetes-aware mode; never the :data:`FAILURES`); use it
    with ``fullmatch``."""
    fields = {
        "position": r"\d+",
        "queued": r"\d+",
        "attempt": r"\d+",
        "pods": r"\d+ pods?",
        "step": "|".join(re.escape(s) for s in (STARTING, *capabilities, FINISHING)),
        "reason": "|".join(re.escape(r) for r in (*RETRY_REASONS.values(), RETRY_REASON_OTHER)),
        "waiting": r".+",
        "window": r"[a-z0-9][-a-z0-9]*",
        "opens": r"\d{4}-\d\d-\d\dT\d\d:\d\dZ",
        "owner": r"(?:Cluster|MachineDeployment|KubeadmControlPlane) [-a-z0-9.]+/[-a-z0-9.]+",
        "annotation": r"[-a-z0-9./]+",
        "problem": r".+",
        "where": r"(?:Machine [-a-z0-9.]+/[-a-z0-9.]+|Node [-a-z0-9.]+)",
        "check": r"[a-z][a-z0-9_]*",
        "detail": r".+",
        "job": r"inplace-[0-9a-f]+(?:-[0-9a-z]+)*",
    }
    alternatives = []
    for name, template in MESSAGES.items():
        if name in FAILURES or (name in CLUSTER_STEPS and not cluster_steps):
            continue
        parts = []
        for literal, field, _, _ in string.Formatter().parse(template):
            parts.append(re.escape(literal))
            if field is not None:
                parts.append(f"(?:{fields[field]})")
        alternatives.append("".join(parts))
    return re.compile("|".join(f"(?:{a})" for a in alternatives))
