#!/usr/bin/python3
"""Ansible module: the host lock and the applied-fingerprint stamp of inplace-extension.

It owns everything under the state directory (default /var/lib/inplace-extension) that is not a
role's own manifest:

* ``lock/``        the exclusive host lock: a directory holding ``owner.json`` {ident, token,
                   acquired_at, pid}; it appears atomically (built beside, then renamed into place).
* ``lock.guard``   a file that is flock()ed only while a run looks at or changes ``lock/``, so
                   check-and-take, stale takeover and release never race each other. The kernel
                   drops the flock when a process dies, so a killed module never wedges it.
* ``lock.log``     one JSON line per lock event (acquired, waiting, took-over, released).
* ``stamp.json``   {fingerprint, ident, applied_at, steps} of the last fully applied update;
                   ``steps`` maps each of its steps (capability) to the fingerprint of that step's inputs.
* ``stamp.log``    one JSON line per stamp write.

Per-step fingerprints: ``state=locked`` is given this run's ``steps`` ({capability: fingerprint}) and
answers ``unchanged``, the steps whose fingerprint the stamp holds: the host's last complete run applied
them with these inputs, so the play skips them without touching the host. A stamp without ``steps``
(written before they existed) makes no step unchanged: every step runs. A run that goes on to change
the host first takes out of the stamp what it is about to change, in the same execution: the stamp's
whole fingerprint (the host will no longer be exactly that update) and the entries of every step it
runs, so that a run that fails half-way never leaves a stamp claiming what it may have altered (a
later run with the earlier inputs runs those steps again instead of skipping them).

Why a module and not a chain of tasks: every module execution costs about half a second over SSH
(measured on lab hosts). ``state=locked`` takes the lock AND reads the stamp in one execution; when
the stamp already matches it releases the lock in the same execution, so a run that has nothing to
do costs one module execution; ``state=stamped`` with ``release=true`` writes the stamp and gives the
lock back in one execution too (the playbook's ``always:`` release then has nothing left to do).

The lock survives between tasks (each task is its own process), hence the directory; a run that is
killed keeps it until it is older than ``stale_seconds``, then the next run takes it over. Sooner when
the service knows better: it names the lock token of each earlier attempt of the same Machine whose
play it has seen end (``takeover_tokens``), and a lock held by the same ident with one of those tokens
is its own dead attempt's, taken over at once. Any other holder is waited for.
Lock bookkeeping reports ``changed: false``: it is transient and released by the same run.
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

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
module: inplace_host_state
short_description: Host lock and applied-fingerprint stamp for inplace-extension
description:
  - C(state=locked) waits for the exclusive host lock (taking over a stale one, or at once one held
    by this ident with a token in I(takeover_tokens)), then reads the stamp; if the stamp already
    holds I(fingerprint) it releases the lock and returns C(up_to_date=true). Otherwise it returns the
    I(steps) whose fingerprint the stamp holds (C(unchanged)) and takes the others and the whole
    fingerprint out of the stamp before the play changes anything.
  - C(state=stamped) writes the stamp with I(fingerprint) and I(steps) (only while this run holds the
    lock); with I(release) it then releases the lock in the same execution.
  - C(state=unlocked) releases the lock if this run holds it, and does nothing otherwise.
options:
  state: {description: What to do., type: str, required: true, choices: [locked, unlocked, stamped]}
  ident: {description: Run ident for the lock owner, the logs and the stamp., type: str, required: true}
  fingerprint: {description: Fingerprint of the inputs of this run (locked and stamped)., type: str}
  steps: {description: "Fingerprint of each step's inputs, {capability: fingerprint} (locked and stamped).",
          type: dict, default: {}}
  token: {description: The token returned by state=locked (unlocked and stamped); for locked, the token to
           hold the lock with (a random one when empty)., type: str}
  takeover_tokens: {description: Lock tokens of this ident's earlier attempts whose plays are known to have
                    ended; a lock left with one of them is taken over without waiting (locked)., type: list,
                    elements: str, default: []}
  state_dir: {description: Directory holding lock and stamp., type: path, default: /var/lib/inplace-extension}
  wait_seconds: {description: How long state=locked waits for another run's lock., type: float, default: 300}
  stale_seconds: {description: Age after which a lock counts as left behind by a dead run., type: float,
                  default: 1800}
  release: {description: state=stamped also releases the lock after writing the stamp., type: bool,
            default: false}
  poll_seconds: {description: How often a waiting run looks at the lock again., type: float, default: 0.5}
"""

RETURN = r"""
locked: {description: Whether this run holds the lock after the call., type: bool}
up_to_date: {description: The stamp already holds the requested fingerprint., type: bool}
token: {description: Nonce of this lock holding; pass it to unlocked and stamped., type: str}
applied_fingerprint: {description: Fingerprint in the stamp before this run (null if none)., type: str}
unchanged: {description: "The steps whose fingerprint the stamp holds, in the order of I(steps): skipped
            by the play (all of them when C(up_to_date))", type: list}
took_over_from: {description: Ident of the stale holder this run displaced (null if none)., type: str}
released: {description: state=unlocked (or stamped with release) removed this run's lock., type: bool}
"""

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
    # An unreadable owner file cannot happen through this module (the directory is renamed into
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


def acquire(module: AnsibleModule, p: dict[str, Any]) -> dict[str, Any]:
    state_dir, ident, fingerprint = Path(p["state_dir"]), p["ident"], p["fingerprint"]
    if module.check_mode:  # look, do not touch: report what a real run would find
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
            module.fail_json(
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


def release(module: AnsibleModule, p: dict[str, Any]) -> dict[str, Any]:
    state_dir = Path(p["state_dir"])
    lock_dir = state_dir / "lock"
    if module.check_mode or not p["token"]:
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


def write_stamp(module: AnsibleModule, p: dict[str, Any]) -> dict[str, Any]:
    state_dir = Path(p["state_dir"])
    lock_dir = state_dir / "lock"
    if module.check_mode:
        return {"changed": True}
    with _guard(state_dir):
        holder = _holder(lock_dir)
        if holder is None or not secrets.compare_digest(holder["token"], p["token"] or ""):
            module.fail_json(
                msg=(
                    "not writing the stamp: this run no longer holds the host lock "
                    f"(now held by {'nobody' if holder is None else holder['ident']}); "
                    "it was probably taken over as stale"
                ),
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


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "state": {"type": "str", "required": True, "choices": ["locked", "unlocked", "stamped"]},
            "ident": {"type": "str", "required": True},
            "fingerprint": {"type": "str"},
            "steps": {"type": "dict", "default": {}},
            # Not a secret: a per-run nonce so a run never releases a lock it lost to a takeover.
            "token": {"type": "str", "default": ""},
            "takeover_tokens": {"type": "list", "elements": "str", "default": []},
            "state_dir": {"type": "path", "default": "/var/lib/inplace-extension"},
            "wait_seconds": {"type": "float", "default": 300.0},
            "stale_seconds": {"type": "float", "default": 1800.0},
            "poll_seconds": {"type": "float", "default": 0.5},
            "release": {"type": "bool", "default": False},
        },
        required_if=[("state", "locked", ["fingerprint"]), ("state", "stamped", ["fingerprint", "token"])],
        supports_check_mode=True,
    )
    p = module.params
    if p["wait_seconds"] < 0 or p["stale_seconds"] <= 0 or p["poll_seconds"] <= 0:
        module.fail_json(msg="wait_seconds must be >= 0, stale_seconds and poll_seconds > 0")
    Path(p["state_dir"]).mkdir(mode=0o700, parents=True, exist_ok=True)
    action = {"locked": acquire, "unlocked": release, "stamped": write_stamp}[p["state"]]
    module.exit_json(**action(module, p))


if __name__ == "__main__":
    main()
