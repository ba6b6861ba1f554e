"""Maintenance windows as a pure function of the labels and the clock: exact times, time zones, scope."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from inplace_extension.runs.windows import (
    NO_WINDOWS,
    WINDOW_RETRY_CAP_SECONDS,
    Closed,
    MaintenanceWindow,
    Schedule,
)

WEEKNIGHTS = MaintenanceWindow("weeknights", "0 22 * * 1-5", 4 * 3600)
PROD = (("cluster.x-k8s.io/cluster-name", "prod"),)


def at(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


def test_no_window_means_any_time() -> None:
    assert NO_WINDOWS.closed({}, at("2026-12-01T12:00:00")) is None


@pytest.mark.parametrize(
    ("now", "open_"),
    [
        ("2026-12-01T21:59:59", False),  # Tuesday, one second early
        ("2026-12-01T22:00:00", True),  # the first second
        ("2026-12-02T01:59:59", True),  # past midnight, still inside the 4 hours
        ("2026-12-02T02:00:00", False),  # closed at start + duration
        ("2026-12-05T23:00:00", False),  # Saturday: no start on the day, Friday's window ended at 02:00
    ],
)
def test_open_from_each_start_for_the_duration(now: str, open_: bool) -> None:
    closed = Schedule((WEEKNIGHTS,)).closed({}, at(now))
    assert (closed is None) is open_


def test_closed_names_the_window_and_when_it_opens() -> None:
    closed = Schedule((WEEKNIGHTS,)).closed({}, at("2026-12-01T12:00:00"))
    assert closed == Closed("weeknights", at("2026-12-01T22:00:00"))
    assert closed.message() == 'waiting for maintenance window "weeknights" (opens 2026-12-01T22:00Z)'


def test_retry_after_is_the_time_to_the_start_capped() -> None:
    closed = Closed("w", at("2026-12-01T22:00:00"))
    assert closed.retry_after(at("2026-12-01T21:58:30")) == 90
    assert closed.retry_after(at("2026-12-01T21:59:59.5")) == 1
    assert closed.retry_after(at("2026-12-01T12:00:00")) == WINDOW_RETRY_CAP_SECONDS


def test_the_time_zone_moves_the_start_with_daylight_saving_time() -> None:
    berlin = Schedule((MaintenanceWindow("night", "0 2 * * *", 3600, "Europe/Berlin"),))
    # winter: 02:00 CET is 01:00Z; summer: 02:00 CEST is 00:00Z
    assert berlin.closed({}, at("2026-12-01T01:30:00")) is None
    assert berlin.closed({}, at("2026-07-01T00:30:00")) is None
    closed = berlin.closed({}, at("2026-07-01T01:30:00"))
    assert closed is not None and closed.message().endswith("(opens 2026-07-02T00:00Z)")


def test_windows_with_labels_apply_only_to_machines_carrying_them() -> None:
    prod_only = MaintenanceWindow("prod-nights", "0 22 * * *", 3600, labels=PROD)
    schedule = Schedule((prod_only,))
    noon = at("2026-12-01T12:00:00")
    assert schedule.closed({"cluster.x-k8s.io/cluster-name": "dev"}, noon) is None
    assert schedule.closed({}, noon) is None
    closed = schedule.closed({"cluster.x-k8s.io/cluster-name": "prod", "other": "x"}, noon)
    assert closed is not None and closed.window == "prod-nights"


def test_any_open_window_of_the_machine_lets_it_start_else_the_earliest_is_named() -> None:
    late = MaintenanceWindow("late", "0 23 * * *", 3600)
    early = MaintenanceWindow("early", "0 21 * * *", 1800)
    schedule = Schedule((late, early))
    assert schedule.closed({}, at("2026-12-01T23:30:00")) is None  # late is open
    assert schedule.closed({}, at("2026-12-01T21:10:00")) is None  # early is open
    closed = schedule.closed({}, at("2026-12-01T21:45:00"))
    assert closed == Closed("late", at("2026-12-01T23:00:00"))
    closed = schedule.closed({}, at("2026-12-01T12:00:00"))
    assert closed == Closed("early", at("2026-12-01T21:00:00"))


@pytest.mark.parametrize(
    ("zone", "cron", "opens"),
    [
        # the night the clocks go forward an hour: 01:00 CET is 00:00Z, and 02:00 becomes 03:00 CEST
        ("Europe/Berlin", "0 1 * * *", "2026-03-29T00:00:00"),
        # the night they go back: 01:00 CEST is 23:00Z the day before, and 03:00 CEST becomes 02:00 CET
        ("Europe/Berlin", "0 1 * * *", "2026-10-24T23:00:00"),
        # 01:00 EST is 06:00Z, and 02:00 becomes 03:00 EDT
        ("America/New_York", "0 1 * * *", "2026-03-08T06:00:00"),
        # 00:00 EDT is 04:00Z, and 02:00 EDT becomes 01:00 EST
        ("America/New_York", "0 0 * * *", "2026-11-01T04:00:00"),
    ],
    ids=["berlin-spring", "berlin-autumn", "new-york-spring", "new-york-autumn"],
)
def test_a_window_across_a_daylight_saving_change_lasts_its_duration_in_elapsed_time(
    zone: str, cron: str, opens: str
) -> None:
    """A 4 h window spanning the change stays open exactly 4 h of real time: not 3 h (spring, as adding
    4 h to the local start time would give) nor 5 h (autumn)."""
    window = MaintenanceWindow("night", cron, 4 * 3600, zone)
    schedule = Schedule((window,))
    start = at(opens)
    assert schedule.closed({}, start - 1) is not None
    assert schedule.closed({}, start) is None
    assert schedule.closed({}, start + 4 * 3600 - 1) is None, "closed early (wall-clock arithmetic)"
    closed = schedule.closed({}, start + 4 * 3600)
    assert closed is not None, "still open after 4 h of real time"
    assert closed.opens - start in (23 * 3600, 24 * 3600, 25 * 3600)  # the next night's start
    last = window.last_start(datetime.fromtimestamp(start + 3600, UTC))
    assert last is not None
    assert (last.timestamp(), window.end(last).timestamp() - last.timestamp()) == (start, 4 * 3600)


@pytest.mark.parametrize(
    ("zone", "cron", "opens"),
    [
        # Berlin, 2026-10-25: 03:00 CEST becomes 02:00 CET, so 02:00-02:59 happen twice (00:00Z and 01:00Z)
        ("Europe/Berlin", "30 2 * * *", "2026-10-25T00:30:00"),  # inside the repeated hour: its first pass
        ("Europe/Berlin", "0 2 * * *", "2026-10-25T00:00:00"),  # its first minute
        ("Europe/Berlin", "59 2 * * *", "2026-10-25T00:59:00"),  # its last minute
        ("Europe/Berlin", "30 1 * * *", "2026-10-24T23:30:00"),  # before it (CEST)
        ("Europe/Berlin", "30 3 * * *", "2026-10-25T02:30:00"),  # after it (CET)
        # New York, 2026-11-01: 02:00 EDT becomes 01:00 EST, so 01:00-01:59 happen twice (05:00Z and 06:00Z)
        ("America/New_York", "30 1 * * *", "2026-11-01T05:30:00"),
        ("America/New_York", "0 1 * * *", "2026-11-01T05:00:00"),
        ("America/New_York", "30 0 * * *", "2026-11-01T04:30:00"),
        ("America/New_York", "30 2 * * *", "2026-11-01T07:30:00"),
        # Berlin, 2026-03-29: 02:00 CET becomes 03:00 CEST; a start in the skipped hour opens as the
        # clocks jump, as the time before the change counts on (02:30 CET would be 01:30Z)
        ("Europe/Berlin", "30 2 * * *", "2026-03-29T01:30:00"),
        ("Europe/Berlin", "0 2 * * *", "2026-03-29T01:00:00"),
        ("Europe/Berlin", "30 1 * * *", "2026-03-29T00:30:00"),
        ("Europe/Berlin", "30 3 * * *", "2026-03-29T01:30:00"),
        # New York, 2026-03-08: 02:00 EST becomes 03:00 EDT
        ("America/New_York", "30 2 * * *", "2026-03-08T07:30:00"),
        ("America/New_York", "30 1 * * *", "2026-03-08T06:30:00"),
        ("America/New_York", "30 3 * * *", "2026-03-08T07:30:00"),
    ],
)
def test_a_window_starting_around_a_changed_hour_is_open_once_for_its_duration_without_a_gap(
    zone: str, cron: str, opens: str
) -> None:
    """Open from its first start for exactly 4 h of elapsed time, and at no other moment of the night:
    no gap in the repeated hour, no second start that keeps it open an hour late."""
    schedule = Schedule((MaintenanceWindow("night", cron, 4 * 3600, zone),))
    start, end = at(opens), at(opens) + 4 * 3600
    for moment in (start - 1, end):
        closed = schedule.closed({}, moment)
        assert closed is not None, f"open at {datetime.fromtimestamp(moment, UTC)}"
    first = schedule.closed({}, start - 1)
    assert first is not None and first.opens == start
    # every 5 minutes from 6 h before to 10 h after the start (one extra second past each)
    for minute in range(-6 * 60, 10 * 60, 5):
        moment = start + minute * 60 + 1
        expected = start <= moment < end
        assert (schedule.closed({}, moment) is None) is expected, (
            f"{'closed' if expected else 'open'} at {datetime.fromtimestamp(moment, UTC)}"
        )
    after = schedule.closed({}, end)
    assert after is not None and after.opens - start in (23 * 3600, 24 * 3600, 25 * 3600)
