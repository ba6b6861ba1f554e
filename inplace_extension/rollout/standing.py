"""How the service's own standing of an update (runs/policy.py ``decide``) reads in ``status``, for both
readers of a record (the runs dir's, the ``kubernetes`` executor's): the attempts that began, and the
states an ended attempt leaves a Machine in (failed, blocked, retrying), as UpdateMachine answers them."""

from __future__ import annotations

from collections.abc import Sequence

from inplace_extension.rollout.model import MachineStatus, State
from inplace_extension.runs.attempts import Attempt, OutcomeKind
from inplace_extension.runs.policy import Standing, Verdict


def begun(attempts: Sequence[Attempt]) -> list[Attempt]:
    """The attempts that began: one taken back before its play (withdrawn) never ran."""
    return [a for a in attempts if a.outcome is None or a.outcome.kind is not OutcomeKind.WITHDRAWN]


def ended_status(namespace: str, name: str, standing: Standing, last: Attempt) -> MachineStatus | None:
    """A Machine whose ``last`` attempt ended failed (blocked once its budget is spent) or retrying after
    its backoff, with the service's own message; None for any other standing."""
    ended = last.outcome.finished if last.outcome is not None else None
    if standing.verdict is Verdict.FAILED:
        state = State.BLOCKED if standing.blocked else State.FAILED
    elif standing.verdict is Verdict.WAIT:
        state = State.RETRYING
    else:
        return None
    return MachineStatus(
        namespace, name, state, standing.message, since=ended, attempt=last.number, host=last.address
    )
