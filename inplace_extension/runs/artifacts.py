"""The runs directory on disk: attempt directories, ansible-runner artifacts, and what an attempt ended as.

Layout: ``<runs_dir>/<ident>/attempt-0001/{meta.json, inputs.json, known_hosts, outcome.json}`` per
Machine attempt; ``<runs_dir>/.batches/<batch>/artifacts/<batch>/`` is the ansible-runner private data
dir of the one play that carried one or more attempts (fresh every time, never reused: hostlab/README
pitfalls 3-4); ``meta.json`` points to it. ``outcome.json`` is our one-file summary written when an
attempt ends; without it (the service died) the batch's ``status`` file and this host's ``job_events``
are classified again. Plain file reading only.
"""

from __future__ import annotations

import enum
import json
import os
import re
import shutil
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ATTEMPT_RE = re.compile(r"^attempt-(\d{4,})$")
# ansible-playbook exit codes for "could not even start": error, parser error, bad options, unexpected error
PLAYBOOK_ERROR_RCS = frozenset({1, 4, 5, 250})
HOST_STATE_MODULE = "inplace_host_state"  # playbooks/library: the host lock and stamp


class OutcomeKind(enum.Enum):
    SUCCESSFUL = "successful"  # status successful and the host stamp carries our fingerprint
    TASK_FAILED = "task_failed"  # a task failed on the host: remembered per fingerprint
    UNREACHABLE = "unreachable"  # SSH could not reach the host: retried with backoff
    HOST_BUSY = "host_busy"  # the host lock stayed with another run (or was lost to it): retried
    INTERRUPTED = "interrupted"  # killed, canceled, no status, or no stamp proof: retried


RETRIABLE = frozenset({OutcomeKind.UNREACHABLE, OutcomeKind.HOST_BUSY, OutcomeKind.INTERRUPTED})


@dataclass(frozen=True)
class Outcome:
    kind: OutcomeKind
    capability: str | None = None  # role of the failed task
    task: str | None = None  # name of the failed task, template part cut off
    detail: str = ""  # for logs only (never shown to CAPI): status/rc and the like
    finished: float = 0.0  # wall-clock seconds (time.time()) when the attempt ended
    message: str | None = None  # a failure before the play (drain): the stable message CAPI is shown

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "kind": self.kind.value,
            "capability": self.capability,
            "task": self.task,
            "detail": self.detail,
            "finished": self.finished,
        }
        if self.message is not None:
            data["message"] = self.message
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Outcome:
        return cls(
            kind=OutcomeKind(data["kind"]),
            capability=data.get("capability"),
            task=data.get("task"),
            detail=str(data.get("detail", "")),
            finished=float(data.get("finished", 0.0)),
            message=data.get("message"),
        )


@dataclass(frozen=True)
class Attempt:
    """One attempt directory as found on disk."""

    number: int
    path: Path
    retry_token: str  # hash of the retry annotation when it started ("" = none)
    outcome: Outcome | None  # None: never summarised (still running, or the service died during it)
    address: str | None = None  # the host address SSH used (health checks of the Kubernetes-aware mode)


def write_json(path: Path, data: object, mode: int = 0o600) -> None:
    """Write JSON atomically (temp file + rename) with the given mode from the start."""
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        json.dump(data, fh, sort_keys=True)
    tmp.replace(path)


def new_attempt_dir(ident_dir: Path) -> tuple[int, Path]:
    """Create the next ``attempt-NNNN`` directory (mkdir is atomic, so two processes never share one)."""
    ident_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    number = max((a for a, _ in _attempt_dirs(ident_dir)), default=0) + 1
    while True:
        path = ident_dir / f"attempt-{number:04d}"
        try:
            path.mkdir(mode=0o700)
        except FileExistsError:
            number += 1
            continue
        return number, path


def _attempt_dirs(ident_dir: Path) -> Iterator[tuple[int, Path]]:
    try:
        entries = list(ident_dir.iterdir())
    except FileNotFoundError:
        return
    for entry in entries:
        m = ATTEMPT_RE.match(entry.name)
        if m and entry.is_dir():
            yield int(m.group(1)), entry


def load_attempts(ident_dir: Path, fingerprint: str) -> list[Attempt]:
    """All attempts of one ident, oldest first. Attempts without ``outcome.json`` are classified from
    their batch's ansible-runner artifacts when those are final, else left with ``outcome=None``."""
    attempts = []
    for number, path in sorted(_attempt_dirs(ident_dir)):
        meta = _read_json(path / "meta.json") or {}
        summary = _read_json(path / "outcome.json")
        outcome = Outcome.from_json(summary) if summary else None
        batch = BatchRef.from_meta(meta)
        if outcome is None and batch is not None and runner_status(batch.dir, batch.ident) is not None:
            outcome = classify(batch, fingerprint)
        address = meta.get("address")
        attempts.append(
            Attempt(
                number,
                path,
                str(meta.get("retry_token", "")),
                outcome,
                address if isinstance(address, str) else None,
            )
        )
    return attempts


@dataclass(frozen=True)
class BatchRef:
    """Where an attempt's ansible-runner artifacts are: its batch's private data dir, and its host there."""

    dir: Path
    ident: str
    host: str

    def to_meta(self) -> dict[str, str]:
        return {"batch_dir": str(self.dir), "batch_ident": self.ident, "host": self.host}

    @classmethod
    def from_meta(cls, meta: dict[str, Any]) -> BatchRef | None:
        try:
            return cls(Path(str(meta["batch_dir"])), str(meta["batch_ident"]), str(meta["host"]))
        except KeyError:
            return None


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def runner_status(batch_dir: Path, ident: str) -> str | None:
    """ansible-runner's final status (successful, failed, timeout, canceled), or None while unfinished."""
    try:
        status = (batch_dir / "artifacts" / ident / "status").read_text(encoding="utf-8").strip()
    except OSError:
        return None
    return status if status in ("successful", "failed", "timeout", "canceled") else None


def _events(batch: BatchRef) -> list[dict[str, Any]]:
    """This host's events of the batch (plus the host-less play events), in order."""
    events = []
    for path in (batch.dir / "artifacts" / batch.ident / "job_events").glob("*.json"):
        event = _read_json(path)
        if event is None:
            continue
        host = (event.get("event_data") or {}).get("host")
        if host is None or host == batch.host:
            events.append(event)
    events.sort(key=lambda e: int(e.get("counter", 0)))
    return events


def _rc(batch_dir: Path, ident: str) -> int | None:
    try:
        return int((batch_dir / "artifacts" / ident / "rc").read_text(encoding="utf-8").strip())
    except (OSError, ValueError):
        return None


def task_label(name: str) -> str:
    """A task name fit for a CAPI message. ansible-core renders task names in its events, so the roles
    template only checked values into names (tests/playbooks/test_task_names.py); a part Ansible left
    unrendered is cut off."""
    head = name.split("{{", 1)[0].strip().rstrip(":").strip()
    return (head or "unnamed task")[:120]


def _is_host_state(data: dict[str, Any]) -> bool:
    action = str(data.get("resolved_action") or data.get("task_action") or "")
    return action.rsplit(".", 1)[-1] == HOST_STATE_MODULE


def stamp_confirmed(events: Sequence[dict[str, Any]], fingerprint: str) -> bool:
    """True when the host's events show its stamp holding ``fingerprint``.

    playbooks/update_machine.yml reports it through its ``inplace_host_state`` module: ``state=locked``
    returns ``up_to_date`` with ``applied_fingerprint`` when the host already had it (the run ends
    early), ``state=stamped`` returns the ``fingerprint`` it wrote.
    """
    for event in events:
        data = event.get("event_data") or {}
        if event.get("event") == "runner_on_ok" and _is_host_state(data):
            res = data.get("res") or {}
            if res.get("up_to_date") is True and res.get("applied_fingerprint") == fingerprint:
                return True
            if res.get("changed") is True and res.get("fingerprint") == fingerprint:
                return True
    return False


def classify(batch: BatchRef, fingerprint: str, finished: float | None = None) -> Outcome:
    """What one host's attempt ended as, from its batch's ansible-runner artifacts (finished or dead)."""
    status = runner_status(batch.dir, batch.ident)
    rc = _rc(batch.dir, batch.ident)
    when = finished if finished is not None else _mtime(batch.dir / "artifacts" / batch.ident)
    detail = f"status={status or 'none'} rc={rc}"
    if status is None:
        return Outcome(
            OutcomeKind.INTERRUPTED, detail=detail + " (no final status: run killed)", finished=when
        )
    events = _events(batch)
    # the stamp is the update's last step: whatever fails after it (the lock release) changed nothing
    if stamp_confirmed(events, fingerprint):
        return Outcome(OutcomeKind.SUCCESSFUL, detail=detail, finished=when)
    if status == "successful":
        return Outcome(
            OutcomeKind.INTERRUPTED, detail=detail + " (no stamp with this fingerprint)", finished=when
        )
    failed = [
        e
        for e in events
        if e.get("event") == "runner_on_failed" and not (e.get("event_data") or {}).get("ignore_errors")
    ]
    if any(e.get("event") == "runner_on_unreachable" for e in events):
        return Outcome(OutcomeKind.UNREACHABLE, detail=detail, finished=when)
    if failed:
        data = failed[0].get("event_data") or {}
        if _is_host_state(data):
            # waiting for the host lock timed out, or a stale-lock takeover took it from us:
            # another run owns the host right now, which is not a failure of this update
            return Outcome(OutcomeKind.HOST_BUSY, detail=detail, finished=when)
        return Outcome(
            OutcomeKind.TASK_FAILED,
            capability=str(data.get("role") or "update_machine"),
            task=task_label(str(data.get("task") or "")),
            detail=detail,
            finished=when,
        )
    if (
        status == "failed"
        and rc in PLAYBOOK_ERROR_RCS
        and not any(e.get("event") == "playbook_on_play_start" for e in events)
    ):
        # ansible-playbook refused to start the play (parse error, bad option): retrying cannot help
        return Outcome(
            OutcomeKind.TASK_FAILED,
            capability="update_machine",
            task=f"load playbook (rc {rc})",
            detail=detail,
            finished=when,
        )
    # failed without a failed task of this host: ansible-playbook killed, or another host's failure
    # ended the play for all (update_machine.yml has any_errors_fatal)
    return Outcome(OutcomeKind.INTERRUPTED, detail=detail + " (no failed task)", finished=when)


def prune_batches(batches_dir: Path, older_than: float, now: float) -> list[Path]:
    """Delete finished plays' private data dirs last touched before ``now - older_than``.

    Always safe: every attempt has its own ``outcome.json``, and an attempt whose summary was never
    written and whose artifacts are gone is simply run again (the host stamp makes that a no-op).
    """
    removed = []
    for batch_dir in batches_dir.glob("batch-*"):
        if runner_status(batch_dir, batch_dir.name) is None:
            continue  # running, or killed: the restart decides about it
        if _mtime(batch_dir / "artifacts" / batch_dir.name / "status") < now - older_than:
            shutil.rmtree(batch_dir, ignore_errors=True)
            removed.append(batch_dir)
    return removed


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0
