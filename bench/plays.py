"""Module executions per host, per role and per play, counted from ansible-runner job events.

Each task result on a host costs the controller a worker fork and templating; a task whose action runs
a module on the host also costs an SSH round trip and a Python start there (about half a
second each on lab hosts). This module counts both from the ``job_events/*.json`` of a play:

- ``tasks``: task results on the host (loop items counted one by one, handlers included; skipped tasks
  are counted apart, they cost the controller little);
- ``remote``: those whose action runs on the host (everything but the controller-side actions below).
  An action plugin may run more than one module per task (``copy`` runs ``stat`` and then ``copy`` or
  ``file``); the events cannot show that, so ``remote`` is a lower bound for such tasks.

Used by bench/update.py (printed per role for one update) and by nothing in the service.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# actions that run on the controller only (no SSH round trip, no Python on the host)
CONTROLLER_ACTIONS = frozenset(
    {
        "assert",
        "debug",
        "fail",
        "meta",
        "set_fact",
        "set_stats",
        "include_role",
        "include_tasks",
        "import_role",
        "import_tasks",
        "include_vars",
        "validate_argument_spec",
        "add_host",
        "group_by",
        "pause",
    }
)
RESULT_EVENTS = ("runner_on_ok", "runner_on_failed", "runner_on_unreachable")
ITEM_EVENTS = ("runner_item_on_ok", "runner_item_on_failed")
PLAY = "(play)"  # the "role" of the playbook's own tasks


@dataclass
class Count:
    tasks: int = 0
    remote: int = 0
    changed: int = 0
    failed: int = 0
    skipped: int = 0

    def add(self, other: Count) -> None:
        self.tasks += other.tasks
        self.remote += other.remote
        self.changed += other.changed
        self.failed += other.failed
        self.skipped += other.skipped


def _action(data: Mapping[str, Any]) -> str:
    return str(data.get("resolved_action") or data.get("task_action") or "").rsplit(".", 1)[-1]


def count(events: Iterable[Mapping[str, Any]], host: str) -> dict[str, Count]:
    """Executions on ``host`` by role, in the order roles first ran (``PLAY`` for the playbook's tasks)."""
    by_role: dict[str, Count] = {}
    events = [e for e in events if (e.get("event_data") or {}).get("host") == host]
    looped = {e["event_data"].get("task_uuid") for e in events if e.get("event") in ITEM_EVENTS}
    for event in events:
        kind, data = str(event.get("event")), event["event_data"]
        one = Count()
        if kind == "runner_on_skipped":
            one.skipped = 1
        elif kind in ITEM_EVENTS or (kind in RESULT_EVENTS and data.get("task_uuid") not in looped):
            res = data.get("res") or {}
            if res.get("skipped"):
                one.skipped = 1
            else:
                one.tasks = 1
                one.remote = int(_action(data) not in CONTROLLER_ACTIONS)
                one.changed = int(bool(res.get("changed")))
                one.failed = int(kind.endswith("failed") or kind.endswith("unreachable"))
        else:
            continue
        by_role.setdefault(str(data.get("role") or PLAY), Count()).add(one)
    return by_role


def read_events(artifacts: Path) -> list[dict[str, Any]]:
    """The job events of one artifacts dir (``<private_data_dir>/artifacts/<ident>``), in order."""
    events = []
    for path in (artifacts / "job_events").glob("*.json"):
        try:
            events.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    return sorted(events, key=lambda e: int(e.get("counter", 0)))


def total(by_role: Mapping[str, Count]) -> Count:
    out = Count()
    for one in by_role.values():
        out.add(one)
    return out


def render(by_role: Mapping[str, Count], indent: str = "  ") -> list[str]:
    """One line per role and one for the whole play: tasks, remote executions, changed, skipped."""
    rows = [*by_role.items(), ("whole play", total(by_role))]
    return [
        f"{indent}{role:<22} tasks {c.tasks:3d}  on host {c.remote:3d}  changed {c.changed:3d}"
        f"  skipped {c.skipped:3d}" + (f"  failed {c.failed}" if c.failed else "")
        for role, c in rows
    ]
