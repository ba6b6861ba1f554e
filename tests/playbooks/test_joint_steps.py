"""``inplace_joint_steps`` (playbooks/library), run locally as Ansible runs it (no lab needed).

The module that does kubeadm_files and then kubelet_args in one execution with the host lock before
them and the stamp after them. Each test breaks if the joint execution drops a guarantee the two roles'
modules give: the lock taken first (and a held lock leaving the host alone), the stamp written only
after both steps succeeded, the restart when the flags changed or a restart failed before, each step's
answer recorded and a failure naming its step. The restart command appends to a log file, so the tests
count restarts; the health URL is a local server (test_service_file's fixture).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .test_modules import HOST_STATE, ME, PLAYBOOKS, lock_args, run
from .test_service_file import args as service_args
from .test_service_file import healthz, restarts

__all__ = ["healthz"]  # the fixture, used by name

JOINT = PLAYBOOKS / "library" / "inplace_joint_steps.py"
STEPS = {"kubeadm_files": "s-files", "kubelet_args": "s-flags"}


def joint_args(tmp: Path, content: str = "v1\n", flags: str = "A=1\n", **extra: Any) -> dict[str, Any]:
    files = [{"path": str(tmp / "etc" / "a.conf"), "content": content, "owner": ME, "permissions": "0644"}]
    return {
        "kubeadm_files": {"files": files, "manifest": str(tmp / "state" / "kubeadm_files.json")},
        "kubelet_args": service_args(tmp, flags),
        **extra,
    }


def lock(
    sd: Path, ident: str, fingerprint: str, steps: dict[str, str] = STEPS, **more: Any
) -> dict[str, Any]:
    """The play's host_lock and host_stamp for a run whose first (and last) steps are the joint ones."""
    rider = {
        "ident": ident,
        "fingerprint": fingerprint,
        "steps": steps,
        "token": f"t-{ident}",
        "state_dir": str(sd),
    }
    return {
        "host_lock": {**rider, "step": "kubeadm_files", "poll_seconds": 0.05, **more},
        "host_stamp": {**rider, "after": ["kubelet_args"]},
    }


def stamp(sd: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((sd / "stamp.json").read_text())
    return data


def test_lock_files_flags_restart_and_stamp_in_one_execution(tmp_path: Path, healthz: str) -> None:
    sd = tmp_path / "state"
    got = run(JOINT, tmp_path, {**joint_args(tmp_path), **lock(sd, "a", "fp1")})
    assert got["changed"] is True and "failed" not in got, got
    files, flags = got["steps"]["kubeadm_files"], got["steps"]["kubelet_args"]
    assert files["written"] == [str(tmp_path / "etc" / "a.conf")]
    assert (flags["written"], flags["restarted"]) == (True, True)
    assert (got["host_lock"]["locked"], got["host_stamp"]["released"]) == (True, True)
    assert (tmp_path / "etc" / "a.conf").read_text() == "v1\n"
    assert restarts(tmp_path) == 1
    assert (stamp(sd)["fingerprint"], stamp(sd)["steps"]) == ("fp1", STEPS)
    assert not (sd / "lock").exists()
    assert [json.loads(line)["event"] for line in (sd / "lock.log").read_text().splitlines()] == [
        "acquired",
        "released",
    ]

    # the same update again: the lock is given back at once, nothing touched, no second stamp
    again = run(JOINT, tmp_path, {**joint_args(tmp_path), **lock(sd, "b", "fp1")})
    assert (again["changed"], again["host_lock"]["up_to_date"], "host_stamp" in again) == (False, True, False)
    assert all(step["skipped"] for step in again["steps"].values())
    assert restarts(tmp_path) == 1 and len((sd / "stamp.log").read_text().splitlines()) == 1


def test_new_flags_restart_and_a_step_the_stamp_holds_is_left_alone(tmp_path: Path) -> None:
    sd = tmp_path / "state"
    assert run(JOINT, tmp_path, {**joint_args(tmp_path), **lock(sd, "a", "fp1")})["host_stamp"]["released"]
    (tmp_path / "etc" / "a.conf").write_text("changed by hand\n")  # left as it is: the stamp holds the step
    steps = {**STEPS, "kubelet_args": "s-flags-2"}
    got = run(JOINT, tmp_path, {**joint_args(tmp_path, flags="A=2\n"), **lock(sd, "b", "fp2", steps)})
    assert got["host_lock"]["unchanged"] == ["kubeadm_files"]
    assert got["steps"]["kubeadm_files"] == {"changed": False, "written": [], "removed": [], "skipped": True}
    flags = got["steps"]["kubelet_args"]
    assert (flags["written"], flags["restarted"]) == (True, True)
    assert (tmp_path / "etc" / "a.conf").read_text() == "changed by hand\n"
    assert restarts(tmp_path) == 2
    assert (stamp(sd)["fingerprint"], stamp(sd)["steps"]) == ("fp2", steps)
    # the play's own word that a step is unchanged (an earlier lock task read the stamp) counts as well
    said = run(JOINT, tmp_path, {**joint_args(tmp_path, flags="A=3\n"), "unchanged": ["kubelet_args"]})
    assert said["steps"]["kubelet_args"]["skipped"] is True and restarts(tmp_path) == 2
    assert said["steps"]["kubeadm_files"]["written"] == [str(tmp_path / "etc" / "a.conf")]


def test_a_failed_restart_ends_the_execution_unstamped_and_stays_pending(tmp_path: Path) -> None:
    sd = tmp_path / "state"
    failing = service_args(tmp_path, restart=["/bin/sh", "-c", "echo nope >&2; exit 3"])
    args = {**joint_args(tmp_path), "kubelet_args": failing, **lock(sd, "a", "fp1")}
    got = run(JOINT, tmp_path, args)
    assert got.get("failed") is True and got["step"] == "kubelet_args", got
    assert "restart command /bin/sh failed (rc 3): nope" in got["msg"]
    assert got["steps"]["kubeadm_files"]["written"] == [str(tmp_path / "etc" / "a.conf")]
    assert got["steps"]["kubelet_args"] == {"written": True}
    assert "host_stamp" not in got
    # no stamp (the lock's withdrawal aside), and the lock still held: the play's always: releases it
    assert not (sd / "stamp.json").exists() and (sd / "lock").exists()
    release = lock_args(sd, "unlocked", "a", token="t-a")
    assert run(HOST_STATE, tmp_path, release)["released"] is True
    # the retry finds the flags file in place and still restarts (the marker), then stamps
    retried = run(JOINT, tmp_path, {**joint_args(tmp_path), **lock(sd, "b", "fp1")})
    assert (retried["steps"]["kubelet_args"]["written"], retried["steps"]["kubelet_args"]["restarted"]) == (
        False,
        True,
    )
    assert restarts(tmp_path) == 1 and stamp(sd)["fingerprint"] == "fp1"


def test_a_failing_first_step_runs_no_second_step(tmp_path: Path) -> None:
    sd = tmp_path / "state"
    (tmp_path / "etc" / "a.conf").mkdir(parents=True)  # the file's path is a directory on the host
    got = run(JOINT, tmp_path, {**joint_args(tmp_path), **lock(sd, "a", "fp1")})
    assert got.get("failed") is True and got["step"] == "kubeadm_files", got
    assert "is a directory on the host" in got["msg"]
    assert "kubelet_args" not in got["steps"]
    assert not (tmp_path / "etc" / "svc" / "flags").exists() and restarts(tmp_path) == 0
    assert not (sd / "stamp.json").exists()


def test_a_held_lock_fails_naming_the_holder_and_touches_nothing(tmp_path: Path) -> None:
    sd = tmp_path / "state"
    holder = run(HOST_STATE, tmp_path, lock_args(sd, "locked", "other", fingerprint="fp0"))
    got = run(JOINT, tmp_path, {**joint_args(tmp_path), **lock(sd, "a", "fp1", wait_seconds=0.2)})
    assert got["failed"] is True and "held by run other" in got["msg"]
    assert (got["host_lock"]["locked"], got["host_lock"]["holder"]) == (False, "other")
    assert not (tmp_path / "etc").exists() and restarts(tmp_path) == 0
    assert json.loads((sd / "lock" / "owner.json").read_text())["token"] == holder["token"]


def test_bad_inputs_of_either_step_are_refused_before_the_lock(tmp_path: Path) -> None:
    sd = tmp_path / "state"
    bad_files = joint_args(tmp_path)
    bad_files["kubeadm_files"]["files"][0]["path"] = "relative/a.conf"
    got = run(JOINT, tmp_path, {**bad_files, **lock(sd, "a", "fp1")})
    assert (got["failed"], got["step"]) == (True, "kubeadm_files")
    assert got["msg"] == "invalid kubeadm files: files[0].path must be absolute"
    bad_mode = {**joint_args(tmp_path), "kubelet_args": service_args(tmp_path, mode="9")}
    got = run(JOINT, tmp_path, {**bad_mode, **lock(sd, "a", "fp1")})
    assert (got["failed"], got["step"], got["msg"]) == (True, "kubelet_args", "mode must be octal, e.g. 0644")
    assert not sd.exists() and not (tmp_path / "etc").exists()


def test_the_stamp_waits_for_a_later_step_the_stamp_does_not_show_unchanged(tmp_path: Path) -> None:
    """The play's kubernetes_version after the two: the joint execution that took the lock stamps only when
    the stamp it read shows that step unchanged (host_stamp's ``after``), else the play's stamp task does."""
    sd = tmp_path / "state"
    steps = {**STEPS, "kubernetes_version": "s-version"}
    args = lock(sd, "a", "fp1", steps)
    args["host_stamp"]["after"] = ["kubelet_args", "kubernetes_version"]
    got = run(JOINT, tmp_path, {**joint_args(tmp_path), **args})
    assert "host_stamp" not in got and not (sd / "stamp.json").exists() and (sd / "lock").exists()


def test_check_mode_reports_both_steps_and_touches_nothing(tmp_path: Path) -> None:
    got = run(JOINT, tmp_path, {**joint_args(tmp_path), "_ansible_check_mode": True})
    assert got["changed"] is True
    assert got["steps"]["kubeadm_files"]["written"] == [str(tmp_path / "etc" / "a.conf")]
    flags = got["steps"]["kubelet_args"]
    assert (flags["written"], flags["restarted"]) == (True, False)
    assert not (tmp_path / "etc").exists() and restarts(tmp_path) == 0
