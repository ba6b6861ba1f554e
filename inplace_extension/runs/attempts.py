"""What an attempt of an update is and what it ended as: the values every executor records and the
decisions read (policy.py, play_time.py, progress.py), whichever record holds them: the ``local``
executor's runs directory (plays/artifacts.py, plays/outcomes.py) or the ``kubernetes`` executor's record
on the Machine or Node (kubejobs/record.py).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class OutcomeKind(enum.Enum):
    SUCCESSFUL = "successful"  # status successful and the host stamp carries our fingerprint
    TASK_FAILED = "task_failed"  # a task failed on the host: remembered per fingerprint
    UNREACHABLE = "unreachable"  # SSH could not reach the host: retried with backoff
    HOST_BUSY = "host_busy"  # the host lock stayed with another run (or was lost to it): retried
    INTERRUPTED = "interrupted"  # killed, canceled, no status, or no stamp proof: retried
    # taken back before its play began (the ``kubernetes`` executor: a hold came while its Job's Pod had
    # not started): nothing ran, nothing is charged, the next attempt is a new start
    WITHDRAWN = "withdrawn"


RETRIABLE = frozenset({OutcomeKind.UNREACHABLE, OutcomeKind.HOST_BUSY, OutcomeKind.INTERRUPTED})


@dataclass(frozen=True)
class Outcome:
    kind: OutcomeKind
    capability: str | None = None  # role of the failed task
    task: str | None = None  # name of the failed task, template part cut off
    detail: str = ""  # for logs only (never shown to CAPI): status/rc and the like
    finished: float = 0.0  # wall-clock seconds (time.time()) when the attempt ended
    message: str | None = None  # a failure before the play (drain): the stable message CAPI is shown
    # the steps the play skipped because the host's stamp showed them applied with the same inputs
    skipped: tuple[str, ...] = ()
    # INTERRUPTED only, the ``kubernetes`` executor's: the attempt's Job died mid-play (its Pod deleted,
    # evicted, killed, out of time, or the Job gone) when its play may have disrupted the machine (past
    # its drain point, or not known): the next attempt finishes what it began (policy.Standing.resumes),
    # as the ``local`` executor's attempt after a play whose process died (Attempt.past_drain_point)
    died_past_drain_point: bool = False

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "kind": self.kind.value,
            "capability": self.capability,
            "task": self.task,
            "detail": self.detail,
            "finished": self.finished,
        }
        if self.message is not None:
            data["message"] = self.message
        if self.skipped:
            data["skipped"] = list(self.skipped)
        if self.died_past_drain_point:
            data["died_past_drain_point"] = True
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Outcome:
        return cls(
            kind=OutcomeKind(data["kind"]),
            capability=data.get("capability"),
            task=data.get("task"),
            detail=str(data.get("detail", "")),
            finished=float(data.get("finished", 0.0)),
            message=data.get("message"),
            skipped=tuple(str(step) for step in data.get("skipped") or ()),
            died_past_drain_point=data.get("died_past_drain_point") is True,
        )


@dataclass(frozen=True)
class Attempt:
    """One attempt of an update, as its record says (``local``: its directory on disk; ``kubernetes``: the
    record on the Machine or Node, with its Job)."""

    number: int
    path: Path | None  # the attempt directory (local); None when the record is not on this disk
    retry_token: str  # hash of the retry annotation when it started ("" = none)
    outcome: Outcome | None  # None: never summarised (still running, or the service died during it)
    address: str | None = None  # the host address SSH used (health checks of the Kubernetes-aware mode)
    started: float = 0.0  # wall-clock seconds when it started (meta.json; 0 when not recorded)
    # the episode of the desired state it began in (local/episode.py; kubejobs/record.py): a desired state
    # that comes back (A -> B -> A) is a new episode, and only the current episode's attempts answer
    episode: str = ""
    # no outcome (its process died mid-play): whether its play may have disrupted the machine, by its own
    # events: it reached its drain point (the Node may be cordoned), or, without one, began a step (the
    # host may be half changed). True where that cannot be told; False: nothing was disrupted
    past_drain_point: bool = True
    # the play's expected duration in seconds, decided when it was launched (play_time.py; the
    # ``kubernetes`` record's, so that every replica expects the same end); 0 when not recorded
    expected: float = 0.0
    # the health gate passed after this (successful) attempt, as the record says (``kubernetes``: every
    # replica answers done from then on); False: not recorded
    gate_passed: bool = False
