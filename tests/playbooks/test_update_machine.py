"""update_machine.yml on lab hosts: full update, convergence, stamp short-circuit, per-step skips, host lock.

The lab hosts have no Kubernetes and no systemd: ``kubelet``, ``kubeadm``, ``kubectl`` and ``systemctl``
there are STAND-INS installed by ``standins.install_standins`` (see that module). Everything else the
roles touch (users, files, sudoers, time server configuration, the lock and stamp) is real.
"""

from __future__ import annotations

import json
import shlex
import time
from pathlib import Path
from typing import Any

import pytest
from hostlab.lab import Host, Lab

from inplace_extension.plays.steps import JOINT_TASK

from .inputs import inputs
from .support import (
    LOCK_TASK,
    STAMP_TASK,
    STATE_DIR,
    RunResult,
    RunSpec,
    calls,
    event_data,
    finish,
    host_exists,
    host_json_lines,
    host_root,
    run_update,
    start_update,
)

pytestmark = pytest.mark.lab
FILES_TASK = "Write the files and remove the ones no longer listed"  # kubeadm_files' one module execution
# the lock taken by the lock task (no lock token given) or, as the service's runs do, by the first step's
# module (update_machine_lock_rides_on: the service's lock token, a first step whose module can take it)
BOTH_LOCKS = pytest.mark.parametrize("first_step_locks", [False, True], ids=["lock-task", "first-step-locks"])


def test_full_update_converges_and_the_stamp_short_circuits(lab: Lab, host: Host, tmp_path: Path) -> None:
    first = run_update(RunSpec(lab, host, tmp_path, inputs()))
    assert first.status == "successful", first.failure_messages
    assert first.roles_run == ["users", "ntp", "kubeadm_files", "kubelet_args", "kubernetes_version"]
    assert STAMP_TASK in first.changed_tasks
    stamp = json.loads(lab.read_file(host, f"{STATE_DIR}/stamp.json"))
    assert (stamp["fingerprint"], stamp["ident"]) == (first.fingerprint, first.ident)

    # Same inputs, new fingerprint: every role runs again and changes nothing; only the stamp is new.
    second = run_update(RunSpec(lab, host, tmp_path, inputs()))
    assert second.status == "successful", second.failure_messages
    assert second.roles_run == first.roles_run
    assert second.changed_tasks == [STAMP_TASK]

    # Same fingerprint again: the play ends after the lock task, no role runs, nothing changes.
    third = run_update(RunSpec(lab, host, tmp_path, inputs(), fingerprint=second.fingerprint))
    assert third.status == "successful", third.failure_messages
    assert third.roles_run == []
    assert third.changed_tasks == []
    stamps = host_json_lines(lab, host, f"{STATE_DIR}/stamp.log")
    assert [s["fingerprint"] for s in stamps] == [first.fingerprint, second.fingerprint]
    lock_events = host_json_lines(lab, host, f"{STATE_DIR}/lock.log")
    assert [(e["event"], e["ident"]) for e in lock_events] == [
        ("acquired", first.ident),
        ("released", first.ident),
        ("acquired", second.ident),
        ("released", second.ident),
        ("acquired", third.ident),
        ("released", third.ident),
    ]
    assert lock_events[-1].get("reason") == "up-to-date"
    assert not host_exists(lab, host, f"{STATE_DIR}/lock")


def test_an_unchanged_step_is_skipped_without_touching_the_host(lab: Lab, host: Host, tmp_path: Path) -> None:
    """The measured case: new files, the same kubelet flags and Kubernetes version. Only kubeadm_files
    runs; the kubelet is neither asked its version nor restarted (the stand-ins log every call)."""
    caps = ("kubeadm_files", "kubelet_args", "kubernetes_version")
    first = run_update(RunSpec(lab, host, tmp_path, inputs(*caps), step_fingerprints=True))
    assert first.status == "successful", first.failure_messages
    assert (first.roles_run, first.unchanged) == (list(caps), [])
    assert any(" --version" in line for line in calls(lab, host))  # the version rule read it once
    calls_before = len(calls(lab, host))

    changed = inputs(*caps)
    changed["kubeadm_files"]["kubeadm_files_files"][0]["content"] = "whole file\nnew line two\n"
    second = run_update(RunSpec(lab, host, tmp_path, changed, step_fingerprints=True))
    assert second.status == "successful", second.failure_messages
    assert second.unchanged == ["kubelet_args", "kubernetes_version"]
    assert second.roles_run == ["kubeadm_files"]
    # the stamp rode on kubeadm_files' own execution (the last step that ran): no stamp task
    assert not second.ran(STAMP_TASK) and second.changed_tasks == [FILES_TASK, STAMP_TASK]
    assert host_executions(second) == 2  # the lock and stamp read, the files with the stamp
    assert calls(lab, host)[calls_before:] == []  # no kubelet --version, no systemctl restart
    assert lab.read_file(host, "/etc/inplace-test/nested/whole.conf") == "whole file\nnew line two\n"
    stamp = json.loads(lab.read_file(host, f"{STATE_DIR}/stamp.json"))
    assert stamp["fingerprint"] == second.fingerprint
    assert list(stamp["steps"]) == list(caps)  # every step of the update, the skipped ones included
    assert [(e["event"], e["ident"]) for e in host_json_lines(lab, host, f"{STATE_DIR}/lock.log")][2:] == [
        ("acquired", second.ident),
        ("released", second.ident),
    ]

    # A new Kubernetes version is a new step fingerprint: the version rule reads the kubelet again.
    newer = inputs(*caps)
    newer["kubeadm_files"] = changed["kubeadm_files"]
    newer["kubernetes_version"]["kubernetes_version_target"] = "v1.29.0"  # a downgrade: refused
    third = run_update(RunSpec(lab, host, tmp_path, newer, step_fingerprints=True))
    assert third.status == "failed"
    assert third.unchanged == ["kubeadm_files", "kubelet_args"]
    assert third.failed_roles == ["kubernetes_version"]
    assert any(" --version" in line for line in calls(lab, host)[calls_before:])


def test_the_first_step_takes_the_lock_in_its_own_execution(lab: Lab, host: Host, tmp_path: Path) -> None:
    """As the service runs it (its lock token, its --skip-tags with the lock task's tag): the first
    step's module takes the lock and reads the stamp, the last one's writes it; the lock task is never
    queued. The measured case (bench/update.py --real-nodes): new files and kubelet flags, the same
    Kubernetes version, in ONE module execution on the host (inplace_joint_steps: the lock, the files,
    the flags with the restart, the stamp)."""
    caps = ("kubeadm_files", "kubelet_args", "kubernetes_version")
    service = "--skip-tags update_machine_recheck,update_machine_lock"

    def run(changes: dict[str, dict[str, Any]], fingerprint: str | None = None) -> RunResult:
        spec = RunSpec(lab, host, tmp_path, changes, step_fingerprints=True, cmdline=service, lock_token=True)
        if fingerprint is not None:
            spec.fingerprint = fingerprint
        result = run_update(spec)
        assert result.status == "successful", result.failure_messages
        assert not any(event_data(e).get("task") == LOCK_TASK for e in result.events)
        assert not host_exists(lab, host, f"{STATE_DIR}/lock")
        return result

    first = run(inputs(*caps))
    assert (first.roles_run, first.unchanged) == (list(caps), [])
    changed = inputs(*caps)
    changed["kubeadm_files"]["kubeadm_files_files"][0]["content"] = "whole file\nnew line two\n"
    changed["kubelet_args"]["kubelet_args_extra_args"][1]["value"] = "61"
    calls_before = len(calls(lab, host))
    second = run(changed)
    assert second.unchanged == ["kubernetes_version"]
    assert second.roles_run == ["kubeadm_files", "kubelet_args"]
    assert host_executions(second) == 1  # the lock, the files, the kubelet flags and restart, the stamp
    assert second.ran(JOINT_TASK) and not second.ran(FILES_TASK)
    assert not second.ran(STAMP_TASK) and STAMP_TASK in second.changed_tasks
    assert "systemctl restart kubelet" in calls(lab, host)[calls_before:]
    assert not any(" --version" in line for line in calls(lab, host)[calls_before:])
    # the play ended after the joint execution that stamped: nothing after it was even queued
    assert queued_after_joint(second) == set()
    assert lab.read_file(host, "/etc/inplace-test/nested/whole.conf") == "whole file\nnew line two\n"
    assert json.loads(lab.read_file(host, f"{STATE_DIR}/stamp.json"))["fingerprint"] == second.fingerprint

    # the same fingerprint again: the first step's module finds it, gives the lock back and does nothing
    third = run(changed, fingerprint=second.fingerprint)
    assert third.lock_answer["up_to_date"] is True
    assert (third.changed_tasks, host_executions(third)) == ([], 1)
    assert third.roles_run == []  # the joint execution took the lock, and left both steps out
    assert queued_after_joint(third) == set()  # it found the whole update there: the play ended
    # the same inputs under a new fingerprint: every step unchanged, the files left alone, one new stamp,
    # written by the first step's module as well (every step after it unchanged)
    fourth = run(changed)
    assert fourth.unchanged == list(caps)
    assert fourth.changed_tasks == [STAMP_TASK] and not fourth.ran(STAMP_TASK)
    assert host_executions(fourth) == 1 and fourth.roles_run == []
    assert json.loads(lab.read_file(host, f"{STATE_DIR}/stamp.json"))["fingerprint"] == fourth.fingerprint
    assert queued_after_joint(fourth) == set()
    lock_events = host_json_lines(lab, host, f"{STATE_DIR}/lock.log")
    assert [(e["event"], e["ident"], e.get("reason")) for e in lock_events][-6:] == [
        ("acquired", second.ident, None),
        ("released", second.ident, None),
        ("acquired", third.ident, None),
        ("released", third.ident, "up-to-date"),
        ("acquired", fourth.ident, None),
        ("released", fourth.ident, None),
    ]


def test_a_failed_kubelet_restart_in_the_joint_execution_is_retried_and_stamps_only_then(
    lab: Lab, host: Host, tmp_path: Path
) -> None:
    """The joint execution of kubeadm_files and kubelet_args as the service runs it: the restart fails
    after the files were written; the run fails naming kubelet_args, writes no stamp and gives the lock
    back. The retry finds the flags file in place and restarts the kubelet all the same (the restart
    marker), then stamps."""
    caps = ("kubeadm_files", "kubelet_args")
    service = "--skip-tags update_machine_recheck,update_machine_lock,update_machine_apart"
    broken = json.dumps({"kubelet_args_restart_command": ["/bin/sh", "-c", "echo no kubelet >&2; exit 4"]})
    failing = run_update(
        RunSpec(
            lab,
            host,
            tmp_path,
            inputs(*caps),
            step_fingerprints=True,
            lock_token=True,
            cmdline=f"{service} -e {shlex.quote(broken)}",
        )
    )
    assert failing.status == "failed"
    assert failing.failed_roles == ["kubelet_args"]
    assert "restart command /bin/sh failed (rc 4): no kubelet" in failing.failure_messages[0]
    assert host_executions(failing) == 2  # the joint execution, and the release of always:
    assert lab.read_file(host, "/etc/inplace-test/nested/whole.conf") == "whole file\nline two\n"
    assert not host_exists(lab, host, f"{STATE_DIR}/stamp.json")
    assert not host_exists(lab, host, f"{STATE_DIR}/lock")
    assert host_exists(lab, host, f"{STATE_DIR}/kubelet_args.restart-pending")
    calls_before = len(calls(lab, host))

    retried = run_update(
        RunSpec(lab, host, tmp_path, inputs(*caps), step_fingerprints=True, lock_token=True, cmdline=service)
    )
    assert retried.status == "successful", retried.failure_messages
    assert retried.roles_run == list(caps) and host_executions(retried) == 1
    assert calls(lab, host)[calls_before:].count("systemctl restart kubelet") == 1
    assert json.loads(lab.read_file(host, f"{STATE_DIR}/stamp.json"))["fingerprint"] == retried.fingerprint
    assert not host_exists(lab, host, f"{STATE_DIR}/kubelet_args.restart-pending")


def test_the_joint_execution_after_the_lock_task_leaves_out_what_that_task_found_unchanged(
    lab: Lab, host: Host, tmp_path: Path
) -> None:
    """The service's run without a lock token (the lock task reads the stamp) and with ntp first: the
    joint execution gets the steps the lock task found unchanged from the play (its ``unchanged``) and
    leaves them out; the stamp rides on it as the last step to run."""
    caps = ("ntp", "kubeadm_files", "kubelet_args")
    service = "--skip-tags update_machine_recheck,update_machine_apart"
    first = run_update(RunSpec(lab, host, tmp_path, inputs(*caps), step_fingerprints=True, cmdline=service))
    assert first.status == "successful", first.failure_messages
    assert first.ran(LOCK_TASK) and first.roles_run == list(caps)
    changed = inputs(*caps)
    changed["kubelet_args"]["kubelet_args_extra_args"][1]["value"] = "62"
    edit = ["sh", "-c", "echo 'changed by hand' > /etc/inplace-test/nested/whole.conf"]
    assert lab.exec_in(host, edit).returncode == 0
    calls_before = len(calls(lab, host))

    second = run_update(RunSpec(lab, host, tmp_path, changed, step_fingerprints=True, cmdline=service))

    assert second.status == "successful", second.failure_messages
    assert second.unchanged == ["ntp", "kubeadm_files"]
    assert second.roles_run == ["kubelet_args"]
    assert host_executions(second) == 2  # the lock task, the joint execution with the stamp
    assert not second.ran(STAMP_TASK) and STAMP_TASK in second.changed_tasks
    # the files step was left out: the hand edit stays (as the role skipped by its `when` left it)
    assert lab.read_file(host, "/etc/inplace-test/nested/whole.conf") == "changed by hand\n"
    assert calls(lab, host)[calls_before:].count("systemctl restart kubelet") == 1
    assert "--max-pods=62" in lab.read_file(host, "/etc/default/kubelet")
    stamp = json.loads(lab.read_file(host, f"{STATE_DIR}/stamp.json"))
    assert (stamp["fingerprint"], sorted(stamp["steps"])) == (second.fingerprint, sorted(caps))
    assert not host_exists(lab, host, f"{STATE_DIR}/lock")


def test_a_single_step_takes_the_lock_and_stamps_in_one_execution(
    lab: Lab, host: Host, tmp_path: Path
) -> None:
    spec = RunSpec(lab, host, tmp_path, inputs("kubelet_args"), step_fingerprints=True, lock_token=True)
    result = run_update(spec)
    assert result.status == "successful", result.failure_messages
    assert host_executions(result) == 1
    assert result.lock_answer["locked"] is True
    assert json.loads(lab.read_file(host, f"{STATE_DIR}/stamp.json"))["fingerprint"] == result.fingerprint
    assert not host_exists(lab, host, f"{STATE_DIR}/lock")


@pytest.mark.parametrize("later", ["kubernetes_version", "kubelet_args"])
def test_the_first_step_that_took_the_lock_stamps_when_every_later_step_is_unchanged(
    lab: Lab, host: Host, tmp_path: Path, later: str
) -> None:
    """The case the whole CI run met (tests/nodes/test_node_jobs.py after other node tests had stamped the
    node's version): the first step takes the lock and only then learns from the stamp that every step
    after it is unchanged, so it is the last step to run. It writes the stamp itself, in the same
    execution (before, the play had already chosen a later step to carry the stamp and then skipped it:
    a successful play left no stamp, and the service answered it interrupted)."""
    caps = ("kubeadm_files", later)
    first = run_update(RunSpec(lab, host, tmp_path, inputs(*caps), step_fingerprints=True, lock_token=True))
    assert first.status == "successful", first.failure_messages
    assert first.roles_run == list(caps)
    changed = inputs(*caps)
    changed["kubeadm_files"]["kubeadm_files_files"][0]["content"] = "whole file\nnew line two\n"
    calls_before = len(calls(lab, host))

    second = run_update(RunSpec(lab, host, tmp_path, changed, step_fingerprints=True, lock_token=True))

    assert second.status == "successful", second.failure_messages
    assert (second.roles_run, second.unchanged) == (["kubeadm_files"], [later])
    assert not second.ran(LOCK_TASK) and not second.ran(STAMP_TASK)
    stamp = json.loads(lab.read_file(host, f"{STATE_DIR}/stamp.json"))
    assert (stamp["fingerprint"], sorted(stamp["steps"])) == (second.fingerprint, sorted(caps))
    assert host_executions(second) == 1  # the lock, the files and the stamp
    # and the play ended there for the host: the unchanged step, the stamp task and the release were
    # not even queued (update_machine_complete)
    after = {event_data(e).get("task") for e in second.events} & {STAMP_TASK, "Release the host lock"}
    assert after == set()
    assert calls(lab, host)[calls_before:] == []  # the later step did not touch the host
    assert lab.read_file(host, "/etc/inplace-test/nested/whole.conf") == "whole file\nnew line two\n"
    assert [(e["event"], e["ident"]) for e in host_json_lines(lab, host, f"{STATE_DIR}/lock.log")][2:] == [
        ("acquired", second.ident),
        ("released", second.ident),
    ]
    assert not host_exists(lab, host, f"{STATE_DIR}/lock")


def queued_after_joint(result: RunResult) -> set[str]:
    """The tasks the play queued for the host after the joint execution's end point (which ends the play
    for the host when that execution stamped or found the whole update on the host)."""
    tasks = [str(event_data(e).get("task")) for e in result.events if e["event"] == "playbook_on_task_start"]
    end = "End here, the host has the whole update (after kubeadm_files and kubelet_args)"
    return set(tasks[tasks.index(end) + 1 :]) if end in tasks else {"(no end point)"}


def host_executions(result: RunResult) -> int:
    """Module executions on the host (SSH round trips): the task results of actions that do not run on
    the controller (as bench/plays.py counts them)."""
    controller = {"assert", "debug", "fail", "meta", "set_fact", "include_role", "include_tasks"}
    controller.add("validate_argument_spec")
    return sum(
        1
        for e in result.events
        if e["event"] in ("runner_on_ok", "runner_on_failed")
        and str(event_data(e).get("resolved_action") or event_data(e).get("task_action") or "").rsplit(
            ".", 1
        )[-1]
        not in controller
    )


def test_a_stamp_of_the_previous_format_runs_every_step(lab: Lab, host: Host, tmp_path: Path) -> None:
    """A host stamped before per-step fingerprints ({fingerprint, ident, applied_at}): nothing is skipped."""
    old = {"fingerprint": "0" * 64, "ident": "old.machine.000000000000", "applied_at": 1.0}
    host_root(lab, host, ["mkdir", "-p", STATE_DIR])
    host_root(lab, host, ["tee", f"{STATE_DIR}/stamp.json"], stdin=json.dumps(old))
    caps = ("kubelet_args", "kubernetes_version")
    result = run_update(RunSpec(lab, host, tmp_path, inputs(*caps), step_fingerprints=True))
    assert result.status == "successful", result.failure_messages
    assert (result.roles_run, result.unchanged) == (list(caps), [])
    assert any(" --version" in line for line in calls(lab, host))
    assert list(json.loads(lab.read_file(host, f"{STATE_DIR}/stamp.json"))["steps"]) == list(caps)


def test_the_drain_point_is_passed_when_every_step_after_it_is_unchanged(
    lab: Lab, host: Host, tmp_path: Path
) -> None:
    """Nothing disruptive runs, so the play does not stop for a drain (had it stopped, it would fail
    after 1 s: nobody writes the drain file here)."""
    caps = ("kubeadm_files", "kubelet_args")
    first = run_update(RunSpec(lab, host, tmp_path, inputs(*caps), step_fingerprints=True))
    assert first.status == "successful", first.failure_messages
    changed = inputs(*caps)
    changed["kubeadm_files"]["kubeadm_files_files"][1]["content"] = "other\n"
    drain = {
        "update_machine_drain_before": "kubelet_args",
        "update_machine_drain_file": str(tmp_path / "drain.json"),
        "update_machine_drain_wait_seconds": 1,
    }
    second = run_update(RunSpec(lab, host, tmp_path, changed, extravars=drain, step_fingerprints=True))
    assert second.status == "successful", second.failure_messages
    assert second.roles_run == ["kubeadm_files"]
    waited = [e for e in second.events if event_data(e).get("task", "").startswith("Drain point, wait")]
    assert waited == []

    # when the step after the drain point changes, the play still stops there (and fails: no drain)
    changed["kubelet_args"]["kubelet_args_extra_args"][1]["value"] = "61"
    third = run_update(RunSpec(lab, host, tmp_path, changed, extravars=drain, step_fingerprints=True))
    assert third.status == "failed"
    assert third.unchanged == ["kubeadm_files"]
    assert "kubelet_args" not in third.roles_run


@BOTH_LOCKS
def test_a_failing_role_releases_the_lock_and_writes_no_stamp(
    lab: Lab, host: Host, tmp_path: Path, first_step_locks: bool
) -> None:
    bad = inputs("kubeadm_files", "kubelet_args")
    bad["kubelet_args"]["kubelet_args_extra_args"][0]["value"] = "has space"
    result = run_update(RunSpec(lab, host, tmp_path, bad, lock_token=first_step_locks))
    assert result.ran(LOCK_TASK) is not first_step_locks
    assert result.status == "failed"
    assert result.failed_roles == ["kubelet_args"]
    assert "kubelet_args_extra_args[0].value must not contain whitespace" in result.failure_messages[0]
    assert not host_exists(lab, host, f"{STATE_DIR}/stamp.json")
    assert not host_exists(lab, host, f"{STATE_DIR}/lock")
    events = [e["event"] for e in host_json_lines(lab, host, f"{STATE_DIR}/lock.log")]
    assert events == ["acquired", "released"]


def test_the_service_skip_tags_leave_a_whole_update_but_a_needed_step_skipped_writes_no_stamp(
    lab: Lab, host: Host, tmp_path: Path
) -> None:
    # what plays.runner.skip_tags gives for one Machine with these two steps: the re-checks made in Python
    # and every part of the play this Machine does not have are never queued, and the play still stamps
    service = ",".join(
        [
            "update_machine_recheck",
            *(f"update_machine_step_{step}" for step in ("users", "ntp", "kubernetes_version")),
            *("update_machine_drain", "update_machine_custom", "update_machine_health"),
        ]
    )
    two = inputs("kubeadm_files", "kubelet_args")
    first = run_update(
        RunSpec(lab, host, tmp_path, two, step_fingerprints=True, cmdline=f"--skip-tags {service}")
    )
    assert first.status == "successful", first.failure_messages
    assert first.roles_run == ["kubeadm_files", "kubelet_args"]
    tasks = {event_data(e).get("task") for e in first.events}
    assert not tasks & {"Check the run parameters", "Check the file paths", "Check the kubelet flags"}
    assert not any(str(task).startswith("Drain point") for task in tasks)
    assert json.loads(lab.read_file(host, f"{STATE_DIR}/stamp.json"))["fingerprint"] == first.fingerprint

    # a tag of a step this run has to do is skipped (kubelet_args, whose inputs changed): the other
    # step runs, but the run is not the whole update, so it claims no fingerprint and gives the lock back
    three = {
        **inputs("ntp"),
        "kubelet_args": {"kubelet_args_extra_args": [{"name": "max-pods", "value": "7"}]},
    }
    second = run_update(
        RunSpec(lab, host, tmp_path, three, step_fingerprints=True, cmdline="--skip-tags kubelet_args")
    )
    assert second.status == "successful", second.failure_messages
    assert second.roles_run == ["ntp"]
    assert json.loads(lab.read_file(host, f"{STATE_DIR}/stamp.json"))["fingerprint"] != second.fingerprint
    assert [s["fingerprint"] for s in host_json_lines(lab, host, f"{STATE_DIR}/stamp.log")] == [
        first.fingerprint
    ]
    assert not host_exists(lab, host, f"{STATE_DIR}/lock")


def test_the_roles_argument_specs_check_a_run_by_hand_and_not_the_services(
    lab: Lab, host: Host, tmp_path: Path
) -> None:
    """The roles' meta/argument_specs.yml are validated (ansible-core's validate_argument_spec) in a play
    run by hand; the service's runs leave out update_machine_recheck (it validated the same inputs in
    Python), and with it those validations: no task result of theirs on the host."""
    bad = inputs("kubeadm_files", "kubelet_args")
    bad["kubelet_args"]["kubelet_args_extra_args"] = "max-pods=7"  # a string, not a list of flags
    by_hand = run_update(RunSpec(lab, host, tmp_path, bad))
    assert by_hand.status == "failed"
    assert by_hand.failed_roles == ["kubelet_args"]
    [message] = by_hand.failure_messages
    assert message.startswith("Validation of arguments failed"), message
    assert "kubelet_args_extra_args" in message
    assert not host_exists(lab, host, f"{STATE_DIR}/stamp.json")
    assert not host_exists(lab, host, f"{STATE_DIR}/lock")

    good = inputs("kubeadm_files", "kubelet_args")
    skip = "--skip-tags update_machine_recheck"
    result = run_update(RunSpec(lab, host, tmp_path, good, cmdline=skip))
    assert result.status == "successful", result.failure_messages
    assert result.roles_run == ["kubeadm_files", "kubelet_args"]
    actions = [str(event_data(e).get("task_action")) for e in result.events]
    assert not [action for action in actions if "validate_argument_spec" in action]
    # ...where a run by hand of the same good inputs validates both roles
    checked = run_update(RunSpec(lab, host, tmp_path, inputs("kubeadm_files", "kubelet_args")))
    assert checked.status == "successful", checked.failure_messages
    validated = {
        event_data(e).get("role")
        for e in checked.events
        if e["event"] == "runner_on_ok" and "validate_argument_spec" in str(event_data(e).get("task_action"))
    }
    assert validated == {"kubeadm_files", "kubelet_args"}


def test_only_the_listed_capabilities_run(lab: Lab, host: Host, tmp_path: Path) -> None:
    result = run_update(RunSpec(lab, host, tmp_path, inputs("ntp", "kubelet_args")))
    assert result.status == "successful", result.failure_messages
    assert result.roles_run == ["ntp", "kubelet_args"]


def test_unknown_capability_is_refused_before_the_lock(lab: Lab, host: Host, tmp_path: Path) -> None:
    spec = RunSpec(lab, host, tmp_path, {"sysctl": {}}, capabilities=["sysctl"])
    result = run_update(spec)
    assert result.status == "failed"
    assert "update_machine_capabilities (a list drawn from users, ntp" in result.failure_messages[0]
    assert not host_exists(lab, host, f"{STATE_DIR}/lock.log")


def test_missing_inputs_file_is_refused_before_the_lock(lab: Lab, host: Host, tmp_path: Path) -> None:
    missing = {"update_machine_inputs_file": str(tmp_path / "no-such-inputs.json")}
    result = run_update(RunSpec(lab, host, tmp_path, inputs("ntp"), extravars=missing))
    assert result.status == "failed"
    assert "(absolute path of an existing file)" in result.failure_messages[0]
    assert not host_exists(lab, host, f"{STATE_DIR}/lock.log")


@BOTH_LOCKS
def test_concurrent_runs_on_one_host_never_interleave(
    lab: Lab, host: Host, tmp_path: Path, first_step_locks: bool
) -> None:
    # Run A holds the lock for a while: its kubelet restart is slowed down on the host.
    slow = {"kubelet_args_restart_command": ["/bin/sh", "-c", "sleep 4; exec systemctl restart kubelet"]}
    two = inputs("kubeadm_files", "kubelet_args")
    spec_a = RunSpec(lab, host, tmp_path, two, extravars=slow, lock_token=first_step_locks)
    spec_b = RunSpec(lab, host, tmp_path, inputs("kubeadm_files", "ntp"), lock_token=first_step_locks)
    run_a = start_update(spec_a)
    deadline = time.monotonic() + 60
    while not host_exists(lab, host, f"{STATE_DIR}/lock"):
        assert time.monotonic() < deadline, "run A never took the lock"
        assert run_a[0].is_alive(), "run A ended before taking the lock"
        time.sleep(0.05)  # poll interval
    run_b = start_update(spec_b)
    result_a = finish(spec_a, *run_a)
    result_b = finish(spec_b, *run_b)
    assert (result_a.status, result_b.status) == ("successful", "successful"), (
        result_a.failure_messages + result_b.failure_messages
    )
    lock_events = host_json_lines(lab, host, f"{STATE_DIR}/lock.log")
    # B found the lock held by A, waited, and took it only after A released it
    assert [(e["event"], e["ident"]) for e in lock_events] == [
        ("acquired", spec_a.ident),
        ("waiting", spec_b.ident),
        ("released", spec_a.ident),
        ("acquired", spec_b.ident),
        ("released", spec_b.ident),
    ]
    assert lock_events[1]["holder"] == spec_a.ident
    stamps = host_json_lines(lab, host, f"{STATE_DIR}/stamp.log")
    assert [s["ident"] for s in stamps] == [spec_a.ident, spec_b.ident]
    assert (result_a.ran(LOCK_TASK), result_b.ran(LOCK_TASK)) == (not first_step_locks, not first_step_locks)


def _plant_lock(lab: Lab, host: Host, ident: str, age_seconds: float) -> None:
    owner = {"ident": ident, "token": "0" * 32, "acquired_at": time.time() - age_seconds, "pid": 1}
    host_root(lab, host, ["mkdir", "-p", f"{STATE_DIR}/lock"])
    host_root(lab, host, ["tee", f"{STATE_DIR}/lock/owner.json"], stdin=json.dumps(owner))


@BOTH_LOCKS
def test_a_held_lock_makes_the_run_wait_then_fail_naming_the_holder(
    lab: Lab, host: Host, tmp_path: Path, first_step_locks: bool
) -> None:
    _plant_lock(lab, host, "other.machine.0123456789ab", age_seconds=5)
    wait = {"update_machine_lock_wait_seconds": 2}
    spec = RunSpec(lab, host, tmp_path, inputs("ntp"), extravars=wait, lock_token=first_step_locks)
    started = time.monotonic()
    result = run_update(spec)
    assert result.status == "failed"
    assert time.monotonic() - started >= 2
    [message] = result.failure_messages
    assert "held by run other.machine.0123456789ab" in message
    assert "gave up after waiting 2s" in message
    # the ntp role's module waited for the lock and did nothing else (the role's argument check ran)
    assert result.failed_roles == (["ntp"] if first_step_locks else [None])
    answer = result.lock_answer
    assert (answer["locked"], answer["holder"]) == (False, "other.machine.0123456789ab")
    assert not host_exists(lab, host, "/etc/systemd/timesyncd.conf.d/inplace-extension.conf")
    # the holder's lock is left alone: release only removes a lock this run owns
    owner = json.loads(lab.read_file(host, f"{STATE_DIR}/lock/owner.json"))
    assert owner["ident"] == "other.machine.0123456789ab"


@BOTH_LOCKS
def test_a_stale_lock_is_taken_over(lab: Lab, host: Host, tmp_path: Path, first_step_locks: bool) -> None:
    _plant_lock(lab, host, "killed.machine.0123456789ab", age_seconds=7200)
    stale = {"update_machine_lock_stale_seconds": 3600}
    spec = RunSpec(lab, host, tmp_path, inputs("ntp"), extravars=stale, lock_token=first_step_locks)
    result = run_update(spec)
    assert result.status == "successful", result.failure_messages
    events = host_json_lines(lab, host, f"{STATE_DIR}/lock.log")
    assert [(e["event"], e.get("previous")) for e in events][:2] == [
        ("took-over", "killed.machine.0123456789ab"),
        ("acquired", None),
    ]
    assert not host_exists(lab, host, f"{STATE_DIR}/lock")
