"""When an update's next attempt (the first or a retry) began waiting for a ``kubernetes`` health check:
on disk, so that the check's ``timeout`` (docs/operator-controls.md) counts across restarts of the
service and its replicas.

One small file per run ident beside its attempts, ``<runs_dir>/<ident>/health-wait.json``: the check
the update waits for, the retry token of the call that began the wait (:func:`~inplace_extension.runs.
policy.retry_token`, a hash, never the annotation's value) and when it began. It is not an attempt
(attempt directories are ``attempt-NNNN``) and it lives and goes with the ident's directory. A wait for
another check, or with another retry token (the operator changed the retry annotation), begins afresh;
any other answer (the check holds and the update starts, a pause, a closed window) ends the wait and
removes the file.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Final

from inplace_extension.plays.artifacts import read_json, write_json

log = logging.getLogger(__name__)

WAIT_FILE: Final = "health-wait.json"


def wait_file(ident_dir: Path) -> Path:
    return ident_dir / WAIT_FILE


def began(ident_dir: Path, check: str, token: str, now: float) -> float:
    """When the update of ``ident_dir`` began waiting for ``check`` with the retry token ``token``: the
    start on disk when the file names both, else ``now``, recorded as the start of a new wait.

    A file that cannot be written is logged and the wait is as long as it takes: an update must not
    fail because the runs directory is full."""
    path = wait_file(ident_dir)
    recorded = read_json(path) or {}
    since = recorded.get("since")
    if (
        recorded.get("check") == check
        and recorded.get("retry_token") == token
        and isinstance(since, int | float)
        and not isinstance(since, bool)
    ):
        return float(since)
    try:
        ident_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        write_json(path, {"check": check, "retry_token": token, "since": now})
    except OSError as exc:
        log.warning("cannot record the health check wait in %s: %s", path, exc)
    return now


def end(ident_dir: Path) -> None:
    """The update no longer waits for a health check (or waits for one without a timeout)."""
    try:
        wait_file(ident_dir).unlink(missing_ok=True)
    except OSError as exc:
        log.warning("cannot remove %s: %s", wait_file(ident_dir), exc)
