"""Maintenance windows: when a new attempt of an update may start on a Machine (CAPI) or Node (MCM).

A window opens at each time its cron expression names, in its time zone (wall-clock time), and stays
open for its duration in elapsed time, across a daylight-saving change too. A window with ``labels``
applies only to the Machines (Nodes) carrying all of them; one without applies to all. A Machine that
no window applies to may start any time; otherwise it may start while one of its windows is open.
Only the start of an attempt is gated: a play that has started finishes. Pure (the clock is passed
in); the windows come from the capabilities file (``inplace_extension.capabilities_file``) and
:mod:`inplace_extension.runs.service` asks before it starts any new attempt (the first, or a retry).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Final
from zoneinfo import ZoneInfo

from croniter import croniter

from inplace_extension.runs import progress

# The longest retryAfterSeconds while a window is closed: CAPI calls again no later than this, so a
# Machine starts at most this long after its window opened (and a changed schedule is seen as soon).
WINDOW_RETRY_CAP_SECONDS: Final = 300


@dataclass(frozen=True)
class MaintenanceWindow:
    """One window: ``cron`` (5 fields) in ``time_zone`` (IANA name), open ``duration_seconds`` from each
    start; ``labels`` (pairs) a Machine must all carry for the window to apply to it."""

    name: str
    cron: str
    duration_seconds: int
    time_zone: str = "UTC"
    labels: tuple[tuple[str, str], ...] = ()

    def applies_to(self, labels: Mapping[str, str]) -> bool:
        return all(labels.get(key) == value for key, value in self.labels)

    def last_start(self, now: datetime) -> datetime:
        """The latest start at or before ``now`` (croniter's get_prev excludes its start time, and cron
        starts fall on whole minutes: start one second after ``now`` cut to the second)."""
        local = now.astimezone(ZoneInfo(self.time_zone)).replace(microsecond=0) + timedelta(seconds=1)
        start: datetime = croniter(self.cron, local).get_prev(datetime)
        return start

    def next_start(self, now: datetime) -> datetime:
        start: datetime = croniter(self.cron, now.astimezone(ZoneInfo(self.time_zone))).get_next(datetime)
        return start

    def end(self, start: datetime) -> datetime:
        """When the window that opened at ``start`` closes: ``duration_seconds`` of elapsed time later, in
        UTC. Adding them to the local time instead (wall-clock arithmetic) would make a window that spans
        a daylight-saving change an hour shorter or longer than its duration."""
        return start.astimezone(UTC) + timedelta(seconds=self.duration_seconds)

    def is_open(self, now: datetime) -> bool:
        return now < self.end(self.last_start(now))


@dataclass(frozen=True)
class Closed:
    """No window of this Machine is open: the one that opens first, and when (epoch seconds)."""

    window: str
    opens: float

    @property
    def when(self) -> str:
        """The opening in UTC, to the minute: ``2026-12-01T22:00Z``."""
        return datetime.fromtimestamp(self.opens, UTC).strftime("%Y-%m-%dT%H:%MZ")

    def message(self) -> str:
        return progress.window(self.window, self.when)

    def retry_after(self, now: float) -> int:
        """retryAfterSeconds: until the window opens, at most :data:`WINDOW_RETRY_CAP_SECONDS`."""
        return max(1, min(WINDOW_RETRY_CAP_SECONDS, math.ceil(self.opens - now)))


@dataclass(frozen=True)
class Schedule:
    """All configured windows; :data:`NO_WINDOWS` when the capabilities file has none."""

    windows: tuple[MaintenanceWindow, ...] = ()

    def applies(self, labels: Mapping[str, str]) -> bool:
        """Whether any window applies to a Machine with ``labels`` (else it may start any time)."""
        return any(window.applies_to(labels) for window in self.windows)

    def closed(self, labels: Mapping[str, str], now: float) -> Closed | None:
        """None when an update of a Machine with ``labels`` may start at ``now``, else what it waits for."""
        mine = [window for window in self.windows if window.applies_to(labels)]
        if not mine:
            return None
        moment = datetime.fromtimestamp(now, UTC)
        if any(window.is_open(moment) for window in mine):
            return None
        opens = {window.name: window.next_start(moment).timestamp() for window in mine}
        first = min(mine, key=lambda window: (opens[window.name], window.name))
        return Closed(first.name, opens[first.name])


NO_WINDOWS: Final = Schedule()
