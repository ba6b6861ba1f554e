"""``status``: the live view of a rollout, from the local executor's runs dir (built by the service's own
writers: RunService and the local backend, ansible-runner replaced by the run engine's fake) and from the
management cluster's objects (as the API server returns them). Table and JSON against golden files
(``UPDATE_GOLDEN=1`` writes them anew: read the diff before committing it)."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from hostlab.proc import wait_until
from run_deps import run_service
from runs.fakes import FP, FakeRunner, failed_events, unreachable_events, write_artifacts

from inplace_extension.cli import main
from inplace_extension.cli import status as status_cli
from inplace_extension.runs import runner as runner_mod
from inplace_extension.runs.model import Progress, RunRequest
from inplace_extension.runs.service import RunService
from inplace_extension.settings import Settings

GOLDEN = Path(__file__).parent / "golden"
T0 = 1_800_000_000.0  # 2027-01-15T08:00:00Z
NOW = T0 + 60
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIJAm/+qD5i6Qm8kDm+Qr9ygOJL1jDRtSlh6jlxmhLn0T"
INVENTORY = f"""\
hosts:
  - match: {{name: "m*"}}
    address: 10.79.9.11
    known_hosts: "{KEY}"
defaults: {{user: ansible, private_key_file: /keys/id}}
"""
RETRY_AFTER, BUDGET = 30, 2


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def req(name: str) -> RunRequest:
    return RunRequest(
        namespace="default",
        name=name,
        fingerprint=FP,
        capabilities=("ntp", "kubeadm_files"),
        inputs={"ntp": {"ntp_servers": ["a"]}, "kubeadm_files": {"kubeadm_files_files": []}},
    )


async def settle(svc: RunService, request: RunRequest) -> Progress:
    deadline = time.monotonic() + 10
    while True:
        progress = await svc.poll(request)
        if not progress.in_flight:
            return progress
        assert time.monotonic() < deadline, f"still {progress.message}"
        await anyio.sleep(0.01)


def golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("UPDATE_GOLDEN"):
        path.write_text(text)
    assert text == path.read_text()


@pytest.fixture
def runs_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A runs dir as the service leaves it mid-rollout: m1 done, m2 failed, m3 retrying (unreachable, in
    its backoff), m4 blocked (two unreachable attempts: the budget), m5 running its kubeadm_files step."""
    fake = FakeRunner()
    monkeypatch.setattr(runner_mod, "start", fake.start)
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(INVENTORY)
    settings = Settings(
        inventory=inventory,
        allowed_cidrs=["10.79.9.0/24"],
        runs_dir=tmp_path / "runs",
        retry_after_seconds=RETRY_AFTER,
        max_failed_attempts=BUDGET,
    )
    clock = Clock(T0)
    svc = run_service(settings, clock=clock)
    fake.scripts["m2"] = [lambda run: ("failed", 2, failed_events("ntp", "Restart chrony"))]
    fake.scripts["m3"] = [lambda run: ("unreachable", 4, unreachable_events())]
    fake.scripts["m4"] = [lambda run: ("unreachable", 4, unreachable_events())] * 2

    async def rollout() -> None:
        await settle(svc, req("m4"))
        clock.now = T0 + 31  # past its backoff: the second attempt spends the budget
        await settle(svc, req("m4"))
        clock.now = T0 + 32
        await settle(svc, req("m1"))
        clock.now = T0 + 40
        await settle(svc, req("m2"))
        clock.now = T0 + 50
        await settle(svc, req("m3"))
        clock.now = T0 + 55
        fake.gate = threading.Event()
        await svc.poll(req("m5"))

    try:
        anyio.run(rollout)
        assert wait_until(lambda: fake.count("m5") == 1, 10, 0.01)
        spec = fake.batches[-1]
        host = spec.hosts[0].host_name
        # ansible-runner writes each event as the play goes: m5's play has begun its kubeadm_files step
        started = {"host": host, "role": "kubeadm_files", "task": "Write the kubeadm files"}
        write_artifacts(
            spec.batch_dir, spec.ident, None, None, [{"event": "runner_on_start", "event_data": started}]
        )
        yield settings.runs_dir
    finally:
        if fake.gate is not None:
            fake.gate.set()
        svc.close()


def status(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *args: str) -> str:
    monkeypatch.setattr(status_cli, "clock", lambda: NOW)
    assert main(["status", *args]) == 0
    return capsys.readouterr().out


def test_runs_dir_table_and_json(
    runs_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    flags = ["--runs-dir", str(runs_dir), "--retry-after-seconds", str(RETRY_AFTER)]
    flags += ["--max-failed-attempts", str(BUDGET)]
    table = status(monkeypatch, capsys, *flags)
    golden("status-runs-dir.txt", table.replace(str(runs_dir), "RUNS_DIR"))
    document = status(monkeypatch, capsys, *flags, "-o", "json")
    golden("status-runs-dir.json", document.replace(str(runs_dir), "RUNS_DIR"))
    states = {m["name"]: m["state"] for m in json.loads(document)["machines"]}
    assert states == {"m1": "done", "m2": "failed", "m3": "retrying", "m4": "blocked", "m5": "running"}


def test_runs_dir_missing_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["status", "--runs-dir", str(tmp_path / "none")]) == 2
    assert "--runs-dir" in capsys.readouterr().err
    assert not (tmp_path / "none").exists()  # read-only: nothing created
