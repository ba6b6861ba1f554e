"""The host lock and the applied-fingerprint stamp of inplace-extension, shared by the modules that
look after them: ``inplace_host_state`` (the lock task, the stamp task and the release) and the roles'
own modules, which take the lock and read the stamp in the same execution as the first step's work
(their ``host_lock`` option, :func:`lock_before`) and write the stamp in the same execution as the last
step's work (their ``host_stamp`` option, :func:`stamp_after`) when the play asks, each saving a module
execution (an SSH round trip).

What lives on the host, the lock's rules and the per-step fingerprints: the ``inplace_host_state``
module's docstring and docs/playbooks.md. Failures are :class:`HostStateError`; a module turns them
into ``fail_json`` with the same fields.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any


class HostStateError(Exception):
    """The lock or stamp could not be had: ``msg`` and the result fields of the failure."""

    def __init__(self, msg: str, **fields: Any) -> None:
        super().__init__(msg)
        self.msg = msg
        self.fields = fields


# The ``host_stamp`` option of a module that can write the stamp after its own work: the arguments of
# state=stamped (the lock is released in the same execution).
STAMP_OPTION: dict[str, Any] = {
    "type": "dict",
    "options": {
        "ident": {"type": "str", "required": True},
        "fingerprint": {"type": "str", "required": True},
        "steps": {"type": "dict", "default": {}},
        "token": {"type": "str", "required": True, "no_log": False},  # a per-run nonce, not a secret
        "state_dir": {"type": "path", "default": "/var/lib/inplace-extension"},
        # the steps of the play after this one: given to a first step that takes the lock, which writes
        # the stamp only when its read of the stamp shows every one of them unchanged (see stamp_rider)
        "after": {"type": "list", "elements": "str", "default": []},
    },
}


# The ``host_lock`` option of a module that can take the lock and read the stamp before its own work:
# the arguments of state=locked, and the step the module is (``step``). The token is the play's own
# (the service's), so that the play's release needs nothing of this module's answer.
LOCK_OPTION: dict[str, Any] = {
    "type": "dict",
    "options": {
        "step": {"type": "str", "required": True},
        "ident": {"type": "str", "required": True},
        "fingerprint": {"type": "str", "required": True},
        "steps": {"type": "dict", "default": {}},
        "token": {"type": "str", "required": True, "no_log": False},  # a per-run nonce, not a secret
        "takeover_tokens": {"type": "list", "elements": "str", "default": [], "no_log": False},
        "state_dir": {"type": "path", "default": "/var/lib/inplace-extension"},
        "wait_seconds": {"type": "float", "default": 300.0},
        "stale_seconds": {"type": "float", "default": 1800.0},
        "poll_seconds": {"type": "float", "default": 0.5},
    },
}


def lock_before(rider: dict[str, Any] | None, check_mode: bool) -> tuple[dict[str, Any], bool]:
    """Before a module's own work, when it is the play's first step: state=locked (wait for the lock,
    read the stamp, take out of it what this run changes). Returns the result fields to add (``host_lock``:
    what state=locked answers; nothing without ``rider``) and whether the module is to do its work: not
    when the host already has the whole update (the lock is given back) nor when the stamp shows this
    step applied with these inputs. Raises :class:`HostStateError` when the lock cannot be had."""
    if not rider:
        return {}, True
    if rider["wait_seconds"] < 0 or rider["stale_seconds"] <= 0 or rider["poll_seconds"] <= 0:
        raise HostStateError("host_lock: wait_seconds must be >= 0, stale_seconds and poll_seconds > 0")
    if not check_mode:  # check mode (the dry run) only reads: it leaves the host as it found it
        Path(rider["state_dir"]).mkdir(mode=0o700, parents=True, exist_ok=True)
    answer = acquire(rider, check_mode)
    return {"host_lock": answer}, not answer["up_to_date"] and rider["step"] not in answer["unchanged"]


def lock_failure(exc: HostStateError) -> dict[str, Any]:
    """The result fields of a module whose ``host_lock`` could not be had (:func:`lock_before` raised):
    ``host_lock`` says the lock is not held, and by whom (the service counts the host busy)."""
    return {"host_lock": {"locked": False, "up_to_date": False, **exc.fields}}


def stamp_rider(host_stamp: dict[str, Any] | None, locked: dict[str, Any]) -> dict[str, Any] | None:
    """The module's ``host_stamp``, to write after its work (``locked``: what :func:`lock_before` added).
    None when its own ``host_lock`` found the host up to date (the lock is given back then, and the stamp
    holds this update), and when a step of its ``after`` still runs: one the stamp just read does not
    show unchanged (that step, or the play's stamp task, writes it)."""
    answer = locked.get("host_lock") or {}
    if not host_stamp or answer.get("up_to_date"):
        return None
    unchanged = set(answer.get("unchanged") or ())
    return host_stamp if unchanged.issuperset(host_stamp.get("after") or ()) else None


def stamp_after(rider: dict[str, Any] | None, check_mode: bool) -> dict[str, Any]:
    """After a module's own work succeeded: write the stamp and release the lock (``rider``: the
    module's ``host_stamp`` argument; nothing to do without one). Returns the result fields to add
    (``host_stamp``: what state=stamped answers); raises :class:`HostStateError` with ``lost_lock``
    when this run no longer holds the lock."""
    if not rider:
        return {}
    return {"host_stamp": write_stamp({**rider, "release": True}, check_mode)}


OWNER = "owner.json"


def _now() -> float:
    return time.time()


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(f"{path.name}.tmp-{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, (json.dumps(data, sort_keys=True) + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    tmp.replace(path)


def _append_log(state_dir: Path, name: str, entry: dict[str, Any]) -> None:
    line = json.dumps({"time": round(_now(), 3), **entry}, sort_keys=True)
    fd = os.open(state_dir / name, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


@contextlib.contextmanager
def _guard(state_dir: Path) -> Iterator[None]:
    """Hold the flock that serialises every look at and change of ``lock/``."""
    fd = os.open(state_dir / "lock.guard", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing drops the flock


def _holder(lock_dir: Path) -> dict[str, Any] | None:
    """The current lock owner, or None when nobody holds the lock."""
    try:
        st = lock_dir.stat()
    except FileNotFoundError:
        return None
    owner = _read_json(lock_dir / OWNER) or {}
    # An unreadable owner file cannot happen through these functions (the directory is renamed into
    # place complete); fall back to the directory's age so even a hand-made lock goes stale.
    acquired_at = owner.get("acquired_at")
    if not isinstance(acquired_at, (int, float)):
        acquired_at = st.st_mtime
    return {
        "ident": str(owner.get("ident", "unknown")),
        "token": str(owner.get("token", "")),
        "acquired_at": float(acquired_at),
    }


def _create_lock(state_dir: Path, lock_dir: Path, ident: str, token: str) -> None:
    staging = state_dir / f"lock.new-{token[:8]}"
    staging.mkdir(mode=0o700)
    _write_json_atomic(
        staging / OWNER,
        {"ident": ident, "token": token, "acquired_at": _now(), "pid": os.getpid()},
    )
    staging.rename(lock_dir)  # atomic; the guard makes sure lock_dir does not exist


def _remove_leftover_staging(state_dir: Path) -> None:
    # A module killed between mkdir and rename leaves its staging directory; only a holder of the
    # guard can be in that window, so anything found here while we hold it is dead.
    for leftover in state_dir.glob("lock.new-*"):
        shutil.rmtree(leftover, ignore_errors=True)


def acquire(p: dict[str, Any], check_mode: bool = False) -> dict[str, Any]:
    """state=locked: wait for the lock, read the stamp (inplace_host_state's description)."""
    state_dir, ident, fingerprint = Path(p["state_dir"]), p["ident"], p["fingerprint"]
    if check_mode:  # look, do not touch: report what a real run would find
        stamp = _read_json(state_dir / "stamp.json") or {}
        applied = stamp.get("fingerprint")
        return {
            "changed": False,
            "locked": False,
            "up_to_date": applied == fingerprint,
            "token": "",
            "applied_fingerprint": applied,
            "unchanged": list(p["steps"]) if applied == fingerprint else _unchanged(stamp, p["steps"]),
            "took_over_from": None,
        }
    token = p["token"] or secrets.token_hex(16)
    own_dead = frozenset(t for t in p["takeover_tokens"] if t)
    deadline = time.monotonic() + p["wait_seconds"]
    took_over_from = None
    announced = False
    while True:
        with _guard(state_dir):
            holder, displaced = _try_take(state_dir, ident, token, p["stale_seconds"], own_dead)
            took_over_from = displaced or took_over_from
            if holder is None:
                return _taken(state_dir, ident, token, fingerprint, p["steps"], took_over_from)
            if not announced:  # one line per waiting run, so the log shows who queued behind whom
                _append_log(
                    state_dir, "lock.log", {"event": "waiting", "ident": ident, "holder": holder["ident"]}
                )
                announced = True
        if time.monotonic() >= deadline:
            age = int(_now() - holder["acquired_at"])
            raise HostStateError(
                msg=(
                    f"host lock {state_dir / 'lock'} is held by run {holder['ident']} (for {age}s); "
                    f"gave up after waiting {p['wait_seconds']:g}s. It counts as stale after "
                    f"{p['stale_seconds']:g}s."
                ),
                locked=False,
                holder=holder["ident"],
            )
        time.sleep(p["poll_seconds"])


def _try_take(
    state_dir: Path, ident: str, token: str, stale_seconds: float, own_dead: frozenset[str]
) -> tuple[dict[str, Any] | None, str | None]:
    """Under the guard: take the lock if it is free, stale, or left by a dead attempt of this ident.

    Returns (the live holder when the lock could not be taken, the ident of a displaced holder).
    """
    lock_dir = state_dir / "lock"
    _remove_leftover_staging(state_dir)
    holder = _holder(lock_dir)
    displaced = None
    reason = None
    if holder is not None:
        if holder["ident"] == ident and holder["token"] in own_dead:
            reason = "own-dead-attempt"  # the service saw the play holding it end: nobody will release it
        elif _now() - holder["acquired_at"] > stale_seconds:
            reason = "stale"
    if holder is not None and reason is not None:
        shutil.rmtree(lock_dir)
        displaced = holder["ident"]
        _append_log(
            state_dir,
            "lock.log",
            {"event": "took-over", "ident": ident, "previous": displaced, "reason": reason},
        )
        holder = None
    if holder is not None:
        return holder, displaced
    _create_lock(state_dir, lock_dir, ident, token)
    _append_log(state_dir, "lock.log", {"event": "acquired", "ident": ident})
    return None, displaced


def _taken(
    state_dir: Path,
    ident: str,
    token: str,
    fingerprint: str,
    steps: dict[str, str],
    took_over_from: str | None,
) -> dict[str, Any]:
    """Under the guard, lock just taken: read the stamp again (the run we waited for may have written
    it) and give the lock straight back when the host already has this fingerprint. Otherwise say which
    steps the stamp shows applied with these inputs, and take everything else out of the stamp."""
    stamp = _read_json(state_dir / "stamp.json")
    applied = (stamp or {}).get("fingerprint")
    result = {
        "changed": False,
        "locked": True,
        "up_to_date": False,
        "token": token,
        "applied_fingerprint": applied,
        "unchanged": [],
        "took_over_from": took_over_from,
    }
    if applied == fingerprint:
        shutil.rmtree(state_dir / "lock")
        _append_log(state_dir, "lock.log", {"event": "released", "ident": ident, "reason": "up-to-date"})
        result.update(locked=False, up_to_date=True, token="", unchanged=list(steps))
        return result
    unchanged = _unchanged(stamp or {}, steps)
    result["unchanged"] = unchanged
    if stamp is not None:
        _withdraw(state_dir, stamp, ident, [step for step in steps if step not in unchanged])
    return result


def _unchanged(stamp: dict[str, Any], steps: dict[str, str]) -> list[str]:
    """The steps of ``steps`` whose fingerprint the stamp holds (none for a stamp without ``steps``)."""
    applied = stamp.get("steps")
    if not isinstance(applied, dict):
        return []
    return [step for step, fp in steps.items() if isinstance(fp, str) and applied.get(step) == fp]


def _withdraw(state_dir: Path, stamp: dict[str, Any], ident: str, changing: list[str]) -> None:
    """Before this run changes the host: the stamp no longer claims the whole update it names, nor the
    steps this run is about to apply (they may be half done if it fails). Not a stamp write: stamp.log
    keeps one line per complete update."""
    applied = stamp.get("steps")
    steps = {k: v for k, v in applied.items() if k not in changing} if isinstance(applied, dict) else {}
    if stamp.get("fingerprint") is None and steps == applied:
        return  # withdrawn already by an earlier run that did not finish
    _write_json_atomic(
        state_dir / "stamp.json",
        {**stamp, "fingerprint": None, "steps": steps, "changing": ident},
    )


def release(p: dict[str, Any], check_mode: bool = False) -> dict[str, Any]:
    """state=unlocked: give the lock back if this run (``token``) still holds it."""
    state_dir = Path(p["state_dir"])
    lock_dir = state_dir / "lock"
    if check_mode or not p["token"]:
        return {"changed": False, "released": False, "locked": False}
    with _guard(state_dir):
        holder = _holder(lock_dir)
        if holder is None or not secrets.compare_digest(holder["token"], p["token"]):
            # Not ours (any more): a run that outlived stale_seconds was taken over. Leave it.
            return {
                "changed": False,
                "released": False,
                "locked": False,
                "holder": None if holder is None else holder["ident"],
            }
        shutil.rmtree(lock_dir)
        _append_log(state_dir, "lock.log", {"event": "released", "ident": p["ident"]})
    return {"changed": False, "released": True, "locked": False}


def write_stamp(p: dict[str, Any], check_mode: bool = False) -> dict[str, Any]:
    """state=stamped: write the stamp while this run holds the lock, then release it if asked."""
    state_dir = Path(p["state_dir"])
    lock_dir = state_dir / "lock"
    if check_mode:
        return {"changed": True}
    with _guard(state_dir):
        holder = _holder(lock_dir)
        if holder is None or not secrets.compare_digest(holder["token"], p["token"] or ""):
            raise HostStateError(
                msg=(
                    "not writing the stamp: this run no longer holds the host lock "
                    f"(now held by {'nobody' if holder is None else holder['ident']}); "
                    "it was probably taken over as stale"
                ),
                lost_lock=True,
            )
        _write_json_atomic(
            state_dir / "stamp.json",
            {"fingerprint": p["fingerprint"], "ident": p["ident"], "applied_at": _now(), "steps": p["steps"]},
        )
        _append_log(state_dir, "stamp.log", {"fingerprint": p["fingerprint"], "ident": p["ident"]})
        if p["release"]:
            shutil.rmtree(lock_dir)
            _append_log(state_dir, "lock.log", {"event": "released", "ident": p["ident"]})
    return {"changed": True, "fingerprint": p["fingerprint"], "released": p["release"]}
