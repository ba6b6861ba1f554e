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

The code lives in ``module_utils/inplace_lock_stamp.py``, which the roles' own modules use too: they
write the stamp in the same execution as the last step's work when the play asks (``host_stamp``).
"""

from __future__ import annotations

from pathlib import Path

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.inplace_lock_stamp import HostStateError, acquire, release, write_stamp

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
    if not module.check_mode:  # check mode (the dry run) only reads: it leaves the host as it found it
        Path(p["state_dir"]).mkdir(mode=0o700, parents=True, exist_ok=True)
    action = {"locked": acquire, "unlocked": release, "stamped": write_stamp}[p["state"]]
    try:
        module.exit_json(**action(p, module.check_mode))
    except HostStateError as exc:
        module.fail_json(msg=exc.msg, **exc.fields)


if __name__ == "__main__":
    main()
