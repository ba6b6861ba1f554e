"""The host work of a step that is one service configuration file and the restart it needs (the
``kubelet_args`` and ``ntp`` steps): the file written atomically when it differs, the restart only when
that changed something or a restart failed before (its marker), the health wait. Shared by
``inplace_service_file`` (the roles' module) and ``inplace_steps`` (this step with the one before it in
one execution); what it does, and why the marker, is ``inplace_service_file``'s docstring.
"""

from __future__ import annotations

import os
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from ansible.module_utils.inplace_atomic_file import replace_file
from ansible.module_utils.inplace_steps import Step, StepFailure

# the step's module arguments (``inplace_service_file``, and ``inplace_steps``'s ``kubelet_args``)
OPTIONS: dict[str, Any] = {
    "path": {"type": "path", "required": True},
    "content": {"type": "str"},
    "state": {"type": "str", "choices": ["present", "absent"], "default": "present"},
    "mode": {"type": "str", "default": "0644"},
    "restart": {"type": "list", "elements": "str", "default": []},
    "restart_marker": {"type": "path"},
    "healthz_url": {"type": "str"},
    "health_timeout_seconds": {"type": "float", "default": 60.0},
    "health_poll_seconds": {"type": "float", "default": 0.25},
    "alternatives": {
        "type": "list",
        "elements": "dict",
        "default": [],
        "options": {
            "if_exists": {"type": "path", "required": True},
            "path": {"type": "path", "required": True},
            "content": {"type": "str"},
            "restart": {"type": "list", "elements": "str", "default": []},
        },
    },
}
REQUIRED_IF = [("state", "present", ["content"])]

# The file belongs to the user the module runs as: root, as the roles run with become (and the tests,
# which run it unprivileged, can check it all the same).
_OWNER = (os.geteuid(), os.getegid())


def step(name: str, params: dict[str, Any]) -> Step:
    """The step named ``name`` with its arguments (:data:`OPTIONS`): the installed alternative chosen
    and the path and mode checked before anything on the host is touched (the lock included). Raises
    :class:`StepFailure` on a bad path or mode."""
    p = dict(params)
    chosen = next((a for a in p["alternatives"] if Path(a["if_exists"]).exists()), None)
    if chosen is not None:
        p.update(path=chosen["path"], content=chosen["content"], restart=chosen["restart"])
    path = Path(p["path"])
    try:
        mode = int(p["mode"], 8)
    except ValueError:
        raise StepFailure("mode must be octal, e.g. 0644") from None
    if not path.is_absolute() or mode & ~0o7777:
        raise StepFailure("path must be absolute and mode at most 07777")

    def work(check: bool) -> dict[str, Any]:
        return apply(p, path, mode, check)

    return Step(name, work, {"changed": False, "path": str(path), "written": False, "restarted": False})


def apply(p: dict[str, Any], path: Path, mode: int, check: bool) -> dict[str, Any]:
    """Write (or remove) the file, restart when needed and wait for health; the result fields. Raises
    :class:`StepFailure` (``written``) when the restart or the health wait failed."""
    marker = Path(p["restart_marker"]) if p["restart_marker"] else None
    if p["state"] == "present":
        content = (p["content"] or "").encode("utf-8")
        written = _differs(path, content, mode)
    else:
        written = path.exists() or path.is_symlink()
    pending = bool(p["restart"]) and (written or (marker is not None and marker.exists()))
    result: dict[str, Any] = {
        "changed": written or pending,
        "path": str(path),
        "written": written,
        "restarted": False,
    }
    if check:
        if written:  # the dry run's diff (plays/dry_run.py): a service's configuration, no secret
            result["inplace_diff"] = [_diff(path, p["content"] if p["state"] == "present" else None, mode)]
        return result
    if written and marker is not None and p["restart"]:
        # first the marker, then the file: a run killed in between restarts next time, never the reverse
        marker.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        marker.touch(mode=0o600)
    if written and p["state"] == "present":
        _write(path, content, mode)
    elif written:
        path.unlink()
    if pending:
        _restart(p, marker)
    return {**result, "restarted": pending}


def _diff(path: Path, content: str | None, mode: int) -> dict[str, Any]:
    """The file now and as the step would leave it (None: removed)."""
    try:
        st = path.stat()
        before: str | None = path.read_text(encoding="utf-8", errors="replace")
        before_meta: str | None = f"{st.st_uid}:{st.st_gid} {st.st_mode & 0o7777:04o}"
    except OSError:
        before, before_meta = None, None
    return {
        "path": str(path),
        "before": before or "",
        "after": content or "",
        "before_meta": before_meta,
        "after_meta": None if content is None else f"{_OWNER[0]}:{_OWNER[1]} {mode:04o}",
    }


def _differs(path: Path, content: bytes, mode: int) -> bool:
    try:
        st = path.stat()
        current = path.read_bytes()
    except FileNotFoundError:
        return True
    return current != content or (st.st_mode & 0o7777) != mode or (st.st_uid, st.st_gid) != _OWNER


def _write(path: Path, content: bytes, mode: int) -> None:
    path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    replace_file(path, content, _OWNER, mode)


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:  # noqa: S310 (the role's own URL)
            return bool(answer.status == 200)
    except (urllib.error.URLError, OSError, ValueError):
        return False


def _restart(p: dict[str, Any], marker: Path | None) -> None:
    proc = subprocess.run(p["restart"], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        said = proc.stderr.strip()[-500:]
        raise StepFailure(
            f"restart command {p['restart'][0]} failed (rc {proc.returncode}): {said}", written=True
        )
    if p["healthz_url"]:
        # asked often: a restarted kubelet is healthy within a second or two, and every pause here is
        # wall time of the update
        deadline = time.monotonic() + p["health_timeout_seconds"]
        tries = 1
        while not _healthy(p["healthz_url"]):
            if time.monotonic() >= deadline:
                raise StepFailure(
                    f"{p['healthz_url']} did not answer 200 within {p['health_timeout_seconds']:g}s "
                    f"after the restart ({tries} tries)",
                    written=True,
                )
            time.sleep(p["health_poll_seconds"])
            tries += 1
    if marker is not None:
        marker.unlink(missing_ok=True)
