"""The ``kubernetes`` executor's record of one update: an annotation on the object the update is for.

One JSON value, ``inplace-extension.io/attempts``, keyed by the run ident (namespace, name and the
desired state's fingerprint): a record of another ident is a record of another desired state, so the
update starts afresh and its first write replaces it. That write opens a new *episode* of the desired
state (a random id, :meth:`Record.opened`): a desired state that comes back after another (A -> B -> A,
a revert) is a new episode, whose Jobs are named and labelled with it, so a Job of A's earlier episode
(still there for ``--job-ttl-seconds``) never answers it; two replicas writing at once agree on one
episode through the write's resourceVersion precondition. It holds the episode, each attempt's number,
retry token (a hash), host lock token, start, its play's expected duration, host address, Job name,
outcome (None while its Job runs; an interrupted one says whether its Job died past its drain point),
whether it resumes such a play, and whether the health gate passed after it, and the health-wait clock.
Bounded: the oldest attempts go past :data:`MAX_ATTEMPTS` (far above any retry budget). It stays on the
object until the next desired state replaces it or the object is deleted. Pure (but for the episode id
:meth:`Record.opened` draws): the backend reads and writes it with a resourceVersion precondition.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, replace
from typing import Any, Final

from inplace_extension.runs.attempts import Attempt, Outcome

RECORD_ANNOTATION: Final = "inplace-extension.io/attempts"
MAX_ATTEMPTS: Final = 200
VERSION: Final = 1
# an episode id: 8 random bytes (16 hex) in every Job name of the episode, so that two episodes of one
# desired state never share one (they would have to draw the same 64 bits)
EPISODE_BYTES: Final = 8


@dataclass(frozen=True)
class Recorded:
    """One attempt as recorded."""

    number: int
    token: str  # the retry token it started with
    lock_token: str  # the host lock its play holds
    started: float
    address: str
    job: str  # the Job's name
    outcome: Outcome | None = None  # None: its Job has not been seen ending yet
    expected: float = 0.0  # its play's expected duration, decided at the launch (0: not recorded)
    gate_passed: bool = False  # successful, and the health gate passed after it: done for every replica
    # it resumes a play whose Job died past its drain point (launched unchecked): no hold takes it back
    # while its Pod waits to start (backend.JobBackend.withdraw)
    resumes: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "n": self.number,
            "t": self.token,
            "l": self.lock_token,
            "s": self.started,
            "a": self.address,
            "j": self.job,
            "o": None if self.outcome is None else self.outcome.to_json(),
            "e": self.expected,
            "g": self.gate_passed,
            "r": self.resumes,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Recorded:
        outcome = data.get("o")
        return cls(
            number=int(data["n"]),
            token=str(data.get("t", "")),
            lock_token=str(data.get("l", "")),
            started=float(data.get("s", 0.0)),
            address=str(data.get("a", "")),
            job=str(data["j"]),
            outcome=Outcome.from_json(outcome) if isinstance(outcome, dict) else None,
            expected=float(data.get("e", 0.0)),
            gate_passed=bool(data.get("g", False)),
            resumes=data.get("r") is True,
        )


@dataclass(frozen=True)
class WaitClock:
    """An update not started yet waits for the health check ``check`` since ``since`` (with the retry
    token ``token``)."""

    check: str
    token: str
    since: float


@dataclass(frozen=True)
class Record:
    ident: str
    attempts: tuple[Recorded, ...] = ()
    wait: WaitClock | None = None
    # the episode of the desired state ``ident`` this record is of ("": none yet, the record was not
    # written for this desired state, or by a version before episodes)
    episode: str = ""

    @classmethod
    def decode(cls, value: str | None, ident: str) -> Record:
        """The record of ``ident`` in the annotation ``value``; an empty one when it holds another ident's
        (another desired state), nothing, or something we cannot read (then the next write replaces it)."""
        try:
            data = json.loads(value) if value else None
            if not isinstance(data, dict) or data.get("ident") != ident or data.get("v") != VERSION:
                return cls(ident)
            wait = data.get("wait")
            return cls(
                ident,
                tuple(Recorded.from_json(a) for a in data.get("attempts") or []),
                WaitClock(str(wait["check"]), str(wait["token"]), float(wait["since"]))
                if isinstance(wait, dict)
                else None,
                str(data.get("e", "")),
            )
        except (ValueError, KeyError, TypeError):
            return cls(ident)

    @classmethod
    def earlier_in_flight(cls, value: str | None, ident: str) -> Recorded | None:
        """The last attempt of another ident (an earlier desired state of the same Machine) recorded in
        ``value`` when it has no outcome yet: its Job may still be playing on the host."""
        try:
            data = json.loads(value) if value else None
            if not isinstance(data, dict) or data.get("ident") in (None, ident) or data.get("v") != VERSION:
                return None
            attempts = data.get("attempts") or []
            last = Recorded.from_json(attempts[-1]) if attempts else None
        except (ValueError, KeyError, TypeError, IndexError):
            return None
        return last if last is not None and last.outcome is None else None

    def encode(self) -> str:
        data: dict[str, Any] = {
            "v": VERSION,
            "ident": self.ident,
            "e": self.episode,
            "attempts": [a.to_json() for a in self.attempts[-MAX_ATTEMPTS:]],
        }
        if self.wait is not None:
            data["wait"] = {"check": self.wait.check, "token": self.wait.token, "since": self.wait.since}
        return json.dumps(data, sort_keys=True, separators=(",", ":"))

    def opened(self) -> Record:
        """This record, in an episode: its own, else a new one (a record about to be written for the
        first time for this desired state, or one a version before episodes wrote)."""
        return self if self.episode else replace(self, episode=secrets.token_hex(EPISODE_BYTES))

    def waiting_for_nothing(self) -> Record:
        return replace(self, wait=None)

    @property
    def unfinished(self) -> Recorded | None:
        """The last attempt when its outcome is not recorded yet (its Job runs, or nobody saw it end)."""
        if self.attempts and self.attempts[-1].outcome is None:
            return self.attempts[-1]
        return None

    @property
    def next_number(self) -> int:
        return self.attempts[-1].number + 1 if self.attempts else 1

    def takeover_tokens(self) -> tuple[str, ...]:
        """The host lock tokens of the attempts that have ended: a lock still held with one of them was
        left by a Job of this very update that is gone, so the next attempt takes it over at once."""
        return tuple(a.lock_token for a in self.attempts if a.outcome is not None and a.lock_token)

    def begun(self, attempt: Recorded) -> Record:
        return replace(self, attempts=(*self.attempts, attempt)[-MAX_ATTEMPTS:])

    def ended(self, number: int, outcome: Outcome) -> Record | None:
        """The record with attempt ``number``'s outcome; None when it is recorded already (idempotent:
        the first replica to see the Job end writes it, every later one finds it there)."""
        attempts = list(self.attempts)
        for i, attempt in enumerate(attempts):
            if attempt.number == number:
                if attempt.outcome is not None:
                    return None
                attempts[i] = replace(attempt, outcome=outcome)
                return replace(self, attempts=tuple(attempts))
        return None

    def passed_gate(self, number: int) -> Record | None:
        """The record with the health gate passed after attempt ``number``; None when it says so already."""
        attempts = list(self.attempts)
        for i, attempt in enumerate(attempts):
            if attempt.number == number and not attempt.gate_passed:
                attempts[i] = replace(attempt, gate_passed=True)
                return replace(self, attempts=tuple(attempts))
        return None

    def to_attempts(self) -> list[Attempt]:
        return [
            Attempt(
                a.number,
                None,
                a.token,
                a.outcome,
                a.address or None,
                a.started,
                episode=self.episode,
                expected=a.expected,
                gate_passed=a.gate_passed,
            )
            for a in self.attempts
        ]
