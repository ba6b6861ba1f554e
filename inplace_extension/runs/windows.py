"""Maintenance windows: when a new attempt of an update may start on a Machine (CAPI) or Node (MCM).

A window opens at each time its cron expression names, in its time zone (wall-clock time), and stays
open for its duration in elapsed time, across a daylight-saving change too. A wall-clock time the
change repeats (autumn) opens the window once, at its first occurrence; one the change skips (spring)
opens it at the moment the clocks jump (02:30 on a night that goes from 02:00 to 03:00 opens at 03:30,
as the local time before the change counts on). croniter walks the wall-clock times (naive, so it
never sees a fold); each is then placed in UTC, and every comparison is in UTC elapsed time. A window
with ``labels`` applies only to the Machines (Nodes) carrying all of them; one without applies to all.
A Machine that no window applies to may start any time; otherwise it may start while one of its
windows is open.
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
# How far beyond the moments asked about the wall-clock times are walked near a change of the clocks:
# more than any jump of a zone's clocks (an hour; two in a few zones' history)
WALL_CLOCK_MARGIN_SECONDS: Final = 3 * 3600


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

    def last_start(self, now: datetime) -> datetime | None:
        """The latest start at or before ``now`` whose window may still be open (in UTC): None when no
        start falls within the duration before ``now``. Walks the wall-clock times back from ``now``."""
        zone = ZoneInfo(self.time_zone)
        earliest = now - timedelta(seconds=self.duration_seconds)
        margin = _margin(zone, earliest, now)
        floor = _wall(earliest, zone) - margin
        # croniter's get_prev excludes its start time, and cron starts fall on whole minutes
        walk = croniter(self.cron, _wall(now, zone) + margin + timedelta(seconds=1))
        latest: datetime | None = None
        while True:
            local: datetime = walk.get_prev(datetime)
            if local < floor:
                return latest
            start = _utc(local, zone)
            if earliest <= start <= now and (latest is None or start > latest):
                latest, floor = start, max(floor, local - margin)

    def next_start(self, now: datetime) -> datetime:
        """The first start after ``now`` (in UTC). Walks the wall-clock times on from ``now``."""
        zone = ZoneInfo(self.time_zone)
        margin = timedelta(seconds=WALL_CLOCK_MARGIN_SECONDS)
        walk = croniter(self.cron, _wall(now, zone) - margin)
        first: datetime | None = None
        ceiling: datetime | None = None
        while True:
            local: datetime = walk.get_next(datetime)
            if first is not None and ceiling is not None and local > ceiling:
                return first
            start = _utc(local, zone)
            if start > now and (first is None or start < first):
                first, ceiling = start, local + margin

    def end(self, start: datetime) -> datetime:
        """When the window that opened at ``start`` closes: ``duration_seconds`` of elapsed time later, in
        UTC. Adding them to the local time instead (wall-clock arithmetic) would make a window that spans
        a daylight-saving change an hour shorter or longer than its duration."""
        return start.astimezone(UTC) + timedelta(seconds=self.duration_seconds)

    def is_open(self, now: datetime) -> bool:
        start = self.last_start(now)
        return start is not None and now < self.end(start)


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


def _wall(moment: datetime, zone: ZoneInfo) -> datetime:
    """``moment``'s wall-clock time in ``zone``, naive (croniter walks it without seeing a fold)."""
    return moment.astimezone(zone).replace(tzinfo=None, microsecond=0)


def _utc(local: datetime, zone: ZoneInfo) -> datetime:
    """The moment of the naive wall-clock time ``local`` in ``zone``: fold=0, the first of a time the
    clocks repeat, and for a time they skip, the offset before the jump (02:30 is 03:30 after it)."""
    return local.replace(tzinfo=zone, fold=0).astimezone(UTC)


def _margin(zone: ZoneInfo, begin: datetime, end: datetime) -> timedelta:
    """How far beyond the wall-clock times of ``begin`` and ``end`` a walk must go to see every start
    between them: nothing when the zone's offset is the same around both (wall-clock and UTC times
    differ by a constant), else more than any jump of a zone's clocks."""
    wide = timedelta(seconds=WALL_CLOCK_MARGIN_SECONDS)
    if (begin - wide).astimezone(zone).utcoffset() == (end + wide).astimezone(zone).utcoffset():
        return timedelta(0)
    return wide
