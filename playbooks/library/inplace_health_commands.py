#!/usr/bin/python3
"""Ansible module: the health gate's command checks (``health_checks`` entries with ``command`` in the
service's capabilities file), run on the updated host after the last role and before the stamp.

Each check is an argv list run directly (no shell, never templated: the play hands it over from a file
lookup). The checks run in file order; a round stops at the first one that fails, and the round starts
again after ``interval_seconds`` until every check passes in one round or ``timeout_seconds`` have gone
by since the first round began (a round started before then still finishes). Each try gets its own
``timeout_seconds`` (the check's), after which its whole process group is killed.

Why one module and not a ``command`` task per check: one SSH round trip for all checks and all their tries
(each module execution costs about half a second over SSH), and the result holds no command output. stdin,
stdout and stderr go to /dev/null: output may hold secrets and would land in the job events. The failure
message is stable and value-free (``health gate: check <name>: exit status <N>``, ``...: timed out``, ``...:
cannot start (FileNotFoundError)``); inplace_extension.plays.outcomes shows it to CAPI as the Failure message.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from typing import Any

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
module: inplace_health_commands
short_description: Run the health gate's command checks on the host until they pass or time runs out
options:
  checks:
    description: Checks in order, each {name, argv (list of strings), timeout_seconds (per try)}.
    type: list
    elements: dict
    required: true
  timeout_seconds: {description: How long to keep retrying the checks., type: float, required: true}
  interval_seconds: {description: Pause between two rounds of tries., type: float, default: 1}
"""

RETURN = r"""
msg: {description: The stable outcome; on failure the first failing check of the last round., type: str}
tries: {description: Rounds run., type: int}
"""


def _try(argv: list[str], timeout: float) -> str | None:
    """None when the command exits 0, else why not (value-free)."""
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd="/",
            start_new_session=True,  # its own process group: a timeout kills what it started too
        )
    except (OSError, ValueError) as exc:
        return f"cannot start ({type(exc).__name__})"
    try:
        status = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):  # the group is gone already
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return "timed out"
    if status == 0:
        return None
    return f"exit status {status}" if status > 0 else f"killed by signal {-status}"


def first_failing(checks: list[dict[str, Any]]) -> str | None:
    for check in checks:
        why = _try([str(arg) for arg in check["argv"]], float(check["timeout_seconds"]))
        if why is not None:
            return f"health gate: check {check['name']}: {why}"
    return None


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "checks": {"type": "list", "elements": "dict", "required": True},
            "timeout_seconds": {"type": "float", "required": True},
            "interval_seconds": {"type": "float", "default": 1.0},
        },
        supports_check_mode=False,
    )
    checks: list[dict[str, Any]] = module.params["checks"]
    for check in checks:
        argv = check.get("argv")
        if not isinstance(argv, list) or not argv or not all(isinstance(arg, str) for arg in argv):
            module.fail_json(msg=f"health gate: check {check.get('name')}: argv must be a list of strings")
    deadline = time.monotonic() + module.params["timeout_seconds"]
    tries = 0
    while True:
        tries += 1
        failing = first_failing(checks)
        if failing is None:
            module.exit_json(changed=False, msg="health gate: the command checks pass", tries=tries)
        if time.monotonic() + module.params["interval_seconds"] >= deadline:
            module.fail_json(msg=failing, tries=tries)
        time.sleep(module.params["interval_seconds"])  # polling the host's state, not synchronising


if __name__ == "__main__":
    main()
