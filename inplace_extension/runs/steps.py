"""What a batch play reports per Machine besides its outcome: the step running now, and a refused start.

Task events name the role; a user-defined step's role maps back to its capability. The registry's phase
(progress.py: starting, a capability, the health gate's commands, finishing) is what a poll answers
while the play runs, and the cluster side hears of each capability as it starts (an Event on the Machine).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from inplace_extension.runs import progress
from inplace_extension.runs.artifacts import Outcome, OutcomeKind
from inplace_extension.runs.model import Blocked, ClusterSide, RunRequest

# the name of update_machine.yml's task that runs the health gate's command checks (before the stamp)
HEALTH_TASK = "Health gate, run the command checks on the host"


def blocked_outcome(failure: Blocked, now: float) -> Outcome:
    """The outcome of a Machine the cluster side kept out of the play (not drained)."""
    if failure.retriable:  # retried with backoff, like an unreachable host
        return Outcome(OutcomeKind.INTERRUPTED, detail=failure.message, finished=now, message=failure.message)
    # remembered until the retry annotation changes, like a failed task
    return Outcome(OutcomeKind.TASK_FAILED, capability="drain", message=failure.message, finished=now)


class StepTracker:
    """Turns the play's task events into each Machine's phase and step-started notices."""

    def __init__(
        self, requests: Sequence[RunRequest], set_phase: Callable[[str, str], None], cluster: ClusterSide
    ) -> None:
        self._requests = {request.ident: request for request in requests}
        self._step_of_role = {r.ident: {role: cap for cap, role in r.roles.items()} for r in requests}
        self._set_phase = set_phase
        self._cluster = cluster
        self._current: dict[str, str] = {}
        self._seen_capability: set[str] = set()

    def on_task(self, host: str, role: str | None, task: str) -> None:
        request = self._requests.get(host)
        if request is None:
            return
        step = self._step_of_role[host].get(role or "", role)
        if step in request.capabilities:
            self._seen_capability.add(host)
            self._set_phase(host, step)
            if self._current.get(host) != step:
                self._current[host] = step
                self._cluster.step_started(request, step)
        elif task.startswith(HEALTH_TASK):
            self._set_phase(host, progress.HEALTH_COMMANDS)
        else:
            self._set_phase(host, progress.FINISHING if host in self._seen_capability else progress.STARTING)
