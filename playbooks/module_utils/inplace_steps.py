"""How the playbooks' own modules run the host work of one or more steps of an update in one module
execution, with the host lock before it and the stamp after it: the frame shared by a role's own
module (one step: ``inplace_files``, ``inplace_service_file``) and ``inplace_steps`` (consecutive
built-in steps in one execution, each an SSH round trip less).

The order is the play's: the lock is taken and the stamp read first (``host_lock``, when the play
passes it to its first step), then each step's work in the given order, each left out when the stamp
shows it applied with these inputs (or the play says so: ``unchanged``), then the stamp is written and
the lock released (``host_stamp``) only after every step succeeded. A step that fails ends the
execution there: no later step runs and nothing is stamped. The lock and stamp themselves are
``inplace_lock_stamp``'s.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from ansible.module_utils import inplace_lock_stamp as host_state
from ansible.module_utils.basic import AnsibleModule


class StepFailure(Exception):
    """A step's work failed on the host: ``msg`` and the result fields of the failure."""

    def __init__(self, msg: str, **fields: Any) -> None:
        super().__init__(msg)
        self.msg = msg
        self.fields = fields


class Step:
    """One step's host work: ``work(check_mode)`` returns its result fields or raises
    :class:`StepFailure`; ``idle`` is its result when it is left out (its inputs are on the host)."""

    def __init__(self, name: str, work: Callable[[bool], dict[str, Any]], idle: dict[str, Any]) -> None:
        self.name = name
        self.work = work
        self.idle = idle


def run(
    module: AnsibleModule, steps: Sequence[Step], unchanged: Sequence[str] = (), joint: bool = False
) -> NoReturn:
    """Lock, the steps' work, stamp; then exit the module. ``unchanged``: the steps the play already
    knows the stamp holds (read by an earlier task). With ``joint`` the answer has each step's result
    under ``steps`` ({name: result}, a left-out step's with ``skipped: true``) and a failure names its
    ``step``; without it (one step) the step's fields are the answer itself, as a role's module gives
    them."""
    check = module.check_mode
    try:  # the host lock and the stamp's answer, when the play passes them to its first step
        locked, _ = host_state.lock_before(module.params["host_lock"], check)
    except host_state.HostStateError as exc:
        module.fail_json(msg=exc.msg, **host_state.lock_failure(exc))
    answer = locked.get("host_lock") or {}
    names = [step.name for step in steps]
    left_out = set(names) if answer.get("up_to_date") else set(unchanged) | set(answer.get("unchanged") or ())
    results: dict[str, dict[str, Any]] = {}
    for step in steps:
        if step.name in left_out:
            results[step.name] = {**step.idle, **({"skipped": True} if joint else {})}
            continue
        try:
            results[step.name] = step.work(check)
        except StepFailure as exc:
            failed = {step.name: exc.fields}
            fields = {"step": step.name, "steps": {**results, **failed}} if joint else exc.fields
            module.fail_json(msg=exc.msg, **fields, **locked)
    if joint:
        result: dict[str, Any] = {
            "changed": any(r.get("changed") for r in results.values()),
            "steps": results,
        }
    else:
        result = dict(results[names[0]])
    result.update(locked)
    try:  # the play's stamp, when it rides on this execution (the last the play runs)
        stamp = module.params["host_stamp"]
        if stamp:  # the steps after this execution's own, of which the stamp must find every one unchanged
            stamp = {**stamp, "after": [s for s in stamp.get("after") or () if s not in names]}
        result.update(host_state.stamp_after(host_state.stamp_rider(stamp, locked), check))
    except host_state.HostStateError as exc:
        module.fail_json(msg=exc.msg, **{**result, **exc.fields})
    module.exit_json(**result)
