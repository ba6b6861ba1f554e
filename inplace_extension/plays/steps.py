"""What a batch play reports per Machine besides its outcome: the step running now, and a refused start.

Task events name the role; a user-defined step's role maps back to its capability. The registry's phase
(progress.py: starting, a capability, the health gate's commands, finishing) is what a poll answers
while the play runs, and the cluster side hears of each capability as it starts (an Event on the Machine).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from inplace_extension.plays.artifacts import drain_failure_file, read_json
from inplace_extension.runs import progress
from inplace_extension.runs.attempts import Outcome, OutcomeKind
from inplace_extension.runs.model import Blocked, ClusterSide, RunRequest

# the name of update_machine.yml's task that runs the health gate's command checks (before the stamp)
HEALTH_TASK = "Health gate, run the command checks on the host"
# the name of tasks/drain_point.yml's task where the play waits for the service to drain the Node
DRAIN_TASK = "Drain point, wait for the service to drain the Node"
# the name of update_machine.yml's task that does JOINT_STEPS' host work in one module execution
# (inplace_joint_steps): not in a role, so its events name none; both steps start with it
JOINT_TASK = "Apply kubeadm_files and kubelet_args in one module execution"
# the steps that task does, in the play's order (also what plays.runner's skip tags decide the joint
# execution by)
JOINT_STEPS = ("kubeadm_files", "kubelet_args")


def blocked_outcome(failure: Blocked, now: float) -> Outcome:
    """The outcome of a Machine the cluster side kept out of the play, or stopped at its drain point."""
    if failure.retriable:  # retried with backoff, like an unreachable host
        return Outcome(OutcomeKind.INTERRUPTED, detail=failure.message, finished=now, message=failure.message)
    # remembered until the retry annotation changes, like a failed task
    return Outcome(OutcomeKind.TASK_FAILED, capability="drain", message=failure.message, finished=now)


def drain_outcome(attempt_dir: Path, now: float) -> Outcome | None:
    """The outcome of a Machine whose play stopped at its drain point because the drain failed."""
    failure = read_json(drain_failure_file(attempt_dir))
    if failure is None:
        return None
    return blocked_outcome(Blocked(str(failure.get("message")), bool(failure.get("retriable"))), now)


class StepTracker:
    """Turns the play's task events into each Machine's phase and step-started notices."""

    def __init__(
        self,
        requests: Sequence[RunRequest],
        set_phase: Callable[[str, str], None],
        cluster: ClusterSide,
        on_drain_point: Callable[[str], None] = lambda ident: None,
    ) -> None:
        """``on_drain_point(ident)``: that Machine's play waits at its drain point now."""
        self._requests = {request.ident: request for request in requests}
        self._step_of_role = {r.ident: {role: cap for cap, role in r.roles.items()} for r in requests}
        self._set_phase = set_phase
        self._cluster = cluster
        self._current: dict[str, str] = {}
        self._seen_capability: set[str] = set()
        self._on_drain_point = on_drain_point

    def on_task(self, host: str, role: str | None, task: str) -> None:
        request = self._requests.get(host)
        if request is None:
            return
        step = self._step_of_role[host].get(role or "", role)
        if step in request.capabilities:
            self._step(request, step)
        elif task == JOINT_TASK:
            # one module execution does both: each is announced as it would be by its role, in order,
            # so the cluster side sees the kubelet's restart (kubelet_args) before the execution does it
            for joint_step in JOINT_STEPS:
                self._step(request, joint_step)
        elif task.startswith(HEALTH_TASK):
            self._set_phase(host, progress.HEALTH_COMMANDS)
        elif task == DRAIN_TASK:
            self._on_drain_point(host)  # the drain reports its own phase (draining: N pods left)
        else:
            self._set_phase(host, progress.FINISHING if host in self._seen_capability else progress.STARTING)

    def _step(self, request: RunRequest, step: str) -> None:
        """The play entered ``step`` of ``request``'s Machine: its phase, and its start the first time."""
        host = request.ident
        self._seen_capability.add(host)
        self._set_phase(host, step)
        if self._current.get(host) != step:
            self._current[host] = step
            self._cluster.step_started(request, step)
