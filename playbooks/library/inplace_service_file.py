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

The host work is ``module_utils/inplace_service_config.py``'s, the frame around it (lock, stamp)
``module_utils/inplace_steps.py``'s: ``inplace_steps`` does the same work in one execution with the
step before it (the play's choice for ``kubelet_args``, docs/playbooks.md).
"""

from __future__ import annotations

from ansible.module_utils import inplace_lock_stamp as host_state
from ansible.module_utils import inplace_steps
from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.inplace_service_config import OPTIONS, REQUIRED_IF, step

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

RETURN = r"""
path: {description: The file this run looked after (I(path), or the matching alternative's)., type: str}
written: {description: The file was written or removed by this run., type: bool}
restarted: {description: The restart command ran (and the service got healthy)., type: bool}
host_stamp: {description: What writing the stamp answered (only with I(host_stamp))., type: dict}
host_lock: {description: What taking the lock answered (only with I(host_lock)); inplace_host_state's
            state=locked fields., type: dict}
"""


def main() -> None:
    module = AnsibleModule(
        argument_spec={**OPTIONS, "host_stamp": host_state.STAMP_OPTION, "host_lock": host_state.LOCK_OPTION},
        required_if=REQUIRED_IF,
        supports_check_mode=True,
    )
    try:  # the path and mode are checked before anything on the host is touched, the lock included
        service = step((module.params["host_lock"] or {}).get("step") or "service_file", module.params)
    except inplace_steps.StepFailure as exc:
        module.fail_json(msg=exc.msg, **exc.fields)
    inplace_steps.run(module, [service])


if __name__ == "__main__":
    main()
