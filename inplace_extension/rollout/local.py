"""A rollout as the ``local`` executor's runs dir records it: each machine's current episode
(local/episode.py), its attempts there with their outcomes (plays/outcomes.py), judged by the service's
own state machine (runs/policy.py) with the retry settings the service runs with; a running attempt's
step from its play's events so far.

The runs dir holds what began: an update that waits before its first attempt (a maintenance window, a
pause, its turn in the queue) lives in the serving process only, and shows in the cluster view (its
Events) instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Final

from inplace_extension.local import episode
from inplace_extension.plays.artifacts import BatchRef, play_ended, read_json
from inplace_extension.plays.outcomes import current_task, load_attempts
from inplace_extension.plays.steps import DRAIN_TASK, HEALTH_TASK, JOINT_STEPS, JOINT_TASK
from inplace_extension.rollout.model import MachineStatus, Rollout, State
from inplace_extension.rollout.standing import begun, ended_status
from inplace_extension.runs import progress
from inplace_extension.runs.attempts import Attempt, OutcomeKind
from inplace_extension.runs.policy import Verdict, decide

# the local executor's summary of an ended attempt (local/backend.py writes it as the attempt ends): an
# attempt without it whose play has a final status ended a moment ago and is being summarised (the full
# fingerprint that classifying it needs is not on disk, so it is not classified here)
SUMMARY: Final = "outcome.json"
NOT_SUMMARISED = "the play has ended; its outcome is being recorded"
INTERRUPTED = "its play died before it ended (the service stopped?): the next poll starts it again"
DRAIN_STEP = "drain"
HEALTH_STEP = "health gate"


def read_runs_dir(runs_dir: Path, now: float, retry_after: int, budget: int) -> Rollout:
    """Every machine of ``runs_dir``; ``retry_after`` and ``budget``: the service's
    ``--retry-after-seconds`` and ``--max-failed-attempts`` (they decide retrying from blocked)."""
    machines = []
    for namespace, name, current in episode.machines(runs_dir):
        # the fingerprint only serves to classify a play nobody summarised: see SUMMARY
        attempts = load_attempts(runs_dir / current.ident, "", current.episode)
        machines.append(machine_status(namespace, name, attempts, now, retry_after, budget))
    return Rollout(f"runs dir {runs_dir}", tuple(machines), namespaced=True)


def machine_status(
    namespace: str, name: str, attempts: Sequence[Attempt], now: float, retry_after: int, budget: int
) -> MachineStatus:
    ran = begun(attempts)
    if not ran:
        return MachineStatus(namespace, name, State.QUEUED, "no attempt has begun yet")
    last = ran[-1]
    if last.outcome is not None and last.path is not None and not (last.path / SUMMARY).exists():
        step = progress.FINISHING
        return MachineStatus(
            namespace,
            name,
            State.RUNNING,
            NOT_SUMMARISED,
            step,
            since=last.started,
            attempt=last.number,
            host=last.address,
        )
    # the retry token of the last attempt: the one the service answers with until the operator changes it
    standing = decide(ran, last.retry_token, now, retry_after, budget)
    ended = last.outcome.finished if last.outcome is not None else None
    if standing.verdict is Verdict.DONE:
        success = next(a for a in ran if a.outcome is not None and a.outcome.kind is OutcomeKind.SUCCESSFUL)
        finished = success.outcome.finished if success.outcome is not None else None
        return MachineStatus(
            namespace, name, State.DONE, progress.APPLIED, None, success.number, success.address, finished
        )
    settled = ended_status(namespace, name, standing, last)
    if settled is not None:
        return settled
    if last.outcome is not None:  # its backoff is over, or the operator asked for a retry
        message = f"attempt {standing.next_attempt} starts at the next poll"
        return MachineStatus(
            namespace, name, State.QUEUED, message, since=ended, attempt=last.number, host=last.address
        )
    batch = BatchRef.from_meta(read_json(last.path / "meta.json") or {}) if last.path is not None else None
    if batch is not None and play_ended(batch.dir):
        return MachineStatus(
            namespace,
            name,
            State.RETRYING,
            INTERRUPTED,
            since=last.started,
            attempt=last.number,
            host=last.address,
        )
    step = step_of(current_task(batch) if batch is not None else None)
    message = progress.HEALTH_COMMANDS if step == HEALTH_STEP else progress.running(step)
    return MachineStatus(
        namespace,
        name,
        State.RUNNING,
        message,
        step,
        since=last.started,
        attempt=last.number,
        host=last.address,
    )


def step_of(task: tuple[str, str] | None) -> str:
    """The step of a play's current ``(role, task)``: its role (a built-in step's role is the step; a
    user-defined step's is its own), or the play's own tasks around them (plays/steps.py)."""
    if task is None:
        return progress.STARTING
    role, name = task
    if name == DRAIN_TASK:
        return DRAIN_STEP
    if name.startswith(HEALTH_TASK):
        return HEALTH_STEP
    if name == JOINT_TASK:
        return ", ".join(JOINT_STEPS)
    return role or progress.STARTING
