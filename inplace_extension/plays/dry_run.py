"""The host dry run: the update playbook played in Ansible check mode with diff (``--check --diff``)
through the ``local`` executor's play machinery (:mod:`plays.runner`), and what each Machine's host would
get, step by step, read from the play's job events.

Check mode changes nothing on the host: the lock task only reads the stamp (no lock is taken: the run
has no lock token), the steps' modules compare and report, the stamp task and the lock release do
nothing, and a module or command that cannot run in check mode is skipped by Ansible itself. A step is

- ``unchanged`` when the host's stamp holds it with these inputs (the play skips it, as a real run
  would), or when its tasks found the host as wanted already;
- ``would change`` when a task of the step reports a change (with the diff its module gives);
- ``cannot tell`` when a task of the step was skipped because check mode cannot predict its effect (a
  command, a module without check mode, or a role that says so with a ``<role>_cannot_tell`` fact),
  and no task reported a change; it is never reported as unchanged;
- ``failed`` when a task of the step failed (the Machine's check failed; the others go on).

An unreachable host is an error of that Machine only. The private data dir (the inputs, the events
with their diffs) is a temporary directory, removed afterwards. Used by ``plan --hosts``.
"""

from __future__ import annotations

import base64
import difflib
import re
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Final

from inplace_extension.plays import runner, ssh
from inplace_extension.plays.batch import PlayConfig
from inplace_extension.plays.steps import JOINT_TASK
from inplace_extension.runs.model import RunRequest
from inplace_extension.runs.resolve import HostTarget

WOULD_CHANGE: Final = "would change"
UNCHANGED: Final = "unchanged"
CANNOT_TELL: Final = "cannot tell"
FAILED: Final = "failed"
ERROR: Final = "error"  # of a Machine: unreachable, or its check failed
LOCK_TASK: Final = "Take the host lock and read the applied fingerprint"  # update_machine.yml's
# the facts a role sets in check mode (docs/capabilities.md), named with the role's prefix as Ansible's
# own lint wants (``os_update_would_change``): a change it predicts without a diff of its own (one line
# saying what), or that its effect cannot be predicted (one line saying why)
WOULD_CHANGE_FACT: Final = "_would_change"
CANNOT_TELL_FACT: Final = "_cannot_tell"
KUBELET_ARGS: Final = "kubelet_args"
_EXTRA_ARGS: Final = re.compile(r'^KUBELET_EXTRA_ARGS="([^"]*)"', re.MULTILINE)
_RESULT_EVENTS: Final = frozenset(
    {"runner_on_ok", "runner_on_failed", "runner_on_skipped", "runner_on_unreachable", "runner_item_on_ok"}
    | {"runner_item_on_failed", "runner_item_on_skipped"}
)


@dataclass(frozen=True)
class StepCheck:
    """What one step would do on one host."""

    capability: str
    result: str  # would change | unchanged | cannot tell | failed
    why: str  # one line: what the check found (never a value of the inputs)
    diffs: tuple[str, ...] = ()  # unified diffs, secret content redacted by the modules
    changes: tuple[str, ...] = ()  # one-line changes the step's tasks describe ("v1.30.2 -> v1.31.0")


@dataclass(frozen=True)
class HostCheck:
    """What the update would do on one Machine's host."""

    machine: str  # namespace/name
    address: str
    result: str  # would change | unchanged | cannot tell | error
    error: str | None
    steps: tuple[StepCheck, ...]


@dataclass(frozen=True)
class DryRun:
    """One Machine to check: its run (as UpdateMachine would make it) and its resolved host."""

    request: RunRequest
    target: HostTarget


def check_hosts(
    runs: Sequence[DryRun],
    play: PlayConfig,
    *,
    playbooks_dir: Path | None,
    max_parallel: int,
    on_host: Callable[[HostCheck], None] | None = None,
) -> list[HostCheck]:
    """Play the update in check mode for every run, ``max_parallel`` hosts per play; the checks in the
    order of ``runs``. ``on_host`` is told each check as its play ends (a progress display)."""
    playbook, ansible_cfg = runner.locate_playbook(playbooks_dir)
    checks: dict[str, HostCheck] = {}
    with tempfile.TemporaryDirectory(prefix="inplace-dry-run-") as tmp:
        state_dir = Path(tmp) / "state"
        state_dir.mkdir(mode=0o700)
        base = runner.BatchSpec(
            ident="",
            batch_dir=Path(tmp),
            hosts=(),
            playbook=playbook,
            ansible_cfg=ansible_cfg,
            state_dir=state_dir,
            wrapper=runner.install_wrapper(state_dir),
            roles_paths=play.roles_paths,
            host_checks=(),  # the health gate's commands cannot run in check mode: they would be skipped
            role_vars=play.role_vars,
            check=True,
        )
        size = max(1, max_parallel)
        try:
            for number, first in enumerate(range(0, len(runs), size)):
                batch_dir = Path(tmp) / f"batch-{number}"
                chunk = runs[first : first + size]
                hosts = tuple(_host_run(run, batch_dir) for run in chunk)
                spec = replace(base, ident=f"dry-run-{number}", batch_dir=batch_dir, hosts=hosts)
                for check in _play(spec, chunk):
                    checks[check.machine] = check
                    if on_host is not None:
                        on_host(check)
        finally:  # the plays' ssh masters would outlive this command by ControlPersist
            ssh.close_control_masters(state_dir)
    return [checks[run.request.machine] for run in runs]


def _play(spec: runner.BatchSpec, runs: Sequence[DryRun]) -> list[HostCheck]:
    """One check play for ``runs`` (``spec.hosts``, in the same order); each run's check."""
    try:
        handle = runner.start(spec, lambda *_: None)
        status = handle.wait()
        events = handle.events()
    except runner.RunStartError as exc:
        return [_error(run, str(exc)) for run in runs]
    return [
        read_check(run, host.host_name, events, status) for run, host in zip(runs, spec.hosts, strict=True)
    ]


def _host_run(run: DryRun, batch_dir: Path) -> runner.HostRun:
    request = run.request
    attempt_dir = batch_dir / "hosts" / request.ident
    attempt_dir.mkdir(mode=0o700, parents=True)
    return runner.HostRun(
        ident=request.ident,
        host_name=request.ident,
        fingerprint=request.fingerprint,
        capabilities=request.capabilities,
        inputs=request.inputs,
        target=run.target,
        attempt_dir=attempt_dir,
        roles=request.roles,
        lock_token="",  # no token: the lock task runs, and in check mode it only reads the stamp
    )


def _error(run: DryRun, message: str) -> HostCheck:
    return HostCheck(run.request.machine, run.target.address, ERROR, message, ())


def read_check(run: DryRun, host: str, events: Sequence[Mapping[str, Any]], status: str) -> HostCheck:
    """One host's check, from the batch's job events (``host``: its inventory name)."""
    request = run.request
    role_step = {role: cap for cap, role in request.roles.items()}
    mine = [
        (str(event.get("event")), dict(event.get("event_data") or {}))
        for event in events
        if event.get("event") in _RESULT_EVENTS and (event.get("event_data") or {}).get("host") == host
    ]
    stamp_holds: set[str] = set()
    by_step: dict[str, list[tuple[str, str, Mapping[str, Any]]]] = {cap: [] for cap in request.capabilities}
    for kind, data in mine:
        res = _mapping(data.get("res"))
        task = str(data.get("task") or "")
        if kind == "runner_on_unreachable":
            return _error(run, f"unreachable: {_message(res)}")
        if task == LOCK_TASK and kind == "runner_on_ok":
            held = request.capabilities if res.get("up_to_date") else res.get("unchanged") or ()
            stamp_holds.update(str(step) for step in held)
            continue
        if task == JOINT_TASK:
            for step, step_res in (res.get("steps") or {}).items():
                if step in by_step and not (isinstance(step_res, Mapping) and step_res.get("skipped")):
                    by_step[step].append((kind, task, step_res if isinstance(step_res, Mapping) else {}))
            if kind == "runner_on_failed" and res.get("step") in by_step:
                by_step[str(res["step"])].append((kind, task, {"failed": True, "msg": res.get("msg")}))
            continue
        role = data.get("role")
        step = role_step.get(str(role), str(role)) if role else None
        if step in by_step:
            by_step[step].append((kind, task, res))
        elif kind in ("runner_on_failed", "runner_item_on_failed") and not data.get("ignore_errors"):
            return _error(run, f"task {task!r} failed: {_message(res)}")
    steps = tuple(
        StepCheck(cap, UNCHANGED, "the host's stamp holds this step with these inputs")
        if cap in stamp_holds
        else _step(cap, by_step[cap])
        for cap in request.capabilities
    )
    failed = [step for step in steps if step.result == FAILED]
    if failed:
        return HostCheck(
            request.machine, run.target.address, ERROR, f"{failed[0].capability}: {failed[0].why}", steps
        )
    if status not in ("successful", "failed") and not steps:
        return _error(run, f"the check play ended {status}")
    results = {step.result for step in steps}
    result = next((r for r in (WOULD_CHANGE, CANNOT_TELL) if r in results), UNCHANGED)
    return HostCheck(request.machine, run.target.address, result, None, steps)


def _step(capability: str, results: list[tuple[str, str, Mapping[str, Any]]]) -> StepCheck:
    """A step that the stamp does not hold, judged from its tasks' results."""
    if not results:
        return StepCheck(capability, CANNOT_TELL, "no task of this step reported on the host")
    diffs: list[str] = []
    changes: list[str] = []
    unpredictable: list[str] = []
    changed_tasks: list[str] = []
    for kind, task, res in results:
        if kind in ("runner_on_failed", "runner_item_on_failed") and not res.get("skipped"):
            return StepCheck(capability, FAILED, f"task {task!r} failed: {_message(res)}")
        facts = _mapping(res.get("ansible_facts"))
        for name, value in facts.items():
            if value and str(name).endswith(CANNOT_TELL_FACT):
                unpredictable.append(str(value))
            elif value and str(name).endswith(WOULD_CHANGE_FACT):
                changes.append(str(value))
        if kind.endswith("_skipped") or res.get("skipped"):
            if "check mode" in _message(res):
                unpredictable.append(f"task {task!r} cannot run in check mode")
            continue
        if res.get("changed"):
            changed_tasks.append(task)
            changes.extend(str(line) for line in res.get("inplace_changes") or ())
            diffs.extend(_file_diffs(res.get("inplace_diff")) + _diffs(res.get("diff")))
            if capability == KUBELET_ARGS:
                changes.extend(_flag_changes(res.get("inplace_diff")))
    if changed_tasks or changes:
        why = f"{len(changed_tasks) or len(changes)} task(s) would change the host"
        if unpredictable:
            why += "; besides, " + "; ".join(unpredictable)
        return StepCheck(capability, WOULD_CHANGE, why, tuple(diffs), tuple(changes))
    if unpredictable:
        return StepCheck(capability, CANNOT_TELL, "; ".join(unpredictable))
    return StepCheck(capability, UNCHANGED, "the host has this already (the stamp does not say so yet)")


def _flag_changes(value: Any) -> list[str]:
    """The kubelet flags before -> after, from the kubelet_args step's file diff (its
    ``KUBELET_EXTRA_ARGS="--name=value ..."`` line, roles/kubelet_args/vars/main.yml): one line per flag
    added, changed or removed."""
    lines: list[str] = []
    for item in value if isinstance(value, list) else []:
        if not isinstance(item, Mapping):
            continue
        before, after = _flags(_text(item, "before")), _flags(_text(item, "after"))
        for name in dict.fromkeys([*before, *after]):
            old, new = before.get(name), after.get(name)
            if old != new:
                shown = [f"--{name}={v}" if v is not None else "(none)" for v in (old, new)]
                lines.append(f"kubelet flag {shown[0]} -> {shown[1]}")
    return lines


def _flags(text: str) -> dict[str, str]:
    match = _EXTRA_ARGS.search(text)
    flags: dict[str, str] = {}
    for word in (match.group(1) if match else "").split():
        name, _, value = word.removeprefix("--").partition("=")
        flags[name] = value
    return flags


def _file_diffs(value: Any) -> list[str]:
    """Our modules' own diffs (``inplace_diff``, check mode only): per file its path, owner and mode now
    and after, its content now and after (as text, or base64 where the module's argument is ``no_log``)
    or why it is not shown, or that it is removed."""
    texts: list[str] = []
    for item in value if isinstance(value, list) else []:
        if not isinstance(item, Mapping) or not isinstance(item.get("path"), str):
            continue
        path = item["path"]
        if item.get("removed"):
            texts.append(f"{path}: {item['removed']}\n")
            continue
        head = []
        if item.get("before_meta") is None:
            head.append(f"{path}: new file ({item.get('after_meta')})\n")
        elif item.get("before_meta") != item.get("after_meta") and item.get("after_meta") is not None:
            head.append(f"{path}: owner and mode {item['before_meta']} -> {item['after_meta']}\n")
        if item.get("redacted"):
            texts.append("".join(head) + f"{path}: {item['redacted']}\n")
            continue
        before, after = _text(item, "before"), _text(item, "after")
        body = _diffs({"before": before, "after": after, "before_header": path}) if before != after else []
        texts.append("".join(head) + "".join(body))
    return [text for text in texts if text]


def _text(item: Mapping[str, Any], side: str) -> str:
    if isinstance(item.get(f"{side}_b64"), str):
        return base64.b64decode(item[f"{side}_b64"]).decode("utf-8", "replace")
    return str(item.get(side) or "")


def _diffs(value: Any) -> list[str]:
    """Ansible's diff result (one ``{before, after, before_header, after_header}`` or a list of them, or
    a ``prepared`` text) as unified diff texts."""
    items = value if isinstance(value, list) else [value] if isinstance(value, Mapping) else []
    texts: list[str] = []
    for item in items:
        if not isinstance(item, Mapping):
            continue
        if isinstance(item.get("prepared"), str):
            texts.append(item["prepared"])
            continue
        before, after = item.get("before"), item.get("after")
        if not isinstance(before, str) or not isinstance(after, str):
            continue
        header_before = str(item.get("before_header") or "before")
        header_after = str(item.get("after_header") or header_before)
        lines = difflib.unified_diff(
            before.splitlines(keepends=True),
            after.splitlines(keepends=True),
            f"{header_before} (now)",
            f"{header_after} (after the update)",
        )
        texts.append("".join(line if line.endswith("\n") else line + "\n" for line in lines))
    return [text for text in texts if text]


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _message(res: Mapping[str, Any]) -> str:
    return " ".join(str(res.get("msg") or res.get("skip_reason") or "no message").split())[:500]
