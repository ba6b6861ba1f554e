"""The UpdateMachine state machine (docs/operations.md), as a pure function of the attempts found on disk.

Given the attempts of one run ident (oldest first), the retry token of this call and the clock, say
whether the update is done, failed (remembered), waiting out a retry backoff, blocked (its retry
budget spent), or must start now.
No I/O here; :mod:`inplace_extension.runs.service` feeds it and acts on the verdict.
"""

from __future__ import annotations

import enum
import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass

from inplace_extension.runs import progress
from inplace_extension.runs.attempts import RETRIABLE, Attempt, Outcome, OutcomeKind

RETRY_ANNOTATION = "inplace-extension.io/retry"
BACKOFF_CAP_SECONDS = 300
# attempts that spend the retry budget: the host could not be reached, or the run did not end with
# proof. A host locked by another run is no failure of this update (that run ends, or its lock is
# taken over as stale) and a task failure is remembered at once.
BUDGETED = frozenset({OutcomeKind.UNREACHABLE, OutcomeKind.INTERRUPTED})
BLOCKED_MESSAGE = "blocked after {count} failed attempts: {reason}"


class Verdict(enum.Enum):
    DONE = "done"
    FAILED = "failed"
    WAIT = "wait"  # a retriable attempt ended recently: answer in progress until the backoff is over
    START = "start"


@dataclass(frozen=True)
class Standing:
    """Where an update stands by its attempts on disk, and so what this poll does (``verdict``)."""

    verdict: Verdict
    message: str = ""  # FAILED and WAIT: what CAPI shows
    wait_seconds: int = 0  # WAIT: retryAfterSeconds
    next_attempt: int = 1
    blocked: bool = False  # FAILED: the retry budget is spent (not a task failure)
    # START: the last attempt has no outcome (the process running it died mid-play) and its play had
    # passed its drain point (attempts.Attempt.past_drain_point), or (``kubernetes``) its Job died
    # mid-play past it (Outcome.died_past_drain_point): this one resumes what it began, so it finishes
    # like a play in flight; any other START is a new attempt. WAIT: the attempt after the backoff resumes
    # so (nothing holds it back, not even a cancel)
    resumes: bool = False


def retry_token(value: str | None) -> str:
    """What is remembered of the retry annotation: a short hash (the value itself is user data)."""
    if value is None:
        return ""
    return hashlib.sha256(value.encode("utf-8")).hexdigest()[:16]


def backoff_seconds(failures: int, base: int, cap: int = BACKOFF_CAP_SECONDS) -> int:
    """Delay after ``failures`` retriable attempts in a row: base, 2*base, 4*base, ... up to ``cap``."""
    return int(min(cap, base * 2 ** max(0, failures - 1)))


def failure_message(capability: str | None, task: str | None) -> str:
    return f'{capability or "update_machine"}: task "{task or "unnamed task"}" failed on host'


def last_reason(outcome: Outcome) -> str:
    """Why an attempt that spent the budget failed: its own stable message (a drain that could not
    reach the API server) or what the retry message says of its kind."""
    return outcome.message or progress.RETRY_REASONS.get(outcome.kind, progress.RETRY_REASON_OTHER)


def decide(
    attempts: Sequence[Attempt], token: str, now: float, base_backoff: int, budget: int | None = None
) -> Standing:
    """The standing for one poll; a run in flight in this process answers before this is asked.
    ``budget``: how many failed attempts (of :data:`BUDGETED` kinds) with this retry token may end
    before the update is blocked instead of retried (None: retried for ever)."""
    if any(a.outcome is not None and a.outcome.kind is OutcomeKind.SUCCESSFUL for a in attempts):
        return Standing(Verdict.DONE)
    numbered = attempts[-1].number + 1 if attempts else 1
    # an attempt taken back before its play began never ran: the update stands as it did before it
    attempts = [a for a in attempts if a.outcome is None or a.outcome.kind is not OutcomeKind.WITHDRAWN]
    if not attempts:
        return Standing(Verdict.START, next_attempt=numbered)
    last = attempts[-1]
    next_attempt = numbered
    outcome = last.outcome
    if outcome is None:
        # no summary and no final status: the process running it died; restart it (the host lock and
        # stamp make a second run safe even if the old ansible-playbook still lives). It resumes what
        # the dead play began only if that may have disrupted the machine; else it is a new start
        return Standing(Verdict.START, next_attempt=next_attempt, resumes=last.past_drain_point)
    if outcome.kind is OutcomeKind.TASK_FAILED:
        if last.retry_token == token:
            message = outcome.message or failure_message(outcome.capability, outcome.task)
            return Standing(Verdict.FAILED, message)
        return Standing(Verdict.START, next_attempt=next_attempt)
    # (``kubernetes``) a Job that died mid-play past its drain point is resumed as a play whose process
    # died is (above), but as the interrupted attempt it is: after its backoff and within the budget, so
    # a Job that dies again and again ends blocked (whose clean-up uncordons the Node) instead of looping
    resumes = outcome.kind is OutcomeKind.INTERRUPTED and outcome.died_past_drain_point
    if last.retry_token != token:  # the user asked to retry now
        return Standing(Verdict.START, next_attempt=next_attempt, resumes=resumes)
    spent = [
        a.outcome for a in attempts if a.retry_token == token and a.outcome and a.outcome.kind in BUDGETED
    ]
    if budget is not None and len(spent) >= budget:
        message = BLOCKED_MESSAGE.format(count=len(spent), reason=last_reason(spent[-1]))
        return Standing(Verdict.FAILED, message, blocked=True)
    failures = 0
    for attempt in reversed(attempts):
        if attempt.outcome is None or attempt.outcome.kind not in RETRIABLE:
            break
        failures += 1
    remaining = outcome.finished + backoff_seconds(failures, base_backoff) - now
    if remaining <= 0:
        return Standing(Verdict.START, next_attempt=next_attempt, resumes=resumes)
    return Standing(
        Verdict.WAIT,
        progress.retrying(outcome.kind, next_attempt),
        wait_seconds=max(1, math.ceil(remaining)),
        next_attempt=next_attempt,
        resumes=resumes,
    )
