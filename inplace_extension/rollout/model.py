"""What ``status`` shows: each Machine's state in a rollout (:class:`MachineStatus`) under the object
that owns them (:class:`Rollout`), and the JSON document of both.

The states are the ones an operator asks about during a rollout, in the order a Machine goes through
them; ``pending`` is a Machine whose owner has not begun its update yet (CAPI has not called
UpdateMachine for it), ``unknown`` one nothing is recorded of.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

KIND: Final = "RolloutStatus"
API_VERSION: Final = "inplace-extension.io/v1alpha1"


class State(enum.Enum):
    PENDING = "pending"  # its owner has not begun its update (CAPI: UpToDate False, not Updating)
    WAITING = "waiting"  # not started: outside its maintenance windows, or a health check does not hold
    PAUSED = "paused"  # not started: an operator's pause annotation on its owner
    QUEUED = "queued"  # its attempt waits for a free run slot, or starts at the next poll
    RUNNING = "running"  # an attempt plays (``step``: the step it is in)
    RETRYING = "retrying"  # an attempt failed in a way worth retrying: the next starts after a backoff
    DONE = "done"  # applied (and its health gate passed): the host has the desired state
    FAILED = "failed"  # a task failed (remembered until the retry annotation changes), or cancelled
    BLOCKED = "blocked"  # its retry budget is spent until the retry annotation changes
    UNKNOWN = "unknown"  # nothing recorded of it


# the states that are over: the progress bar counts ``done``; these end the rollout for their Machine
FINAL: Final = frozenset({State.DONE, State.FAILED, State.BLOCKED})


@dataclass(frozen=True)
class MachineStatus:
    """One Machine's update as its record says."""

    namespace: str
    name: str
    state: State
    message: str  # the last message: what UpdateMachine answered, an Event's or a condition's message
    step: str | None = None  # running: the step its play is in
    attempt: int | None = None  # the number of its current (or last) attempt; None before the first
    host: str | None = None  # the host address the attempt plays on
    since: float | None = None  # wall-clock seconds since when it is in this state (None: not known)

    def document(self) -> dict[str, Any]:
        return {
            "namespace": self.namespace,
            "name": self.name,
            "state": self.state.value,
            "step": self.step,
            "attempt": self.attempt,
            "host": self.host,
            "since": timestamp(self.since),
            "message": self.message,
        }


@dataclass(frozen=True)
class Rollout:
    """The Machines of one owner (a MachineDeployment, KubeadmControlPlane, Cluster, or the runs dir of
    the ``local`` executor), by name."""

    owner: str  # ``MachineDeployment default/md-0``, ``runs dir /var/lib/...``
    machines: tuple[MachineStatus, ...]
    # the Machines are of several namespaces (the runs dir's): each row names its namespace too
    namespaced: bool = False

    def counts(self) -> dict[State, int]:
        """How many Machines are in each state (every state, 0 included), in :class:`State`'s order."""
        counts = dict.fromkeys(State, 0)
        for machine in self.machines:
            counts[machine.state] += 1
        return counts

    def document(self, now: float) -> dict[str, Any]:
        """The ``-o json`` document (docs/operations.md)."""
        return {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "owner": self.owner,
            "time": timestamp(now),
            "summary": {
                "machines": len(self.machines),
                **{state.value: count for state, count in self.counts().items()},
            },
            "machines": [machine.document() for machine in self.machines],
        }


def timestamp(seconds: float | None) -> str | None:
    """RFC 3339 in UTC, to the second, as Kubernetes writes times."""
    if seconds is None:
        return None
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
