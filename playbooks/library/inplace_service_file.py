#!/usr/bin/python3
"""Ansible module: one service configuration file, and the service restart it needs, in one execution.

A role that configures a service (kubelet flags, time servers) has one concern: "the service runs with
this file". As separate tasks that is a ``copy`` (two module executions: ``stat``, then ``copy``), a
restart handler and a health wait, each an SSH round trip of about half a second (measured on lab hosts).
Here it is one execution, still in the order of a procedure:

1. write ``content`` to ``path`` (owned by root, the user it runs as; ``mode``; parents created 0755),
   atomically, only when content, mode or owner differ; or remove the file (``state=absent``);
2. when that changed something, or a restart is still pending from an earlier run, run ``restart``
   (an argv, never through a shell);
3. wait until ``healthz_url`` answers 200, when given.

A restart that fails (or a service that never gets healthy) leaves ``restart_marker`` behind, so the
next run restarts even though the file is already in place. Without it the retried run would find the
file unchanged, skip the restart and stamp the host while the service still ran the old settings (what
an Ansible handler does after a failed play).

When this is the last step the play runs, the play passes ``host_stamp``: after the steps above
succeeded, the host's stamp is written and the lock released in this same execution
(``module_utils/inplace_lock_stamp.py``), which saves the stamp task's round trip. When this is the
first step, the play passes ``host_lock``: before step 1 the host lock is taken and the stamp read
in this same execution, which saves the lock task's round trip; the steps are left out when the stamp
shows them applied.
"""

from __future__ import annotations

import os
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from ansible.module_utils import inplace_lock_stamp as host_state
from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.inplace_atomic_file import replace_file

DOCUMENTATION = r"""
module: inplace_service_file
short_description: Write one service configuration file, restart the service when it changed, wait for health
options:
  path: {description: Absolute path of the file., type: path, required: true}
  content: {description: File content (state=present)., type: str}
  state: {description: Whether the file should exist., type: str, choices: [present, absent],
          default: present}
  mode: {description: Octal mode of the file., type: str, default: "0644"}
  restart: {description: Command (argv) that restarts the service; nothing is restarted when empty.,
            type: list, elements: str, default: []}
  restart_marker: {description: File that marks a restart as pending until it succeeded., type: path}
  healthz_url: {description: URL that answers 200 once the restarted service is healthy., type: str}
  health_timeout_seconds: {description: How long to wait for the health URL after the restart., type: float,
                           default: 60}
  health_poll_seconds: {description: Pause between two health checks., type: float, default: 0.25}
  alternatives:
    description: Another service to configure instead when it is installed, first match wins (chrony
      instead of systemd-timesyncd); saves a separate stat execution.
    type: list
    elements: dict
    default: []
    suboptions:
      if_exists: {description: Used when this path exists on the host., type: path, required: true}
      path: {description: Replaces I(path)., type: path, required: true}
      content: {description: Replaces I(content)., type: str}
      restart: {description: Replaces I(restart)., type: list, elements: str, default: []}
  host_stamp:
    description: After this module's work succeeded, write the host's stamp and release the lock in the
      same execution (the arguments of inplace_host_state state=stamped; the play passes them to the last
      step it runs, saving the stamp task's round trip).
    type: dict
  host_lock:
    description: Before this module's work, take the host lock and read the stamp in the same execution
      (the arguments of inplace_host_state state=locked and I(step), the step this module is; the play
      passes them to the first step it runs, saving the lock task's round trip). The work is left out
      when the stamp shows the host has the whole update (the lock is given back) or this step applied
      with these inputs.
    type: dict
"""

# The file belongs to the user the module runs as: root, as the roles run with become (and the tests,
# which run it unprivileged, can check it all the same).
_OWNER = (os.geteuid(), os.getegid())

RETURN = r"""
path: {description: The file this run looked after (I(path), or the matching alternative's)., type: str}
written: {description: The file was written or removed by this run., type: bool}
restarted: {description: The restart command ran (and the service got healthy)., type: bool}
host_stamp: {description: What writing the stamp answered (only with I(host_stamp))., type: dict}
host_lock: {description: What taking the lock answered (only with I(host_lock)); inplace_host_state's
            state=locked fields., type: dict}
"""


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


def _restart(module: AnsibleModule, p: dict[str, Any], marker: Path | None) -> None:
    proc = subprocess.run(p["restart"], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        said = proc.stderr.strip()[-500:]
        module.fail_json(
            msg=f"restart command {p['restart'][0]} failed (rc {proc.returncode}): {said}",
            written=True,
        )
    if p["healthz_url"]:
        # asked often: a restarted kubelet is healthy within a second or two, and every pause here is
        # wall time of the update
        deadline = time.monotonic() + p["health_timeout_seconds"]
        tries = 1
        while not _healthy(p["healthz_url"]):
            if time.monotonic() >= deadline:
                module.fail_json(
                    msg=f"{p['healthz_url']} did not answer 200 within {p['health_timeout_seconds']:g}s "
                    f"after the restart ({tries} tries)",
                    written=True,
                )
            time.sleep(p["health_poll_seconds"])
            tries += 1
    if marker is not None:
        marker.unlink(missing_ok=True)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
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
            "host_stamp": host_state.STAMP_OPTION,
            "host_lock": host_state.LOCK_OPTION,
        },
        required_if=[("state", "present", ["content"])],
        supports_check_mode=True,
    )
    p = module.params
    chosen = next((a for a in p["alternatives"] if Path(a["if_exists"]).exists()), None)
    if chosen is not None:
        p.update(path=chosen["path"], content=chosen["content"], restart=chosen["restart"])
    path = Path(p["path"])
    try:
        mode = int(p["mode"], 8)
    except ValueError:
        module.fail_json(msg="mode must be octal, e.g. 0644")
    if not path.is_absolute() or mode & ~0o7777:
        module.fail_json(msg="path must be absolute and mode at most 07777")
    marker = Path(p["restart_marker"]) if p["restart_marker"] else None
    try:  # the host lock and the stamp's answer, when this is the first step the play runs
        locked, work = host_state.lock_before(p["host_lock"], module.check_mode)
    except host_state.HostStateError as exc:
        module.fail_json(msg=exc.msg, **host_state.lock_failure(exc))
    if not work:
        _done(module, locked, changed=False, path=str(path), written=False, restarted=False)
    if p["state"] == "present":
        content = (p["content"] or "").encode("utf-8")
        written = _differs(path, content, mode)
    else:
        written = path.exists() or path.is_symlink()
    pending = bool(p["restart"]) and (written or (marker is not None and marker.exists()))
    if module.check_mode:
        _done(module, locked, changed=written or pending, path=str(path), written=written, restarted=False)
    if written and marker is not None and p["restart"]:
        # first the marker, then the file: a run killed in between restarts next time, never the reverse
        marker.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        marker.touch(mode=0o600)
    if written and p["state"] == "present":
        _write(path, content, mode)
    elif written:
        path.unlink()
    if pending:
        _restart(module, p, marker)
    _done(module, locked, changed=written or pending, path=str(path), written=written, restarted=pending)


def _done(module: AnsibleModule, locked: dict[str, Any], **result: Any) -> None:
    """Exit with ``result`` and what taking the lock answered (``locked``: ``lock_before``'s fields), after
    writing the stamp when the play asked for it (``host_stamp``)."""
    result.update(locked)
    try:
        rider = host_state.stamp_rider(module.params["host_stamp"], locked)
        result.update(host_state.stamp_after(rider, module.check_mode))
    except host_state.HostStateError as exc:
        module.fail_json(msg=exc.msg, **{**result, **exc.fields})
    module.exit_json(**result)


if __name__ == "__main__":
    main()
