#!/usr/bin/python3
"""Ansible module: write the KubeadmConfig ``files`` of one machine and forget the ones dropped.

Owns the files listed in its input and a manifest (JSON) of the paths it manages. In one module
execution (each costs about half a second over SSH) it:

* validates every entry (absolute path, no ``..``, no duplicates, known owner, octal mode);
* writes each whole file atomically (temporary file in the same directory, then rename), creating
  missing parent directories, with the requested owner and mode;
* for ``append: true`` keeps exactly one block per path between marker lines naming the path, so
  appending converges instead of growing the file on every run;
* removes what an earlier run managed and the input no longer lists: whole files are deleted,
  appended blocks are cut out of the file they were appended to;
* rewrites the manifest, also when it fails half-way: then it holds what the host has of ours at
  that point (the earlier manifest's files not yet removed, and the files written before the failing
  one), so that the next run still removes what its input no longer lists.

File content is data: it is written byte for byte (UTF-8) and never returned or logged (the
option is ``no_log``), because kubeadm files may carry keys.

When this is the last step the play runs, the play passes ``host_stamp``: after the files converged,
the host's stamp is written and the lock released in this same execution (the playbooks'
``module_utils/inplace_lock_stamp.py``), which saves the stamp task's round trip. When this is the
first step, the play passes ``host_lock``: before the files the host lock is taken and the stamp read
in this same execution, which saves the lock task's round trip; the files are left alone when the
stamp shows them applied.

The host work is ``module_utils/inplace_kubeadm_files.py``'s, the frame around it (lock, stamp)
``module_utils/inplace_steps.py``'s: ``inplace_steps`` does the same work in one execution with the
next step's (the play's choice, docs/playbooks.md).
"""

from __future__ import annotations

from ansible.module_utils import inplace_lock_stamp as host_state
from ansible.module_utils import inplace_steps
from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.inplace_kubeadm_files import OPTIONS, step

DOCUMENTATION = r"""
module: inplace_files
short_description: Converge the files of a KubeadmConfig on a host, with removal of dropped ones
options:
  files:
    description: Desired files.
    type: list
    elements: dict
    required: true
    suboptions:
      path: {description: Absolute path without C(..)., type: str, required: true}
      content: {description: Text to write (never logged)., type: str, default: ''}
      owner: {description: C(user:group) or C(user)., type: str, default: 'root:root'}
      permissions: {description: Octal mode as a string., type: str, default: '0644'}
      append: {description: Keep the content as a marked block at the end of the file., type: bool,
               default: false}
  manifest: {description: Where the list of managed paths is kept., type: path,
             default: /var/lib/inplace-extension/kubeadm_files.json}
  host_stamp:
    description: After this module's work succeeded, write the host's stamp and release the lock in the
      same execution (the arguments of inplace_host_state state=stamped; the play passes them to the last
      step it runs, saving the stamp task's round trip).
    type: dict
  host_lock:
    description: Take the host lock and read the stamp first, in this execution (inplace_host_state's
      state=locked arguments and I(step), this module's step); the play's first step gets them. The
      files are left alone when the stamp holds this update (the lock goes back) or this step's inputs.
    type: dict
"""

RETURN = r"""
written: {description: Paths whose content, owner or mode changed., type: list, elements: str}
removed: {description: Paths (or appended blocks) removed because no longer desired., type: list,
          elements: str}
host_stamp: {description: What writing the stamp answered (only with I(host_stamp))., type: dict}
host_lock: {description: What taking the lock answered (only with I(host_lock)); inplace_host_state's
            state=locked fields., type: dict}
"""


def main() -> None:
    module = AnsibleModule(
        argument_spec={**OPTIONS, "host_stamp": host_state.STAMP_OPTION, "host_lock": host_state.LOCK_OPTION},
        supports_check_mode=True,
    )
    try:  # the inputs are checked before anything on the host is touched, the lock included
        files = step((module.params["host_lock"] or {}).get("step") or "kubeadm_files", module.params)
    except inplace_steps.StepFailure as exc:
        module.fail_json(msg=exc.msg, **exc.fields)
    inplace_steps.run(module, [files])


if __name__ == "__main__":
    main()
