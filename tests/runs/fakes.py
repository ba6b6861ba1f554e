"""Test doubles for the run engine: artifact files as ansible-runner writes them, and a fake runner.start."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from extension.runs import runner

FP = "ab" * 32


def write_artifacts(
    attempt_dir: Path, ident: str, status: str | None, rc: int | None, events: list[dict[str, Any]]
) -> None:
    """Write ``artifacts/<ident>/{status,rc,job_events/*.json}`` the way ansible-runner 2.4 lays them out."""
    art = attempt_dir / "artifacts" / ident
    (art / "job_events").mkdir(parents=True, exist_ok=True)
    if status is not None:
        (art / "status").write_text(status)
    if rc is not None:
        (art / "rc").write_text(str(rc))
    for counter, event in enumerate(events, 1):
        body = {"counter": counter, "uuid": f"u{counter}", **event}
        (art / "job_events" / f"{counter}-u{counter}.json").write_text(json.dumps(body))


def ok_events(fingerprint: str) -> list[dict[str, Any]]:
    return [
        {"event": "playbook_on_play_start", "event_data": {}},
        {"event": "runner_on_ok", "event_data": {"role": "ntp", "task": "Write config"}},
        {
            "event": "playbook_on_stats",
            "event_data": {"artifact_data": {"update_machine_stamp": fingerprint}},
        },
    ]


def failed_events(role: str, task: str) -> list[dict[str, Any]]:
    return [
        {"event": "playbook_on_play_start", "event_data": {}},
        {"event": "runner_on_failed", "event_data": {"role": "x", "task": "ignored", "ignore_errors": True}},
        {"event": "runner_on_failed", "event_data": {"role": role, "task": task, "res": {"msg": "secret"}}},
        {"event": "playbook_on_stats", "event_data": {}},
    ]


def unreachable_events() -> list[dict[str, Any]]:
    return [
        {"event": "playbook_on_play_start", "event_data": {}},
        {"event": "runner_on_unreachable", "event_data": {"task": "Read stamp"}},
        {"event": "playbook_on_stats", "event_data": {}},
    ]


Script = Callable[[runner.RunSpec], tuple[str, int, list[dict[str, Any]]]]


def succeed(spec: runner.RunSpec) -> tuple[str, int, list[dict[str, Any]]]:
    return "successful", 0, ok_events(spec.fingerprint)


@dataclass
class FakeRunner:
    """Stands in for ``runner.start``: writes the artifacts a real run would and records every spec.

    ``scripts`` maps a Machine name to the outcomes of its successive attempts (default: success).
    ``gate``, when set, holds every run inside ``wait()`` until the test releases it.
    """

    scripts: dict[str, list[Script]] = field(default_factory=dict)
    gate: threading.Event | None = None
    started: list[runner.RunSpec] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self, spec: runner.RunSpec, on_task: runner.TaskListener) -> _FakeHandle:
        with self.lock:
            self.started.append(spec)
            queue = self.scripts.get(spec.host_name, [])
            script = queue.pop(0) if queue else succeed
        return _FakeHandle(self, spec, script, on_task)

    def count(self, host_name: str) -> int:
        with self.lock:
            return sum(1 for s in self.started if s.host_name == host_name)


class _FakeHandle:
    def __init__(
        self,
        fake: FakeRunner,
        spec: runner.RunSpec,
        script: Script,
        on_task: runner.TaskListener,
    ) -> None:
        self.fake, self.spec, self.script, self.on_task = fake, spec, script, on_task

    def wait(self) -> str:
        for cap in self.spec.capabilities:
            self.on_task(cap, "Do it")
        if self.fake.gate is not None:
            self.fake.gate.wait(30)
        status, rc, events = self.script(self.spec)
        write_artifacts(self.spec.attempt_dir, self.spec.ident, status, rc, events)
        return status
