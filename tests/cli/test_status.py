"""``status``: the live view of a rollout, from the local executor's runs dir (built by the service's own
writers: RunService and the local backend, ansible-runner replaced by the run engine's fake) and from the
management cluster's objects (as the API server returns them). Table and JSON against golden files
(``UPDATE_GOLDEN=1`` writes them anew: read the diff before committing it)."""

from __future__ import annotations

import ast
import json
import os
import threading
import time
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import pytest
from hostlab.proc import wait_until
from run_deps import run_service
from runs.fakes import FP, FakeRunner, failed_events, unreachable_events, write_artifacts

import inplace_extension
from inplace_extension.cli import main
from inplace_extension.cli import status as status_cli
from inplace_extension.kube.events import machine_event, to_event
from inplace_extension.kube.rollout import Owner, Snapshot
from inplace_extension.kubejobs.record import RECORD_ANNOTATION, Record, Recorded
from inplace_extension.plays import runner as runner_mod
from inplace_extension.rollout.cluster import REASONS
from inplace_extension.rollout.model import timestamp
from inplace_extension.runs.attempts import Outcome, OutcomeKind
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


# -- the cluster view ------------------------------------------------------------------------------------


def ts(offset: float) -> str:
    return timestamp(T0 + offset) or ""


def machine(
    name: str,
    *,
    updating: tuple[str, str, float] | None = None,
    up_to_date: bool = True,
    record: Record | None = None,
    deployment: str = "md-0",
) -> dict[str, Any]:
    """A v1beta2 Machine of a MachineDeployment as the API server returns it: CAPI's conditions, and the
    ``kubernetes`` executor's record annotation written by its own encoder."""
    conditions = [
        {
            "type": "UpToDate",
            "status": "True" if up_to_date else "False",
            "reason": "UpToDate" if up_to_date else "NotUpToDate",
            "message": "" if up_to_date else "* Version v1.33.1, v1.34.0 required",
            "lastTransitionTime": ts(-600),
        }
    ]
    if updating is not None:
        status, reason, since = updating
        conditions.append(
            {
                "type": "Updating",
                "status": status,
                "reason": reason,
                "message": "",
                "lastTransitionTime": ts(since),
            }
        )
    annotations = {} if record is None else {RECORD_ANNOTATION: record.encode()}
    return {
        "apiVersion": "cluster.x-k8s.io/v1beta2",
        "kind": "Machine",
        "metadata": {
            "name": name,
            "namespace": "default",
            "labels": {"cluster.x-k8s.io/deployment-name": deployment},
            "annotations": annotations,
            "ownerReferences": [{"kind": "MachineSet", "name": f"{deployment}-x7k2p", "controller": True}],
        },
        "status": {"conditions": conditions},
    }


def event(machine_name: str, reason: str, message: str, offset: float, version: int) -> dict[str, Any]:
    """One of the service's Events on a Machine, as the API server returns what kube/events.py posted."""
    posted = machine_event(
        "default", machine_name, None, f"default.{machine_name}.{FP[:12]}", "Normal", reason, message
    )
    body = to_event(posted, datetime.fromtimestamp(T0 + offset, UTC)).to_dict()
    body["metadata"]["resourceVersion"] = str(version)
    body["lastTimestamp"] = ts(offset)  # as the API server returns it: RFC 3339
    body["firstTimestamp"] = ts(offset)
    return body


def attempt(
    number: int, started: float, address: str, outcome: Outcome | None, gate: bool = False
) -> Recorded:
    return Recorded(number, "", "lock", T0 + started, address, f"inplace-job-{number}", outcome, 0.0, gate)


def rollout_objects() -> Snapshot:
    """MachineDeployment default/md-0 mid-rollout: one Machine of each state the cluster can tell."""
    ident = f"default.md-0-%s.{FP[:12]}"
    ok = Outcome(OutcomeKind.SUCCESSFUL, finished=T0 + 30)
    unreachable = [Outcome(OutcomeKind.UNREACHABLE, finished=T0 + t) for t in (20, 40)]
    machines = (
        # done: applied and its gate passed (the record), CAPI's update over
        machine(
            "md-0-a",
            updating=("False", "NotUpdating", 35),
            record=Record(ident % "a", (attempt(1, 5, "10.0.0.1", ok, gate=True),), episode="e1"),
        ),
        # running kubelet_args: its Job plays (the record), the step by the service's last Event
        machine(
            "md-0-b",
            updating=("True", "InPlaceUpdating", 10),
            record=Record(ident % "b", (attempt(1, 12, "10.0.0.2", None),), episode="e1"),
        ),
        machine("md-0-c", updating=("True", "InPlaceUpdating", 15)),  # outside its maintenance window
        machine("md-0-d", updating=("True", "InPlaceUpdating", 15)),  # paused on the MachineDeployment
        machine("md-0-e", updating=("True", "InPlaceUpdating", 16)),  # queued for a run slot
        # pending: CAPI has not begun its update; an earlier rollout's Done says nothing of this one
        machine("md-0-f", up_to_date=False),
        # blocked: two unreachable attempts spent the budget of 2
        machine(
            "md-0-g",
            updating=("True", "InPlaceUpdating", 8),
            record=Record(
                ident % "g",
                (attempt(1, 10, "10.0.0.7", unreachable[0]), attempt(2, 35, "10.0.0.7", unreachable[1])),
                episode="e1",
            ),
        ),
        # failed: a task failed (the local executor: no record, the service's Failed Event)
        machine("md-0-h", updating=("True", "InPlaceUpdateFailed", 9)),
    )
    window = 'waiting for maintenance window "nightly" (opens 2027-01-15T22:00Z)'
    paused = "paused by MachineDeployment default/md-0 (annotation inplace-extension.io/pause)"
    events = (
        event("md-0-a", "Queued", "queued", 4, 101),
        event("md-0-a", "Started", "started on host 10.0.0.1 (inventory)", 5, 102),
        event("md-0-a", "Running", "running: ntp", 6, 103),
        event("md-0-a", "Done", "update applied", 31, 140),
        event("md-0-b", "Queued", "queued", 11, 110),
        event("md-0-b", "Started", "started on host 10.0.0.2 (inventory)", 12, 111),
        event("md-0-b", "Running", "running: ntp", 20, 120),
        event("md-0-b", "Running", "running: kubelet_args", 20, 121),  # the same second: the later one
        event("md-0-c", "Waiting", window, 15, 130),
        event("md-0-d", "Waiting", paused, 16, 131),
        event("md-0-e", "Queued", "queued", 17, 132),
        event("md-0-f", "Done", "update applied", -3600, 10),  # the rollout before this one
        event("md-0-h", "Queued", "queued", 9, 115),
        event("md-0-h", "Failed", 'ntp: task "Restart chrony" failed on host', 25, 125),
    )
    return Snapshot(machines, events)


class FakeReader:
    """Stands in for kube/rollout.py's reader: the objects as the API server would return them."""

    def __init__(self, *snapshots: Snapshot) -> None:
        self.snapshots = snapshots
        self.closed = False

    async def owner_exists(self, owner: Owner) -> bool:
        return owner == Owner("MachineDeployment", "default", "md-0")

    async def snapshot(self, owner: Owner) -> Snapshot:
        return self.snapshots[0]

    async def watch(self, owner: Owner) -> AsyncIterator[Snapshot]:
        for snapshot in self.snapshots:
            yield snapshot

    async def close(self) -> None:
        self.closed = True


def cluster_flags() -> list[str]:
    return ["md/md-0", "--retry-after-seconds", str(RETRY_AFTER), "--max-failed-attempts", str(BUDGET)]


def test_cluster_table_and_json(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    reader = FakeReader(rollout_objects())
    monkeypatch.setattr(status_cli, "connect_rollout", lambda kubeconfig: reader)
    table = status(monkeypatch, capsys, *cluster_flags())
    golden("status-cluster.txt", table)
    document = status(monkeypatch, capsys, *cluster_flags(), "-o", "json")
    golden("status-cluster.json", document)
    states = {m["name"]: (m["state"], m["step"]) for m in json.loads(document)["machines"]}
    assert states == {
        "md-0-a": ("done", None),
        "md-0-b": ("running", "kubelet_args"),
        "md-0-c": ("waiting", None),
        "md-0-d": ("paused", None),
        "md-0-e": ("queued", None),
        "md-0-f": ("pending", None),
        "md-0-g": ("blocked", None),
        "md-0-h": ("failed", None),
    }
    assert reader.closed


def test_cluster_owner_not_found(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    reader = FakeReader(rollout_objects())
    monkeypatch.setattr(status_cli, "connect_rollout", lambda kubeconfig: reader)
    assert main(["status", "kcp/md-0"]) == 2
    assert capsys.readouterr().err == "inplace-extension: KubeadmControlPlane default/md-0: not found\n"
    assert main(["status", "deployment/md-0"]) == 2
    assert "give KIND/NAME, KIND one of md, ms, kcp, cluster" in capsys.readouterr().err


def test_every_reason_the_service_posts_says_a_state() -> None:
    """A reason added to the service's Machine Events (a ``state(request, "Reason", ...)`` call) must say a
    state here, or ``status`` would show its Machine as unknown."""
    posted = set()
    for path in (Path(inplace_extension.__file__).parent).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "state"
                and len(node.args) >= 2
                and isinstance(node.args[1], ast.Constant)
            ):
                posted.add(node.args[1].value)
    assert posted and posted <= set(REASONS), posted - set(REASONS)


def test_watch_redraws_once_per_change(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--watch`` draws what each snapshot of the watch says, once per snapshot (the reader's watch
    yields one per change: tests/kube/test_kube_rollout.py), one after the other off a terminal."""
    before = rollout_objects()
    ok = Outcome(OutcomeKind.SUCCESSFUL, finished=T0 + 50)
    b_done = machine(
        "md-0-b",
        updating=("False", "NotUpdating", 52),
        record=Record(
            f"default.md-0-b.{FP[:12]}", (attempt(1, 12, "10.0.0.2", ok, gate=True),), episode="e1"
        ),
    )
    after = Snapshot(
        tuple(b_done if m["metadata"]["name"] == "md-0-b" else m for m in before.machines),
        (*before.events, event("md-0-b", "Done", "update applied", 51, 150)),
    )
    monkeypatch.setattr(status_cli, "connect_rollout", lambda kubeconfig: FakeReader(before, after))
    drawn = status(monkeypatch, capsys, *cluster_flags(), "--watch").split("\n\n")
    assert len(drawn) == 2
    assert [line.split()[:2] for line in drawn[0].splitlines() if "md-0-b" in line] == [
        ["├─Machine/md-0-b", "running"]
    ]
    assert [line.split()[:2] for line in drawn[1].splitlines() if "md-0-b" in line] == [
        ["├─Machine/md-0-b", "done"]
    ]
    assert drawn[1].splitlines()[-1].startswith("[#######.......................] 2/8 done")


def test_the_walk_through_shows_the_table_status_draws() -> None:
    """docs/operations.md's walk-through shows the very table the golden test holds (kept in step)."""
    walk_through = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text()
    assert (GOLDEN / "status-cluster.txt").read_text() in walk_through


def test_a_play_that_died_unsummarised_and_one_being_summarised(tmp_path: Path) -> None:
    """Attempts without ``outcome.json``: a play whose processes are gone (its lease free: the service
    died with it) is retried at the next poll; a play with a final status is being summarised."""
    from inplace_extension.plays.artifacts import PLAY_LEASE, BatchRef, write_json
    from inplace_extension.rollout.local import INTERRUPTED, NOT_SUMMARISED, machine_status
    from inplace_extension.runs.attempts import Attempt

    batch = tmp_path / "batch-1"
    batch.mkdir()
    (batch / PLAY_LEASE).write_text("0")  # nobody holds it: the play's processes are gone
    attempt_dir = tmp_path / "attempt-0001"
    attempt_dir.mkdir()
    write_json(attempt_dir / "meta.json", BatchRef(batch, "batch-1", "default.m1.x").to_meta())
    dead = Attempt(1, attempt_dir, "", None, "10.0.0.1", T0)
    died = machine_status("default", "m1", [dead], NOW, RETRY_AFTER, BUDGET)
    assert (died.state.value, died.message, died.attempt) == ("retrying", INTERRUPTED, 1)
    ended = Attempt(1, attempt_dir, "", Outcome(OutcomeKind.INTERRUPTED, finished=T0 + 5), "10.0.0.1", T0)
    summarising = machine_status("default", "m1", [ended], NOW, RETRY_AFTER, BUDGET)
    assert (summarising.state.value, summarising.step, summarising.message) == (
        "running",
        "finishing",
        NOT_SUMMARISED,
    )
