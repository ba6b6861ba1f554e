"""The two ports behind the one executor: where an update's attempts are recorded (:class:`AttemptRecord`)
and how an attempt's play is launched and watched (:class:`Launcher`); a :class:`Backend` is both.

The decisions (the retry policy, holds, windows, health checks, the health gate) are one piece of code,
:class:`~inplace_extension.runs.service.RunService`, whatever the backend. Two backends exist:
``local`` (:mod:`inplace_extension.local.backend`: the runs directory on disk, plays in worker threads of
this process) and ``kubernetes`` (:mod:`inplace_extension.kubejobs`: the record on the object the update
is for, one Kubernetes Job per attempt).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from inplace_extension.runs.attempts import Attempt
from inplace_extension.runs.model import RunRequest
from inplace_extension.runs.resolve import HostTarget


@dataclass(frozen=True)
class Launch:
    """A new attempt the service decided to start: the request, the host it goes to (resolved and
    allow-listed), the retry token (:func:`~inplace_extension.runs.policy.retry_token`) it starts with,
    and its play's expected duration (runs/play_time.py), which a backend that outlives the process
    records with it. ``may_begin`` is asked again right before its play begins, after any wait for a
    slot (in a worker thread: it may block): False when the operator's hold, a closed window or a health
    check says it may no longer start; then it does not play, nothing is recorded, and the next poll
    answers why. None: an attempt that finishes a play already begun, which nothing holds back, or one
    checked already (the ``kubernetes`` executor's Job). ``resumes``: it finishes a play that died past
    its drain point (policy.Standing.resumes); recorded with it, so that if it dies too, the machine
    still counts as disrupted, wherever its own play got to."""

    request: RunRequest
    target: HostTarget
    token: str
    may_begin: Callable[[], bool] | None = None
    expected: float = 0.0
    resumes: bool = False


class AttemptRecord(Protocol):
    """Where the attempts of an update and the health-wait clock are kept, so that any process (a
    restarted one, another replica) answers a poll as the one that started the update would."""

    def cached(self, ident: str) -> Sequence[Attempt]:
        """The attempts the last :meth:`attempts` of ``ident`` found (empty when none); never blocks."""
        ...

    async def attempts(self, request: RunRequest) -> list[Attempt]:
        """The attempts of ``request``'s ident, oldest first (an attempt in flight has no outcome), as the
        :meth:`~Launcher.reconcile` of the same poll left them (else reconciled now)."""
        ...

    async def wait_began(self, request: RunRequest, check: str, token: str, now: float) -> float:
        """When the update began waiting for the health check ``check`` with the retry token ``token``:
        the recorded start, else ``now`` recorded as the start of a new wait."""
        ...

    async def end_wait(self, request: RunRequest) -> None:
        """The update waits for no health check (any more): forget the wait's clock."""
        ...

    async def gate_passed(self, request: RunRequest, number: int) -> None:
        """The health gate passed after attempt ``number``: recorded where any replica reads it (its
        :attr:`~inplace_extension.runs.attempts.Attempt.gate_passed`), or nothing where the process that
        saw it is the only one to answer (``local``: its memory)."""
        ...


class Launcher(Protocol):
    """How an attempt is started and how far one in flight is."""

    async def reconcile(self, request: RunRequest) -> str | None:
        """Bring the record of ``request``'s attempts up to date with what ran them (``kubernetes``: a
        finished Job's outcome is written into the record; ``local``: the runs directory is the record
        already), then answer the phase message of its attempt in flight (``queued: ...``, ``running:
        ntp``), or None when none is; answers at once. The first call of every poll."""
        ...

    def pending(self, ident: str) -> bool:
        """Whether the attempt in flight that :meth:`reconcile` just found for ``ident`` has not begun its
        play (waiting for a slot, or its Job's Pod not started) and is held to the start checks (it does
        not finish a play already begun); never blocks."""
        ...

    async def withdraw(self, request: RunRequest) -> bool:
        """Take ``request``'s attempt in flight back before its play begins (a hold came while it waited):
        True when no play of it will run (nothing charged: it never started), False when its play has
        begun or it ended meanwhile (the record then says how)."""
        ...

    async def wait_end(self, request: RunRequest, seconds: float) -> bool:
        """Wait until ``request``'s attempt in flight has ended and its outcome is in the record, at most
        ``seconds``: True when none is in flight (any more), False when it still is. Never blocks the
        event loop; the poll near a play's expected end (runs/play_time.py) and the MCM agent use it."""
        ...

    async def launch(self, launch: Launch) -> str:
        """Start a new attempt; the message a poll answers now (queued or starting)."""
        ...

    def close(self, timeout: float) -> None:
        """Admit no more attempts; give the ones this process runs ``timeout`` seconds to end."""
        ...


class Backend(AttemptRecord, Launcher, Protocol):
    """An executor's record and launcher, which share what they know of the attempts."""
