"""Classifying finished attempts from ansible-runner artifacts, and the attempt directories themselves."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from inplace_extension.plays.artifacts import (
    PLAY_LEASE,
    BatchRef,
    ended_lock_tokens,
    new_attempt_dir,
    prune_batches,
    write_json,
)
from inplace_extension.plays.outcomes import classify, load_attempts, task_label
from inplace_extension.runs.attempts import Outcome, OutcomeKind

from .fakes import FP, failed_events, ok_events, unreachable_events, write_artifacts

IDENT = f"ns.m1.{FP[:12]}"
BATCH = "batch-0123456789ab"


def ref(batch_dir: Path, host: str = IDENT) -> BatchRef:
    return BatchRef(batch_dir, BATCH, host)


def test_success_needs_the_stamp_with_our_fingerprint(tmp_path: Path) -> None:
    write_artifacts(tmp_path / "a", BATCH, "successful", 0, ok_events(FP))
    assert classify(ref(tmp_path / "a"), FP).kind is OutcomeKind.SUCCESSFUL
    write_artifacts(tmp_path / "b", BATCH, "successful", 0, ok_events("cd" * 32))
    assert classify(ref(tmp_path / "b"), FP).kind is OutcomeKind.INTERRUPTED
    write_artifacts(tmp_path / "c", BATCH, "successful", 0, ok_events(FP)[:2])
    assert classify(ref(tmp_path / "c"), FP).kind is OutcomeKind.INTERRUPTED


def test_task_failure_names_role_and_task_not_the_result(tmp_path: Path) -> None:
    write_artifacts(tmp_path, BATCH, "failed", 2, failed_events("kubeadm_files", "Write file"))
    out = classify(ref(tmp_path), FP)
    assert (out.kind, out.capability, out.task) == (OutcomeKind.TASK_FAILED, "kubeadm_files", "Write file")
    assert "secret" not in repr(out)


def health_events(msg: str, action: str = "inplace_health_commands") -> list[dict[str, Any]]:
    task = "Health gate, run the command checks on the host"
    data = {"task": task, "resolved_action": action, "res": {"msg": msg, "failed": True}}
    return [*failed_events("x", "y")[:2], {"event": "runner_on_failed", "event_data": data}]


def test_a_failed_command_check_is_the_health_gate_failure_message(tmp_path: Path) -> None:
    for number, msg in enumerate(["exit status 1", "timed out", "cannot start (FileNotFoundError)"]):
        write_artifacts(
            tmp_path / str(number), BATCH, "failed", 2, health_events(f"health gate: check etcd: {msg}")
        )
        out = classify(ref(tmp_path / str(number)), FP)
        assert (out.kind, out.message) == (OutcomeKind.TASK_FAILED, f"health gate: check etcd: {msg}")
    # anything else the module (or Ansible on its behalf) says, and the same words from another task,
    # give the generic task failure: what reaches CAPI is never free text from the host
    for number, events in enumerate(
        [
            health_events("health gate: check etcd: exit status 1 token=s3cret"),
            health_events("MODULE FAILURE: see stdout/stderr"),
            health_events("health gate: check etcd: exit status 1", action="ansible.builtin.command"),
        ]
    ):
        write_artifacts(tmp_path / f"o{number}", BATCH, "failed", 2, events)
        out = classify(ref(tmp_path / f"o{number}"), FP)
        assert (out.kind, out.message, out.task) == (
            OutcomeKind.TASK_FAILED,
            None,
            "Health gate, run the command checks on the host",
        )


def test_unreachable_and_killed_are_retriable_kinds(tmp_path: Path) -> None:
    write_artifacts(tmp_path / "u", BATCH, "failed", 4, unreachable_events())
    assert classify(ref(tmp_path / "u"), FP).kind is OutcomeKind.UNREACHABLE
    write_artifacts(tmp_path / "k", BATCH, None, None, ok_events(FP)[:2])  # no status: killed mid-run
    assert classify(ref(tmp_path / "k"), FP).kind is OutcomeKind.INTERRUPTED
    write_artifacts(tmp_path / "c", BATCH, "canceled", 254, ok_events(FP)[:2])
    assert classify(ref(tmp_path / "c"), FP).kind is OutcomeKind.INTERRUPTED


def test_playbook_that_cannot_load_is_a_remembered_failure(tmp_path: Path) -> None:
    write_artifacts(tmp_path, BATCH, "failed", 4, [{"event": "verbose", "event_data": {}}])
    out = classify(ref(tmp_path), FP)
    assert (out.kind, out.capability, out.task) == (
        OutcomeKind.TASK_FAILED,
        "update_machine",
        "load playbook (rc 4)",
    )


def test_task_label_cuts_templates() -> None:
    assert task_label("Upgrade kubelet to {{ kubernetes_version_target }}") == "Upgrade kubelet to"
    assert task_label("{{ secret }}") == "unnamed task"
    assert len(task_label("x" * 500)) == 120


def test_attempts_are_numbered_and_loaded_in_order(tmp_path: Path) -> None:
    ident_dir = tmp_path / IDENT
    n1, d1 = new_attempt_dir(ident_dir)
    n2, d2 = new_attempt_dir(ident_dir)
    n3, _ = new_attempt_dir(ident_dir)
    assert (n1, n2, n3) == (1, 2, 3)
    assert d1.stat().st_mode & 0o777 == 0o700
    write_json(d1 / "meta.json", {"retry_token": "t1"})
    write_json(d2 / "meta.json", {"retry_token": "", **ref(tmp_path / "b2").to_meta()})
    write_json(d1 / "outcome.json", Outcome(OutcomeKind.UNREACHABLE, finished=5.0).to_json())
    assert (d1 / "outcome.json").stat().st_mode & 0o777 == 0o600
    # the service died before it summarised attempt 2: its batch's artifacts are classified again
    write_artifacts(tmp_path / "b2", BATCH, "failed", 2, failed_events("ntp", "Restart chrony"))
    attempts = load_attempts(ident_dir, FP, None)
    assert [a.number for a in attempts] == [1, 2, 3]
    assert attempts[0].outcome == Outcome(OutcomeKind.UNREACHABLE, finished=5.0)
    assert attempts[0].retry_token == "t1"
    assert attempts[1].outcome is not None and attempts[1].outcome.capability == "ntp"
    assert attempts[2].outcome is None
    assert load_attempts(tmp_path / "absent", FP, None) == []


def test_only_lock_tokens_of_plays_known_to_have_ended_are_offered_for_takeover(tmp_path: Path) -> None:
    ident_dir = tmp_path / IDENT
    plays = {}
    for name in ("ended", "alive", "never-started", "no-token"):
        _, attempt = new_attempt_dir(ident_dir)
        batch = tmp_path / name
        batch.mkdir()
        plays[name] = batch
        token = {} if name == "no-token" else {"lock_token": f"token-{name}"}
        write_json(attempt / "meta.json", {**token, **BatchRef(batch, name, IDENT).to_meta()})
    for name in ("ended", "alive", "no-token"):
        (plays[name] / PLAY_LEASE).touch()
    # a live play's process holds its lease (detach.py and ansible-playbook do)
    with subprocess.Popen(
        [sys.executable, "-c", HOLD_LEASE, str(plays["alive"] / PLAY_LEASE)], stdout=subprocess.PIPE
    ) as holder:
        try:
            assert holder.stdout is not None and holder.stdout.readline() == b"held\n"
            assert ended_lock_tokens(ident_dir) == ("token-ended",)
        finally:
            holder.kill()
    assert ended_lock_tokens(ident_dir) == ("token-ended", "token-alive")


HOLD_LEASE = (
    "import fcntl, os, sys, time\n"
    "fd = os.open(sys.argv[1], os.O_RDWR)\n"
    "fcntl.flock(fd, fcntl.LOCK_EX)\n"
    "print('held', flush=True)\n"
    "time.sleep(60)\n"
)


def host_state(event: str, res: dict[str, Any], task: str = "Take the host lock") -> dict[str, Any]:
    return {"event": event, "event_data": {"task": task, "task_action": "inplace_host_state", "res": res}}


def test_stamp_proof_from_the_host_state_module(tmp_path: Path) -> None:
    early_end = [
        host_state("runner_on_ok", {"up_to_date": True, "applied_fingerprint": FP, "changed": False})
    ]
    write_artifacts(tmp_path / "e", BATCH, "successful", 0, early_end)
    assert classify(ref(tmp_path / "e"), FP).kind is OutcomeKind.SUCCESSFUL
    stamped = [
        host_state("runner_on_ok", {"up_to_date": False, "applied_fingerprint": None, "changed": False}),
        host_state("runner_on_ok", {"changed": True, "fingerprint": FP}, task="Write the stamp"),
    ]
    write_artifacts(tmp_path / "s", BATCH, "successful", 0, stamped)
    assert classify(ref(tmp_path / "s"), FP).kind is OutcomeKind.SUCCESSFUL
    other = [host_state("runner_on_ok", {"up_to_date": True, "applied_fingerprint": "cd" * 32})]
    write_artifacts(tmp_path / "o", BATCH, "successful", 0, other)
    assert classify(ref(tmp_path / "o"), FP).kind is OutcomeKind.INTERRUPTED


def test_the_steps_skipped_as_unchanged_are_in_the_outcome_record(tmp_path: Path) -> None:
    unchanged = ["kubelet_args", "kubernetes_version"]
    events = [
        host_state("runner_on_ok", {"up_to_date": False, "unchanged": unchanged, "changed": False}),
        host_state("runner_on_ok", {"changed": True, "fingerprint": FP}, task="Write the stamp"),
    ]
    write_artifacts(tmp_path, BATCH, "successful", 0, events)
    outcome = classify(ref(tmp_path), FP)
    assert (outcome.kind, outcome.skipped) == (OutcomeKind.SUCCESSFUL, tuple(unchanged))
    # outcome.json keeps them, and reads them back
    assert outcome.to_json()["skipped"] == unchanged
    assert Outcome.from_json(outcome.to_json()) == outcome
    assert "skipped" not in Outcome(OutcomeKind.SUCCESSFUL).to_json()  # nothing skipped: no key


def step_module(event: str, res: dict[str, Any]) -> dict[str, Any]:
    data = {"task": "Write the kubelet extra flags", "role": "kubelet_args", "res": res}
    return {"event": event, "event_data": {**data, "task_action": "inplace_service_file"}}


def test_stamp_proof_from_the_last_steps_module(tmp_path: Path) -> None:
    """The stamp rode on the last step's execution (host_stamp): that is the proof, no stamp task."""
    rode = [
        host_state("runner_on_ok", {"up_to_date": False, "unchanged": [], "changed": False}),
        step_module("runner_on_ok", {"changed": True, "host_stamp": {"changed": True, "fingerprint": FP}}),
    ]
    write_artifacts(tmp_path / "r", BATCH, "successful", 0, rode)
    assert classify(ref(tmp_path / "r"), FP).kind is OutcomeKind.SUCCESSFUL
    other = [step_module("runner_on_ok", {"host_stamp": {"changed": True, "fingerprint": "cd" * 32}})]
    write_artifacts(tmp_path / "o", BATCH, "successful", 0, other)
    assert classify(ref(tmp_path / "o"), FP).kind is OutcomeKind.INTERRUPTED


def test_a_step_that_lost_the_lock_at_its_stamp_is_host_busy(tmp_path: Path) -> None:
    lost = {"failed": True, "lost_lock": True, "msg": "not writing the stamp: this run no longer holds"}
    events = [{"event": "playbook_on_play_start", "event_data": {}}, step_module("runner_on_failed", lost)]
    write_artifacts(tmp_path, BATCH, "failed", 2, events)
    assert classify(ref(tmp_path), FP).kind is OutcomeKind.HOST_BUSY


def test_lock_timeout_is_host_busy_not_a_failure(tmp_path: Path) -> None:
    events = [
        {"event": "playbook_on_play_start", "event_data": {}},
        host_state("runner_on_failed", {"msg": "host lock held by run x", "holder": "x", "locked": False}),
    ]
    write_artifacts(tmp_path, BATCH, "failed", 2, events)
    assert classify(ref(tmp_path), FP).kind is OutcomeKind.HOST_BUSY


def test_the_lock_taken_by_the_first_steps_module_gives_the_skipped_steps_and_the_early_end(
    tmp_path: Path,
) -> None:
    """The first step's module took the lock (host_lock): its answer says what was unchanged, or that the
    host already had the update (the play ends there, no stamp written)."""
    unchanged = ["kubernetes_version"]
    folded = [
        step_module("runner_on_ok", {"host_lock": {"up_to_date": False, "unchanged": unchanged}}),
        host_state("runner_on_ok", {"changed": True, "fingerprint": FP}, task="Write the stamp"),
    ]
    write_artifacts(tmp_path / "f", BATCH, "successful", 0, folded)
    outcome = classify(ref(tmp_path / "f"), FP)
    assert (outcome.kind, outcome.skipped) == (OutcomeKind.SUCCESSFUL, tuple(unchanged))
    early = {"up_to_date": True, "applied_fingerprint": FP, "unchanged": ["kubelet_args"], "locked": False}
    ended = [step_module("runner_on_ok", {"host_lock": early})]
    write_artifacts(tmp_path / "e", BATCH, "successful", 0, ended)
    assert classify(ref(tmp_path / "e"), FP).kind is OutcomeKind.SUCCESSFUL


def test_a_lock_timeout_in_the_first_steps_module_is_host_busy(tmp_path: Path) -> None:
    busy = {"msg": "host lock held", "host_lock": {"locked": False, "up_to_date": False, "holder": "x"}}
    events = [{"event": "playbook_on_play_start", "event_data": {}}, step_module("runner_on_failed", busy)]
    write_artifacts(tmp_path / "b", BATCH, "failed", 2, events)
    assert classify(ref(tmp_path / "b"), FP).kind is OutcomeKind.HOST_BUSY
    # a failure of the step's own work after it took the lock is the step's
    taken = {"msg": "restart failed", "host_lock": {"locked": True, "up_to_date": False, "unchanged": []}}
    events = [{"event": "playbook_on_play_start", "event_data": {}}, step_module("runner_on_failed", taken)]
    write_artifacts(tmp_path / "t", BATCH, "failed", 2, events)
    assert classify(ref(tmp_path / "t"), FP).kind is OutcomeKind.TASK_FAILED


def test_the_joint_execution_of_two_steps_is_recorded_per_step(tmp_path: Path) -> None:
    """update_machine.yml's one execution of kubeadm_files and kubelet_args (inplace_joint_steps) is in
    no role: its lock answer gives the skipped steps and its stamp the success, as a step's module's do,
    and its failure is the step its answer names (the files were written, the restart failed)."""
    task = "Apply kubeadm_files and kubelet_args in one module execution"

    def joint(event: str, res: dict[str, Any]) -> dict[str, Any]:
        return {
            "event": event,
            "event_data": {"task": task, "task_action": "inplace_joint_steps", "res": res},
        }

    stamped = {
        "steps": {"kubeadm_files": {"written": ["/a"]}, "kubelet_args": {"written": True}},
        "host_lock": {"up_to_date": False, "unchanged": ["kubernetes_version"]},
        "host_stamp": {"changed": True, "fingerprint": FP},
    }
    write_artifacts(tmp_path / "s", BATCH, "successful", 0, [joint("runner_on_ok", stamped)])
    outcome = classify(ref(tmp_path / "s"), FP)
    assert (outcome.kind, outcome.skipped) == (OutcomeKind.SUCCESSFUL, ("kubernetes_version",))
    failed = {
        "msg": "restart command systemctl failed (rc 1): no",
        "step": "kubelet_args",
        "steps": {"kubeadm_files": {"written": ["/a"]}, "kubelet_args": {"written": True}},
        "host_lock": {"locked": True, "up_to_date": False, "unchanged": []},
    }
    events = [{"event": "playbook_on_play_start", "event_data": {}}, joint("runner_on_failed", failed)]
    write_artifacts(tmp_path / "f", BATCH, "failed", 2, events)
    out = classify(ref(tmp_path / "f"), FP)
    assert (out.kind, out.capability, out.task) == (OutcomeKind.TASK_FAILED, "kubelet_args", task)
    # a step name in another module's answer is not taken for the failed step
    other = {"task": "Some task", "task_action": "ansible.builtin.command", "res": {"step": "kubelet_args"}}
    events = [events[0], {"event": "runner_on_failed", "event_data": other}]
    write_artifacts(tmp_path / "o", BATCH, "failed", 2, events)
    assert classify(ref(tmp_path / "o"), FP).capability == "update_machine"


def test_each_host_of_a_batch_is_classified_from_its_own_events(tmp_path: Path) -> None:
    other = f"ns.m2.{FP[:12]}"
    events = [
        {"event": "playbook_on_play_start", "event_data": {}},
        {"event": "runner_on_failed", "event_data": {"host": other, "role": "users", "task": "Create users"}},
        host_state("runner_on_ok", {"changed": True, "fingerprint": FP}, task="Write the stamp"),
    ]
    events[2]["event_data"]["host"] = IDENT
    write_artifacts(tmp_path, BATCH, "failed", 2, events)
    assert classify(ref(tmp_path), FP).kind is OutcomeKind.SUCCESSFUL
    theirs = classify(ref(tmp_path, other), FP)
    assert (theirs.kind, theirs.capability) == (OutcomeKind.TASK_FAILED, "users")
    # a host the play aborted because another host failed (any_errors_fatal) is retried, not failed
    write_artifacts(tmp_path / "x", BATCH, "failed", 2, events[:2])
    assert classify(ref(tmp_path / "x"), FP).kind is OutcomeKind.INTERRUPTED


def test_old_finished_batches_are_pruned(tmp_path: Path) -> None:
    for name, status in (("batch-old", "successful"), ("batch-new", "failed"), ("batch-killed", None)):
        write_artifacts(tmp_path / name, name, status, 0, [])
    old = tmp_path / "batch-old" / "artifacts" / "batch-old" / "status"
    os.utime(old, (1000.0, 1000.0))
    os.utime(tmp_path / "batch-killed", (1000.0, 1000.0))
    assert prune_batches(tmp_path, older_than=3600, now=time.time()) == [tmp_path / "batch-old"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["batch-killed", "batch-new"]
