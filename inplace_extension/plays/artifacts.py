"""The runs directory on disk: attempt directories, ansible-runner artifacts, and what an attempt ended as.

Layout: ``<runs_dir>/<ident>/attempt-0001/{meta.json, inputs.json, known_hosts, outcome.json}`` per
Machine attempt (beside them, ``health-wait.json`` while an update not started yet waits for a health
check: :mod:`inplace_extension.local.health_wait`); ``<runs_dir>/.batches/<batch>/artifacts/<batch>/`` is
the ansible-runner private data dir of the one play that carried one or more attempts (fresh every
time, never reused: a reused dir's stale ``env/`` files override new envvars, and a reused ident mixes
two runs' stats);
``meta.json`` points to it. ``outcome.json`` is our one-file summary written when an attempt ends; without it
(the service died) the batch's ``status`` file and this host's ``job_events`` are classified again.
``<batch dir>/play.lease`` is flock()ed by ``detach.py`` (and inherited by ansible-playbook) for as long as
the play lives: the kernel drops it when they die, however they die, so a free lease says the play is
over, even across a restart of the service, and names the play's process group (:func:`stop_play`).
``meta.json`` records the host lock token each attempt's play holds, so a later attempt of the same
Machine can take over a lock its own dead play left (:func:`ended_lock_tokens`), and the episode it
began in (local/episode.py: ``<runs_dir>/.machines/``). Plain file reading
(and the one signal of :func:`stop_play`); :mod:`inplace_extension.plays.outcomes` reads what attempts
ended as.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ATTEMPT_RE = re.compile(r"^attempt-(\d{4,})$")
PLAY_LEASE = "play.lease"  # in a batch dir: held by the play's processes while they live
PLAY_LEASE_ENV = "INPLACE_EXTENSION_PLAY_LEASE"  # tells detach.py where the lease is


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
    number = max((a for a, _ in attempt_dirs(ident_dir)), default=0) + 1
    while True:
        path = ident_dir / f"attempt-{number:04d}"
        try:
            path.mkdir(mode=0o700)
        except FileExistsError:
            number += 1
            continue
        return number, path


def attempt_dirs(ident_dir: Path) -> Iterator[tuple[int, Path]]:
    try:
        entries = list(ident_dir.iterdir())
    except FileNotFoundError:
        return
    for entry in entries:
        m = ATTEMPT_RE.match(entry.name)
        if m and entry.is_dir():
            yield int(m.group(1)), entry


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


def read_json(path: Path) -> dict[str, Any] | None:
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


def prune_batches(batches_dir: Path, older_than: float, now: float) -> list[Path]:
    """Delete finished plays' private data dirs last touched before ``now - older_than``.

    Always safe: every attempt has its own ``outcome.json``, and an attempt whose summary was never
    written and whose artifacts are gone is simply run again (the host stamp makes that a no-op).
    """
    removed = []
    for batch_dir in batches_dir.glob("batch-*"):
        if runner_status(batch_dir, batch_dir.name) is None:
            continue  # running, or killed: the restart decides about it
        if mtime(batch_dir / "artifacts" / batch_dir.name / "status") < now - older_than:
            shutil.rmtree(batch_dir, ignore_errors=True)
            removed.append(batch_dir)
    return removed


def mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def play_ended(batch_dir: Path) -> bool:
    """True when the play of ``batch_dir`` started and none of its processes is alive any more.

    False while it runs, and when it never started or its artifacts were pruned: nothing is known then,
    and a lock it might have left goes stale the usual way.
    """
    try:
        fd = os.open(batch_dir / PLAY_LEASE, os.O_RDWR)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)  # closing drops the flock if we got it
    return True


def stop_play(batch_dir: Path, sig: int) -> bool:
    """Send ``sig`` to the play of ``batch_dir`` while it lives: to ansible-playbook's process group (its
    own session, which its workers and their ssh clients share), named in the play lease. True when the
    play was alive and told; False when it has ended, or has not named its group yet (ask again)."""
    try:
        fd = os.open(batch_dir / PLAY_LEASE, os.O_RDONLY)
    except OSError:
        return False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            return False  # nobody holds the lease: the play is over
        except BlockingIOError:
            pass  # held: the play lives (detach.py, ansible-playbook or its workers)
        try:
            pgid = int(os.pread(fd, 32, 0).decode() or "0")
        except ValueError:
            return False
        if pgid <= 1:
            return False
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return False
        return True
    finally:
        os.close(fd)  # closing drops the flock if we got it


def ended_lock_tokens(ident_dir: Path) -> tuple[str, ...]:
    """The host lock tokens of this ident's attempts whose plays have ended: a lock still held with one
    of them was left by a dead play of this very Machine (killed with its service) and nobody will ever
    release it, so the next attempt may take it over without waiting for it to go stale."""
    tokens = []
    for _, path in sorted(attempt_dirs(ident_dir)):
        meta = read_json(path / "meta.json") or {}
        token = meta.get("lock_token")
        batch = BatchRef.from_meta(meta)
        if isinstance(token, str) and token and batch is not None and play_ended(batch.dir):
            tokens.append(token)
    return tuple(tokens)


def drain_file(attempt_dir: Path) -> Path:
    """Where the service tells the play at its drain point how the drain ended: ``{"drained": bool}``."""
    return attempt_dir / "drain.json"


def drain_failure_file(attempt_dir: Path) -> Path:
    """Why the drain at the play's drain point failed: ``{"message", "retriable"}`` (for the outcome)."""
    return attempt_dir / "drain-failure.json"


def stop_waiting_plays(ident_dir: Path) -> None:
    """Tell any play of this ident's earlier attempts still waiting at its drain point that no drain is
    coming (a service that died left it there): it stops and releases the host lock for the new one."""
    for _, path in attempt_dirs(ident_dir):
        if not drain_file(path).exists():
            write_json(drain_file(path), {"drained": False})
