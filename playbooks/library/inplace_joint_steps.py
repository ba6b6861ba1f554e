#!/usr/bin/python3
"""Ansible module: consecutive built-in steps of an update in one module execution (issue 31).

Each module execution costs a worker fork on the controller, an SSH channel, the host's Python start-up
and AnsiballZ, and the result's processing: about half a second on a real node. When the steps to run
include ``kubeadm_files`` and then ``kubelet_args`` (next to each other in the fixed order), the play
(``update_machine.yml``'s ``update_machine_joint``) has this module do both steps' host work in one
execution instead of one per role, with the same code as the roles' own modules
(``module_utils/inplace_kubeadm_files.py``, ``module_utils/inplace_service_config.py``) in the same
order and with the same guarantees (``module_utils/inplace_steps.py``):

1. both steps' inputs are checked before anything on the host is touched;
2. with ``host_lock`` (the play's first step is ``kubeadm_files``): the host lock is taken and the stamp
   read first; the host's whole update found there gives the lock back and does nothing;
3. ``kubeadm_files``: the files written atomically, dropped ones removed, the manifest kept;
4. ``kubelet_args``: the flags file written, and only when it changed (or a restart failed before)
   kubelet restarted and its health waited for;
5. with ``host_stamp``: the stamp written and the lock released, only after both succeeded (and when
   every step the play has after these two is unchanged, ``after``).

A step the stamp shows applied with these inputs (``host_lock``'s answer, or the play's ``unchanged``
when an earlier task read the stamp) is left out, as the play leaves out an unchanged role. A step that
fails ends the execution: the next one does not run, nothing is stamped, the answer names the ``step``.
The answer has each step's result under ``steps``, so that the play's output and job events still show
what each step did.
"""

from __future__ import annotations

from ansible.module_utils import inplace_kubeadm_files as kubeadm_files
from ansible.module_utils import inplace_lock_stamp as host_state
from ansible.module_utils import inplace_service_config as service_config
from ansible.module_utils import inplace_steps
from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
module: inplace_joint_steps
short_description: The kubeadm_files and kubelet_args steps in one execution, lock and stamp included
options:
  kubeadm_files:
    description: The kubeadm_files step (the inplace_files module's options).
    type: dict
    required: true
  kubelet_args:
    description: The kubelet_args step (the inplace_service_file module's options).
    type: dict
    required: true
  unchanged:
    description: Steps the play already knows the stamp holds with these inputs (left out).
    type: list
    elements: str
    default: []
  host_stamp:
    description: After both steps succeeded, write the host's stamp and release the lock (as inplace_files).
    type: dict
  host_lock:
    description: Take the host lock and read the stamp first (as inplace_files).
    type: dict
"""

RETURN = r"""
steps: {description: "Each step's result ({kubeadm_files: inplace_files's fields, kubelet_args:
        inplace_service_file's fields}); a step left out as unchanged has skipped true.", type: dict}
step: {description: The step that failed (only on failure)., type: str}
host_stamp: {description: What writing the stamp answered (only with I(host_stamp))., type: dict}
host_lock: {description: What taking the lock answered (only with I(host_lock))., type: dict}
"""

# the steps this module does, in the play's fixed order, and their host work
STEPS = (("kubeadm_files", kubeadm_files), ("kubelet_args", service_config))


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "kubeadm_files": {"type": "dict", "required": True, "options": kubeadm_files.OPTIONS},
            "kubelet_args": {
                "type": "dict",
                "required": True,
                "options": service_config.OPTIONS,
                "required_if": service_config.REQUIRED_IF,
            },
            "unchanged": {"type": "list", "elements": "str", "default": []},
            "host_stamp": host_state.STAMP_OPTION,
            "host_lock": host_state.LOCK_OPTION,
        },
        supports_check_mode=True,
    )
    steps = []
    for name, work in STEPS:
        try:  # every step's inputs are checked before anything on the host is touched, the lock included
            steps.append(work.step(name, module.params[name]))
        except inplace_steps.StepFailure as exc:
            module.fail_json(msg=exc.msg, step=name, **exc.fields)
    inplace_steps.run(module, steps, unchanged=module.params["unchanged"], joint=True)


if __name__ == "__main__":
    main()
