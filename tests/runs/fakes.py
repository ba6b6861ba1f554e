"""Test doubles for the run engine: artifact files as ansible-runner writes them, and a fake runner.start."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from inplace_extension.plays import runner
from inplace_extension.plays.artifacts import drain_file
from inplace_extension.plays.steps import DRAIN_TASK

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
            "event": "runner_on_ok",
            "event_data": {
                "task": "Write the stamp",
                "task_action": "inplace_host_state",
                "res": {"changed": True, "fingerprint": fingerprint},
            },
        },
        {"event": "playbook_on_stats", "event_data": {}},
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


Script = Callable[[runner.HostRun], tuple[str, int, list[dict[str, Any]]]]


def succeed(run: runner.HostRun) -> tuple[str, int, list[dict[str, Any]]]:
    return "successful", 0, ok_events(run.fingerprint)


def machine_of(run: runner.HostRun) -> str:
    return run.ident.split(".")[1]  # <namespace>.<name>.<fingerprint[:12]>, test names have no dots


@dataclass
class FakeRunner:
    """Stands in for ``runner.start``: writes the artifacts a real batch would and records every host run.

    ``scripts`` maps a Machine name to the outcomes of its successive attempts (default: success).
    ``gate``, when set, holds every batch inside ``wait()`` until the test releases it; ``at_gate`` is set
    once a batch has announced all its tasks and waits there.
    """

    scripts: dict[str, list[Script]] = field(default_factory=dict)
    gate: threading.Event | None = None
    at_gate: threading.Event = field(default_factory=threading.Event)
    started: list[runner.HostRun] = field(default_factory=list)
    batches: list[runner.BatchSpec] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self, spec: runner.BatchSpec, on_task: runner.TaskListener) -> _FakeHandle:
        with self.lock:
            self.batches.append(spec)
            self.started.extend(spec.hosts)
            scripts = []
            for run in spec.hosts:
                queue = self.scripts.get(machine_of(run), [])
                scripts.append(queue.pop(0) if queue else succeed)
        return _FakeHandle(self, spec, scripts, on_task)

    def count(self, name: str) -> int:
        with self.lock:
            return sum(1 for run in self.started if machine_of(run) == name)


class _FakeHandle:
    def __init__(
        self, fake: FakeRunner, spec: runner.BatchSpec, scripts: list[Script], on_task: runner.TaskListener
    ) -> None:
        self.fake, self.spec, self.scripts, self.on_task = fake, spec, scripts, on_task

    def _drained(self, run: runner.HostRun) -> bool:
        return _wait_drained(run, self.on_task)

    def wait(self) -> str:
        stopped = set()
        for run in self.spec.hosts:
            for cap in run.capabilities:
                if cap == run.drain_before and not self._drained(run):
                    stopped.add(run.ident)  # the play stops at its drain point (tasks/drain_point.yml)
                    break
                self.on_task(run.host_name, cap, "Do it")
        if self.fake.gate is not None:
            self.fake.at_gate.set()
            self.fake.gate.wait(30)
        statuses, events = [], []
        for run, script in zip(self.spec.hosts, self.scripts, strict=True):
            status, _, host_events = (
                ("failed", 2, failed_events("update_machine", DRAIN_CHECK))
                if run.ident in stopped
                else script(run)
            )
            statuses.append(status)
            for event in host_events:
                data = dict(event.get("event_data") or {})
                if event["event"] not in ("playbook_on_play_start", "playbook_on_stats"):
                    data["host"] = run.host_name
                events.append({**event, "event_data": data})
        status = "successful" if all(s == "successful" for s in statuses) else "failed"
        write_artifacts(
            self.spec.batch_dir, self.spec.ident, status, 0 if status == "successful" else 2, events
        )
        return status


DRAIN_CHECK = "Drain point, go on only if the Node was drained"


def _wait_drained(run: runner.HostRun, on_task: runner.TaskListener) -> bool:
    """Like the play at its drain point: announce it, then wait for the service's word."""
    on_task(run.host_name, None, DRAIN_TASK)
    deadline = time.monotonic() + 10
    while not drain_file(run.attempt_dir).exists():
        assert time.monotonic() < deadline, "the service never answered the drain point"
        time.sleep(0.01)  # the play polls the file too (once a second)
    return bool(json.loads(drain_file(run.attempt_dir).read_text())["drained"])
