"""``plan`` of an UpdateMachine request says when the Machine's maintenance window opens, exactly."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from inplace_extension.hooks.explain import explain_request
from inplace_extension.inplace.custom import NO_CUSTOM
from inplace_extension.runs.windows import MaintenanceWindow, Schedule

from .conftest import load

NIGHTS = MaintenanceWindow(
    "nights", "0 22 * * *", 3600, labels=(("cluster.x-k8s.io/cluster-name", "my-cluster"),)
)
ELSEWHERE = MaintenanceWindow(
    "elsewhere", "0 22 * * *", 3600, labels=(("cluster.x-k8s.io/cluster-name", "x"),)
)
BODY = json.dumps(load("update_machine/6A.request.json")).encode()


def at(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


def test_plan_shows_a_closed_window_and_when_it_opens() -> None:
    lines, ok = explain_request(BODY, NO_CUSTOM, Schedule((NIGHTS,)), at("2026-12-01T12:00:00"))
    assert ok
    assert lines[-1] == 'maintenance window: closed; "nights" opens 2026-12-01T22:00Z'


def test_plan_shows_an_open_window() -> None:
    lines, _ = explain_request(BODY, NO_CUSTOM, Schedule((NIGHTS,)), at("2026-12-01T22:30:00"))
    assert lines[-1] == "maintenance window: open now (an update may start)"


def test_plan_says_nothing_when_no_window_applies_to_the_machine() -> None:
    lines, _ = explain_request(BODY, NO_CUSTOM, Schedule((ELSEWHERE,)), at("2026-12-01T12:00:00"))
    assert not any(line.startswith("maintenance window") for line in lines)
