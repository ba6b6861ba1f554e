"""Where the updates polled lately stand, for the operator's metrics and alerts.

Fed by :class:`inplace_extension.runs.service.RunService` with every answer it gives: in progress
(since its first attempt started, or since it was first asked about), waiting (and why), blocked (its
retry budget spent) or failed; done updates leave. Memory only, like every cache of the service: after a
restart the first answer for each update fills it in again, and the start of a running update comes
from its first attempt on disk. An update nobody asked about for :data:`STATUS_TTL_SECONDS` is
dropped: CAPI (and the MCM agent) stopped asking, so its Machine is gone or no longer updating.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, get_args

from inplace_extension.metrics import UpdateCounts, WaitReason
from inplace_extension.runs.model import Progress, ProgressState

# CAPI asks again after retryAfterSeconds (at most 300 s from us) or, after a Failure, with its
# controller's backoff (up to about 17 minutes): half an hour without a poll means nobody asks.
STATUS_TTL_SECONDS: Final = 1800
NOT_STARTED: Final[frozenset[WaitReason]] = frozenset({"window", "pause"})


@dataclass
class _Entry:
    state: ProgressState
    waiting: WaitReason | None
    blocked: bool
    since: float  # the update's start (its first attempt), or when it was first asked about
    seen: float  # the last answer


class StatusBoard:
    """Thread-safe: answers are recorded from the event loop, counts read at scrape time."""

    def __init__(self, clock: Callable[[], float], ttl: float = STATUS_TTL_SECONDS) -> None:
        self._clock = clock
        self._ttl = ttl
        self._lock = threading.Lock()
        self._entries: dict[str, _Entry] = {}

    def record(self, ident: str, answer: Progress, started: float | None) -> None:
        """The answer just given for ``ident``; ``started``: when its first attempt started, if any."""
        now = self._clock()
        with self._lock:
            if answer.state is ProgressState.DONE:
                self._entries.pop(ident, None)
                return
            entry = self._entries.get(ident)
            since = entry.since if entry is not None else now
            if started is not None:
                since = min(since, started)
            self._entries[ident] = _Entry(answer.state, answer.waiting, answer.blocked, since, now)

    def counts(self) -> UpdateCounts:
        now = self._clock()
        with self._lock:
            for ident in [i for i, e in self._entries.items() if now - e.seen > self._ttl]:
                del self._entries[ident]
            entries = list(self._entries.values())
        waiting = Counter(e.waiting for e in entries if e.waiting is not None)
        # started and not done: running, retrying, or in its health gate (not: waiting to start)
        started = [
            e.since for e in entries if e.state is ProgressState.IN_PROGRESS and e.waiting not in NOT_STARTED
        ]
        return UpdateCounts(
            waiting={reason: waiting[reason] for reason in get_args(WaitReason)},
            blocked=sum(1 for e in entries if e.state is ProgressState.FAILED and e.blocked),
            failed=sum(1 for e in entries if e.state is ProgressState.FAILED and not e.blocked),
            oldest_update_seconds=max((now - since for since in started), default=0.0),
        )
