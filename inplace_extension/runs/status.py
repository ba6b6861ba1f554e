"""Where the updates polled lately stand, for the operator's metrics and alerts.

Fed by :class:`inplace_extension.runs.service.RunService` with every answer it gives: in progress
(started: since its first attempt started), waiting (and why), blocked (its retry budget spent) or
failed; done updates leave. An update waiting before its first attempt (for its window, a pause or a
health check) has not started: it counts as waiting, not into the oldest update's age. Memory only,
like every cache of the service: after a restart the first answer for each update fills it in again,
and the start of a running update comes from its first attempt on disk. An update nobody asked about
for :data:`STATUS_TTL_SECONDS` is dropped: CAPI (and the MCM agent) stopped asking, so its Machine is
gone or no longer updating.
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


@dataclass
class _Entry:
    state: ProgressState
    waiting: WaitReason | None
    blocked: bool
    # the update's start: its first attempt's; queued with no attempt on disk yet, the first answer that
    # said so; None while it waits before its first attempt (not started)
    since: float | None
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
            since: float | None = started
            if since is None and answer.waiting is None:  # queued or starting: its attempt is not on disk yet
                since = entry.since if entry is not None and entry.since is not None else now
            self._entries[ident] = _Entry(answer.state, answer.waiting, answer.blocked, since, now)

    def counts(self) -> UpdateCounts:
        now = self._clock()
        with self._lock:
            for ident in [i for i, e in self._entries.items() if now - e.seen > self._ttl]:
                del self._entries[ident]
            entries = list(self._entries.values())
        waiting = Counter(e.waiting for e in entries if e.waiting is not None)
        # started and not done: running, retrying (also waiting for its next attempt's window, pause or
        # health check), or in its health gate; not an update that waits for its first attempt
        started = [e.since for e in entries if e.state is ProgressState.IN_PROGRESS and e.since is not None]
        return UpdateCounts(
            waiting={reason: waiting[reason] for reason in get_args(WaitReason)},
            blocked=sum(1 for e in entries if e.state is ProgressState.FAILED and e.blocked),
            failed=sum(1 for e in entries if e.state is ProgressState.FAILED and not e.blocked),
            oldest_update_seconds=max((now - since for since in started), default=0.0),
        )
