"""Values exchanged between the engine's callers and the runs layer: what to run, how far it got, and
the cluster side of a run, the steps it takes in the cluster around its play (:class:`ClusterSide`)."""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

from inplace_extension.inplace.plan import Plan
from inplace_extension.metrics import WaitReason
from inplace_extension.runs import progress


@dataclass(frozen=True)
class Hold:
    """An operator holds the machine's update (the pause annotation on its Cluster, MachineDeployment or
    control plane; for the MCM agent, on its MachineDeployment): no attempt starts while it holds;
    ``cancel``: an update whose next attempt has not started fails with ``message``
    (:mod:`inplace_extension.runs.holds`)."""

    message: str
    cancel: bool = False


@dataclass(frozen=True)
class RunRequest:
    """One update, reduced to what a run needs: a plan for one machine (:func:`run_request`).

    ``inputs`` maps capability name (= role name) to that role's inputs; it never holds
    ``joinConfiguration.discovery`` or any other field no capability claims. ``roles`` names the role of
    each user-defined capability (from the capabilities file; built-ins are their own role).
    """

    namespace: str
    name: str
    fingerprint: str  # sha256 hex of the canonical JSON of ``inputs``
    capabilities: tuple[str, ...]  # roles to run, in the fixed documented order
    inputs: Mapping[str, Mapping[str, Any]]
    annotations: Mapping[str, str] = field(default_factory=dict)  # Machine annotations (address, retry token)
    labels: Mapping[str, str] = field(default_factory=dict)  # Machine labels (inventory label selectors)
    roles: Mapping[str, str] = field(default_factory=dict)  # user-defined capability -> its role
    # an operator's hold the caller read with the desired state (the MCM agent); the CAPI side's comes
    # from the service's cluster side instead
    hold: Hold | None = None
    # the machine's ``status.addresses`` as (type, address) when the caller holds them (the MCM agent has
    # the Node it updates); None: the cluster side reads the live Machine when it is needed
    addresses: tuple[tuple[str, str], ...] | None = None

    @property
    def ident(self) -> str:
        """Run ident: ``<namespace>.<name>.<fingerprint[:12]>`` (names a directory under the runs dir)."""
        return f"{self.namespace}.{self.name}.{self.fingerprint[:12]}"

    @property
    def machine(self) -> str:
        return f"{self.namespace}/{self.name}"


def run_request(
    plan: Plan,
    annotations: Mapping[str, str],
    labels: Mapping[str, str],
    hold: Hold | None = None,
    addresses: Sequence[tuple[str, str]] | None = None,
) -> RunRequest:
    """The run of ``plan`` (the UpdateMachine hook's and the MCM agent's alike). ``annotations`` and
    ``labels`` are the machine's (the Machine's, or the Node's): the address annotation, the retry token,
    the inventory's label selectors; ``hold``: an operator's pause or cancel the caller found;
    ``addresses`` its ``status.addresses`` when the caller read them (the Node's), the host address when
    neither the annotation nor the inventory gives one."""
    return RunRequest(
        namespace=plan.namespace,
        name=plan.name,
        fingerprint=plan.fingerprint,
        capabilities=plan.capabilities,
        inputs=plan.inputs,
        # role names of user-defined steps come from the capabilities file (via the plan), never a request
        roles={step.capability: step.role for step in plan.steps if step.role is not None},
        annotations=dict(annotations),
        labels=dict(labels),
        hold=hold,
        addresses=None if addresses is None else tuple(addresses),
    )


@dataclass(frozen=True)
class CommandCheck:
    """A health gate check the play runs on the host before its stamp: ``argv`` (no shell) must exit 0
    within ``timeout_seconds`` per try. From the capabilities file (``health_checks`` with ``command``)."""

    name: str
    argv: tuple[str, ...]
    timeout_seconds: float


class ProgressState(enum.Enum):
    IN_PROGRESS = "in_progress"  # Success + retryAfterSeconds > 0
    DONE = "done"  # Success + retryAfterSeconds = 0
    FAILED = "failed"  # Failure, same message on every call


@dataclass(frozen=True)
class Progress:
    """Where an update stands. Messages are deterministic and secret-free (CAPI shows them, §3.2)."""

    state: ProgressState
    message: str
    retry_after_seconds: int = 0
    retrying: bool = False  # IN_PROGRESS only: waiting out a backoff after a retriable failure
    # IN_PROGRESS only: not started yet or not done, waiting for this before it goes on (no run in flight)
    waiting: WaitReason | None = None
    blocked: bool = False  # FAILED only: the retry budget is spent (not a task failure)
    # FAILED only: not remembered, nothing ran: a later call starts the update once what failed it is
    # over (a kubernetes health check past its timeout before the start holds again)
    transient: bool = False
    # FAILED only: an operator's cancel (the pause annotation's ``cancel`` value) failed it before its
    # next attempt started; not remembered: once the annotation is gone, a later call starts it
    cancelled: bool = False
    # IN_PROGRESS only: an attempt is in flight (queued or playing): EndWaitingRuns.wait_end waits for its end
    in_flight: bool = False
    # IN_PROGRESS only: the cluster's API server was away or busy (no answer, 429, 5xx): nothing was
    # decided, charged or posted; the next call asks again
    unavailable: bool = False


class Runs(Protocol):
    """What the engine's callers (the UpdateMachine hook, the MCM agent) need of the runs layer: where
    an update stands, starting it when new. Implemented by :class:`inplace_extension.runs.service.RunService`.
    """

    async def poll(self, request: RunRequest) -> Progress:
        """Fast and non-blocking (a poll near a play's expected end waits for it, a few seconds at most:
        runs/play_time.py); raises ``errors.ExtensionError`` subclasses for known trouble."""
        ...


class EndWaitingRuns(Runs, Protocol):
    """A :class:`Runs` that can also wait for the end of a play in flight: what the MCM agent needs,
    to poll again as the play ends rather than at its next tick. Implemented by ``RunService``."""

    async def held(self, request: RunRequest) -> Progress | None:
        """What keeps a new start of ``request`` back now (cancel, pause, window, health checks), as
        :meth:`poll` would answer it; None: nothing. Work beside the play obeys the same holds."""
        ...

    async def wait_end(self, request: RunRequest, seconds: float) -> bool:
        """Wait until ``request``'s attempt in flight has ended, at most ``seconds``: True when none is in
        flight (any more), False when it still is."""
        ...


@dataclass(frozen=True)
class Blocked:
    """Why the play may not start (the drain did not finish): a stable message; ``retriable`` when it
    is worth trying again by itself (the API server unreachable), else remembered like a task failure."""

    message: str
    retriable: bool = False


@dataclass(frozen=True)
class Unhealthy:
    """A health check of cluster objects (``kubernetes`` in the capabilities file) that does not hold:
    ``check`` names it, ``expression`` and ``target`` say what it wants of which objects, ``detail`` why
    it does not hold now (false, CEL's error, no object, the API's answer); ``start_timeout_seconds``
    how long an update's next attempt (the first or a retry) waits for it (None: as long as it takes)."""

    check: str
    expression: str
    target: str
    detail: str
    start_timeout_seconds: int | None = None

    @property
    def waiting(self) -> str:
        return progress.health_check(self.check, self.detail)

    def failure(self, seconds: int) -> str:
        """The Failure past the gate's timeout: stable (no detail that changes from poll to poll)."""
        return progress.health_check_failed(self.check, seconds, self.expression, self.target)

    def start_failure(self, seconds: int) -> str:
        """The Failure of an update not started past ``seconds`` of waiting: stable, like :meth:`failure`."""
        return progress.health_check_timed_out(self.check, seconds, self.expression, self.target)


class ObjectHealth(Protocol):
    """The health checks of cluster objects around each update (``inplace_extension.kubeaware.
    object_checks``); :data:`NO_OBJECT_HEALTH` when there are none. Blocking: called from worker threads.
    """

    def unhealthy(self, request: RunRequest) -> Unhealthy | None:
        """The first check, in file order, that does not hold for this machine's cluster; None: all hold.
        Never raises: a cluster that cannot be read does not hold."""
        ...


class NoObjectHealth:
    def unhealthy(self, request: RunRequest) -> Unhealthy | None:
        return None


NO_OBJECT_HEALTH: Final[ObjectHealth] = NoObjectHealth()


class ClusterSide(Protocol):
    """What a run does in the cluster around the play (the Kubernetes-aware mode, ``inplace_extension.
    kubeaware``); :data:`NO_CLUSTER_SIDE` when the service has no cluster access. Every method may block
    on the API server: the service calls them from worker threads, never from the event loop.
    """

    def addresses(self, request: RunRequest) -> Sequence[tuple[str, str]]:
        """The live Machine's ``status.addresses`` as (type, address); empty when unknown."""
        ...

    def hold(self, request: RunRequest) -> Hold | None:
        """Whether an operator paused or cancelled this Machine's update (None: it may start)."""
        ...

    def before_play(self, request: RunRequest) -> Blocked | None:
        """Prepare the run (what its steps will disrupt); None when the play may start."""
        ...

    def drain_point(self, request: RunRequest) -> str | None:
        """The capability right before which the play waits for the Node's drain (None: no drain)."""
        ...

    def drain(self, request: RunRequest, report: Callable[[str], None]) -> Blocked | None:
        """The play reached its drain point: cordon and drain (progress through ``report``); None when
        drained. The steps before the drain point are applied by then, whatever this answers."""
        ...

    def step_started(self, request: RunRequest, capability: str) -> None:
        """The play entered ``capability``'s role (skip-remediation while a disruptive step runs)."""
        ...

    def after_play(self, request: RunRequest) -> None:
        """The play ended (any outcome): undo what before_play and step_started did, exactly once."""
        ...

    def settle(self, request: RunRequest, applied_at: float, address: str | None) -> Progress:
        """The update is applied on the host (``address``): clean up, then the health gate decides."""
        ...

    def failed(self, request: RunRequest, message: str) -> bool:
        """The update failed for good: clean up (a restarted service may find a cordoned Node). True when
        nothing of ours is left; False when the API server did not let it clean up: ask again later."""
        ...

    def state(self, request: RunRequest, reason: str, message: str, warning: bool = False) -> None:
        """A state change the cluster should see (an Event on the Machine); never blocks."""
        ...


class NoClusterSide:
    """No cluster access: the run is the play alone, done when the host carries the stamp."""

    def addresses(self, request: RunRequest) -> Sequence[tuple[str, str]]:
        return ()

    def hold(self, request: RunRequest) -> Hold | None:
        return None

    def before_play(self, request: RunRequest) -> Blocked | None:
        return None

    def drain_point(self, request: RunRequest) -> str | None:
        return None

    def drain(self, request: RunRequest, report: Callable[[str], None]) -> Blocked | None:
        return None

    def step_started(self, request: RunRequest, capability: str) -> None:
        return None

    def after_play(self, request: RunRequest) -> None:
        return None

    def settle(self, request: RunRequest, applied_at: float, address: str | None) -> Progress:
        return Progress(ProgressState.DONE, progress.APPLIED)

    def failed(self, request: RunRequest, message: str) -> bool:
        return True

    def state(self, request: RunRequest, reason: str, message: str, warning: bool = False) -> None:
        return None


NO_CLUSTER_SIDE: Final[ClusterSide] = NoClusterSide()
