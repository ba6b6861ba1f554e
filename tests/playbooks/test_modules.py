"""The playbooks' own Ansible modules, run locally as Ansible runs them (no lab needed).

``inplace_host_state`` (playbooks/library) and ``inplace_files`` (roles/kubeadm_files/library) are
executed as processes with an ``ANSIBLE_MODULE_ARGS`` file, in a temporary directory, and judged by
their JSON result and by what they leave on disk.
"""

from __future__ import annotations

import grp
import json
import os
import pwd
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

PLAYBOOKS = Path(__file__).resolve().parents[2] / "playbooks"
HOST_STATE = PLAYBOOKS / "library" / "inplace_host_state.py"
FILES = PLAYBOOKS / "roles" / "kubeadm_files" / "library" / "inplace_files.py"
ME = f"{pwd.getpwuid(os.geteuid()).pw_name}:{grp.getgrgid(os.getegid()).gr_name}"


# Ansible sends a module with the module_utils it imports packed under ansible.module_utils; run here,
# the playbooks' own module_utils/ is put on that package's path the same way (argv: the module, the args).
BOOT = (
    "import runpy, sys, ansible.module_utils as mu; mu.__path__.append(sys.argv[1]); "
    "sys.argv = sys.argv[2:]; runpy.run_path(sys.argv[0], run_name='__main__')"
)


def start(module: Path, tmp: Path, args: dict[str, Any]) -> subprocess.Popen[str]:
    args_file = tmp / f"args-{time.monotonic_ns()}.json"
    args_file.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": args}))
    return subprocess.Popen(
        [sys.executable, "-c", BOOT, str(PLAYBOOKS / "module_utils"), str(module), str(args_file)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def result(proc: subprocess.Popen[str]) -> dict[str, Any]:
    out, err = proc.communicate(timeout=60)
    assert out, err
    data: dict[str, Any] = json.loads(out)
    return data


def run(module: Path, tmp: Path, args: dict[str, Any]) -> dict[str, Any]:
    return result(start(module, tmp, args))


def lock_args(state_dir: Path, state: str, ident: str, **extra: Any) -> dict[str, Any]:
    return {"state": state, "ident": ident, "state_dir": str(state_dir), "poll_seconds": 0.05, **extra}


def lock_log(state_dir: Path) -> list[tuple[str, str]]:
    lines = (state_dir / "lock.log").read_text().splitlines()
    return [(json.loads(line)["event"], json.loads(line)["ident"]) for line in lines]


# --- inplace_host_state -------------------------------------------------------------------------


def test_lock_stamp_release_and_up_to_date_short_circuit(tmp_path: Path) -> None:
    sd = tmp_path / "state"
    got = run(HOST_STATE, tmp_path, lock_args(sd, "locked", "a", fingerprint="fp1"))
    assert (got["locked"], got["up_to_date"], got["changed"]) == (True, False, False)
    owner = json.loads((sd / "lock" / "owner.json").read_text())
    assert (owner["ident"], owner["token"]) == ("a", got["token"])
    stamped = run(HOST_STATE, tmp_path, lock_args(sd, "stamped", "a", fingerprint="fp1", token=got["token"]))
    assert (stamped["changed"], stamped["fingerprint"]) == (True, "fp1")
    released = run(HOST_STATE, tmp_path, lock_args(sd, "unlocked", "a", token=got["token"]))
    assert released["released"] is True
    assert not (sd / "lock").exists()
    assert json.loads((sd / "stamp.json").read_text())["fingerprint"] == "fp1"

    again = run(HOST_STATE, tmp_path, lock_args(sd, "locked", "b", fingerprint="fp1"))
    assert (again["locked"], again["up_to_date"], again["applied_fingerprint"]) == (False, True, "fp1")
    assert not (sd / "lock").exists()
    assert len((sd / "stamp.log").read_text().splitlines()) == 1
    assert lock_log(sd) == [("acquired", "a"), ("released", "a"), ("acquired", "b"), ("released", "b")]


def test_stamp_with_release_gives_the_lock_back_in_the_same_execution(tmp_path: Path) -> None:
    sd = tmp_path / "state"
    got = run(HOST_STATE, tmp_path, lock_args(sd, "locked", "a", fingerprint="fp1"))
    args = lock_args(sd, "stamped", "a", fingerprint="fp1", token=got["token"], release=True)
    stamped = run(HOST_STATE, tmp_path, args)
    assert (stamped["changed"], stamped["fingerprint"], stamped["released"]) == (True, "fp1", True)
    assert not (sd / "lock").exists()
    # the playbook's always: release is skipped then; had it run, it would find nothing of its own
    assert run(HOST_STATE, tmp_path, lock_args(sd, "unlocked", "a", token=got["token"]))["released"] is False
    assert lock_log(sd) == [("acquired", "a"), ("released", "a")]


def test_a_waiting_run_gets_the_lock_when_it_is_released(tmp_path: Path) -> None:
    sd = tmp_path / "state"
    first = run(HOST_STATE, tmp_path, lock_args(sd, "locked", "a", fingerprint="fp1"))
    waiting = start(HOST_STATE, tmp_path, lock_args(sd, "locked", "b", fingerprint="fp2", wait_seconds=30))
    deadline = time.monotonic() + 30
    # b announces itself in lock.log once it has found the lock held
    while ("waiting", "b") not in lock_log(sd):
        assert waiting.poll() is None, result(waiting)
        assert time.monotonic() < deadline, "b never started waiting"
        time.sleep(0.02)  # poll interval
    run(HOST_STATE, tmp_path, lock_args(sd, "unlocked", "a", token=first["token"]))
    second = result(waiting)
    assert second["locked"] is True
    assert lock_log(sd) == [("acquired", "a"), ("waiting", "b"), ("released", "a"), ("acquired", "b")]


def test_a_run_that_waited_for_the_same_fingerprint_ends_up_to_date(tmp_path: Path) -> None:
    sd = tmp_path / "state"
    first = run(HOST_STATE, tmp_path, lock_args(sd, "locked", "a", fingerprint="same"))
    waiting = start(
        HOST_STATE, tmp_path, lock_args(sd, "locked", "a-again", fingerprint="same", wait_seconds=30)
    )
    deadline = time.monotonic() + 30
    while ("waiting", "a-again") not in lock_log(sd):
        assert waiting.poll() is None, result(waiting)
        assert time.monotonic() < deadline, "the second run never started waiting"
        time.sleep(0.02)  # poll interval
    run(HOST_STATE, tmp_path, lock_args(sd, "stamped", "a", fingerprint="same", token=first["token"]))
    run(HOST_STATE, tmp_path, lock_args(sd, "unlocked", "a", token=first["token"]))
    second = result(waiting)
    assert (second["locked"], second["up_to_date"]) == (False, True)
    assert not (sd / "lock").exists()
    assert len((sd / "stamp.log").read_text().splitlines()) == 1


def test_a_held_lock_times_out_naming_the_holder_and_is_left_alone(tmp_path: Path) -> None:
    sd = tmp_path / "state"
    first = run(HOST_STATE, tmp_path, lock_args(sd, "locked", "holder.ident", fingerprint="fp1"))
    got = run(HOST_STATE, tmp_path, lock_args(sd, "locked", "b", fingerprint="fp2", wait_seconds=0.3))
    assert got["failed"] is True
    assert lock_log(sd) == [("acquired", "holder.ident"), ("waiting", "b")]
    assert "held by run holder.ident" in got["msg"]
    assert got["holder"] == "holder.ident"
    # another run's token cannot release or stamp
    other = run(HOST_STATE, tmp_path, lock_args(sd, "unlocked", "b", token="f" * 32))
    assert (other["released"], other["holder"]) == (False, "holder.ident")
    stamp = run(HOST_STATE, tmp_path, lock_args(sd, "stamped", "b", fingerprint="fp2", token="f" * 32))
    assert stamp["failed"] is True
    assert "no longer holds the host lock (now held by holder.ident)" in stamp["msg"]
    assert json.loads((sd / "lock" / "owner.json").read_text())["token"] == first["token"]


def test_a_stale_lock_is_taken_over_and_its_owner_cannot_stamp(tmp_path: Path) -> None:
    sd = tmp_path / "state"
    old = run(HOST_STATE, tmp_path, lock_args(sd, "locked", "old", fingerprint="fp1"))
    owner_file = sd / "lock" / "owner.json"
    owner = json.loads(owner_file.read_text())
    owner["acquired_at"] -= 100
    owner_file.write_text(json.dumps(owner))
    new = run(HOST_STATE, tmp_path, lock_args(sd, "locked", "new", fingerprint="fp2", stale_seconds=50))
    assert (new["locked"], new["took_over_from"]) == (True, "old")
    late = run(HOST_STATE, tmp_path, lock_args(sd, "stamped", "old", fingerprint="fp1", token=old["token"]))
    assert late["failed"] is True
    assert lock_log(sd)[-2:] == [("took-over", "new"), ("acquired", "new")]


def test_a_lock_left_by_a_dead_attempt_of_the_same_machine_is_taken_over_at_once(tmp_path: Path) -> None:
    """The service names the tokens of this ident's plays that it saw end; only those are taken over."""
    sd = tmp_path / "state"
    dead_token, live_token = "d" * 32, "e" * 32
    dead = run(HOST_STATE, tmp_path, lock_args(sd, "locked", "ns.m.fp", fingerprint="fp", token=dead_token))
    assert (dead["locked"], dead["token"]) == (True, dead_token)
    # another Machine with that token, or this Machine naming another token: the holder may be alive
    other = lock_args(
        sd, "locked", "ns.other.fp", fingerprint="fp", wait_seconds=0.3, takeover_tokens=[dead_token]
    )
    assert run(HOST_STATE, tmp_path, other)["failed"] is True
    unknown = lock_args(
        sd, "locked", "ns.m.fp", fingerprint="fp", wait_seconds=0.3, takeover_tokens=[live_token]
    )
    assert run(HOST_STATE, tmp_path, unknown)["failed"] is True
    # this Machine naming the dead play's token: no wait, not even for stale_seconds
    mine = lock_args(
        sd,
        "locked",
        "ns.m.fp",
        fingerprint="fp",
        wait_seconds=0,
        token=live_token,
        takeover_tokens=[dead_token],
    )
    got = run(HOST_STATE, tmp_path, mine)
    assert (got["locked"], got["took_over_from"], got["token"]) == (True, "ns.m.fp", live_token)
    entries = [json.loads(line) for line in (sd / "lock.log").read_text().splitlines()]
    assert [(e["event"], e.get("reason")) for e in entries[-2:]] == [
        ("took-over", "own-dead-attempt"),
        ("acquired", None),
    ]
    late = run(HOST_STATE, tmp_path, lock_args(sd, "stamped", "ns.m.fp", fingerprint="fp", token=dead_token))
    assert late["failed"] is True  # the dead play, were it alive after all, could not stamp


def _apply(sd: Path, tmp: Path, ident: str, fingerprint: str, steps: dict[str, str]) -> dict[str, Any]:
    """One whole run as the playbook makes it: lock (with the step fingerprints), stamp with release."""
    got = run(HOST_STATE, tmp, lock_args(sd, "locked", ident, fingerprint=fingerprint, steps=steps))
    if got["locked"]:
        args = lock_args(sd, "stamped", ident, fingerprint=fingerprint, steps=steps, token=got["token"])
        run(HOST_STATE, tmp, {**args, "release": True})
    return got


def test_steps_the_stamp_holds_with_the_same_fingerprint_are_unchanged(tmp_path: Path) -> None:
    sd = tmp_path / "state"
    first = _apply(
        sd, tmp_path, "a", "fp1", {"kubeadm_files": "f1", "kubelet_args": "k1", "kubernetes_version": "v1"}
    )
    assert first["unchanged"] == []  # no stamp yet: every step runs
    stamp = json.loads((sd / "stamp.json").read_text())
    assert stamp["steps"] == {"kubeadm_files": "f1", "kubelet_args": "k1", "kubernetes_version": "v1"}

    # new files, same flags and version: only kubeadm_files runs; the rest is skipped, in run order
    steps = {"kubeadm_files": "f2", "kubelet_args": "k1", "kubernetes_version": "v1"}
    got = run(HOST_STATE, tmp_path, lock_args(sd, "locked", "b", fingerprint="fp2", steps=steps))
    assert (got["locked"], got["up_to_date"], got["unchanged"]) == (
        True,
        False,
        ["kubelet_args", "kubernetes_version"],
    )
    # before anything changes, the stamp no longer claims the old update nor the step about to run
    withdrawn = json.loads((sd / "stamp.json").read_text())
    assert withdrawn["fingerprint"] is None
    assert withdrawn["steps"] == {"kubelet_args": "k1", "kubernetes_version": "v1"}
    assert withdrawn["changing"] == "b"
    args = lock_args(sd, "stamped", "b", fingerprint="fp2", steps=steps, token=got["token"], release=True)
    run(HOST_STATE, tmp_path, args)
    assert json.loads((sd / "stamp.json").read_text())["steps"] == steps
    # the same update again: up to date, every step counts as unchanged, the stamp is not touched
    again = _apply(sd, tmp_path, "b", "fp2", steps)
    assert (again["up_to_date"], again["unchanged"]) == (True, list(steps))
    assert [json.loads(line)["ident"] for line in (sd / "stamp.log").read_text().splitlines()] == ["a", "b"]


def test_a_run_that_fails_half_way_leaves_no_claim_on_the_steps_it_ran(tmp_path: Path) -> None:
    """B changes kubelet_args and dies before its stamp; C goes back to A's inputs: it must run
    kubelet_args again (the host may hold B's flags), and A's whole fingerprint is no longer a no-op."""
    sd = tmp_path / "state"
    steps_a = {"kubeadm_files": "f1", "kubelet_args": "k1"}
    _apply(sd, tmp_path, "a", "fpA", steps_a)
    b = run(
        HOST_STATE,
        tmp_path,
        lock_args(sd, "locked", "b", fingerprint="fpB", steps={"kubeadm_files": "f1", "kubelet_args": "k2"}),
    )
    assert b["unchanged"] == ["kubeadm_files"]
    run(HOST_STATE, tmp_path, lock_args(sd, "unlocked", "b", token=b["token"]))  # failed: always: release
    c = run(HOST_STATE, tmp_path, lock_args(sd, "locked", "c", fingerprint="fpA", steps=steps_a))
    assert (c["locked"], c["up_to_date"], c["unchanged"]) == (True, False, ["kubeadm_files"])


def test_a_stamp_without_steps_makes_every_step_run(tmp_path: Path) -> None:
    """A host stamped before per-step fingerprints existed: {fingerprint, ident, applied_at} only."""
    sd = tmp_path / "state"
    sd.mkdir()
    (sd / "stamp.json").write_text(json.dumps({"fingerprint": "old", "ident": "x", "applied_at": 1.0}))
    same = run(HOST_STATE, tmp_path, lock_args(sd, "locked", "x", fingerprint="old", steps={"ntp": "n1"}))
    assert (same["up_to_date"], same["locked"]) == (True, False)  # its whole fingerprint still counts
    got = run(HOST_STATE, tmp_path, lock_args(sd, "locked", "y", fingerprint="new", steps={"ntp": "n1"}))
    assert (got["locked"], got["up_to_date"], got["unchanged"]) == (True, False, [])
    # and a run without step fingerprints (a caller from before them) skips nothing either
    run(HOST_STATE, tmp_path, lock_args(sd, "unlocked", "y", token=got["token"]))
    (sd / "stamp.json").write_text(
        json.dumps({"fingerprint": "f", "ident": "x", "applied_at": 1.0, "steps": {"ntp": "n1"}})
    )
    plain = run(HOST_STATE, tmp_path, lock_args(sd, "locked", "z", fingerprint="new"))
    assert (plain["locked"], plain["unchanged"]) == (True, [])


def test_check_mode_reports_the_unchanged_steps_and_touches_nothing(tmp_path: Path) -> None:
    sd = tmp_path / "state"
    _apply(sd, tmp_path, "a", "fp1", {"ntp": "n1", "users": "u1"})
    before = (sd / "stamp.json").read_text()
    args = lock_args(sd, "locked", "b", fingerprint="fp2", steps={"ntp": "n1", "users": "u2"})
    got = run(HOST_STATE, tmp_path, {**args, "_ansible_check_mode": True})
    assert (got["locked"], got["unchanged"]) == (False, ["ntp"])
    assert (sd / "stamp.json").read_text() == before
    assert not (sd / "lock").exists()


def test_bad_timings_are_refused(tmp_path: Path) -> None:
    got = run(HOST_STATE, tmp_path, lock_args(tmp_path, "locked", "a", fingerprint="f", stale_seconds=0))
    assert got["failed"] is True
    assert "stale_seconds and poll_seconds > 0" in got["msg"]


# --- inplace_files ------------------------------------------------------------------------------


def files_args(tmp: Path, files: list[dict[str, Any]]) -> dict[str, Any]:
    return {"files": files, "manifest": str(tmp / "state" / "files.json")}


def test_files_written_appended_converged_and_removed(tmp_path: Path) -> None:
    whole = tmp_path / "etc" / "deep" / "whole.conf"
    shared = tmp_path / "shared.conf"
    shared.write_text("theirs\n")
    files: list[dict[str, Any]] = [
        {"path": str(whole), "content": "v1\n", "owner": ME, "permissions": "0640"},
        {"path": str(shared), "content": "ours", "owner": ME, "permissions": "0644", "append": True},
    ]
    first = run(FILES, tmp_path, files_args(tmp_path, files))
    assert (first["changed"], first["written"]) == (True, [str(whole), str(shared)])
    assert whole.read_text() == "v1\n"
    assert whole.stat().st_mode & 0o7777 == 0o640
    block = f"# BEGIN inplace-extension {shared}\nours\n# END inplace-extension {shared}\n"
    assert shared.read_text() == "theirs\n" + block
    assert first["invocation"]["module_args"]["files"][0]["content"] == "VALUE_SPECIFIED_IN_NO_LOG_PARAMETER"

    second = run(FILES, tmp_path, files_args(tmp_path, files))
    assert (second["changed"], second["written"], second["removed"]) == (False, [], [])
    assert shared.read_text() == "theirs\n" + block

    whole.chmod(0o600)  # drift in mode alone is repaired
    third = run(FILES, tmp_path, files_args(tmp_path, files))
    assert third["written"] == [str(whole)]
    assert whole.stat().st_mode & 0o7777 == 0o640

    gone = run(FILES, tmp_path, files_args(tmp_path, []))
    assert sorted(gone["removed"]) == sorted([str(whole), str(shared)])
    assert not whole.exists()
    assert shared.read_text() == "theirs\n"


def test_files_written_before_a_failing_one_are_recorded_and_removed_by_the_next_run(tmp_path: Path) -> None:
    kept, written, later = tmp_path / "kept.conf", tmp_path / "written.conf", tmp_path / "later.conf"
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where a directory is needed\n")

    def entry(path: Path, content: str = "x\n") -> dict[str, Any]:
        return {"path": str(path), "content": content, "owner": ME, "permissions": "0644"}

    run(FILES, tmp_path, files_args(tmp_path, [entry(kept)]))
    # the old state's kept.conf is still listed; written.conf lands, then the third entry cannot be written
    failing = [entry(kept), entry(written), entry(blocker / "f.conf"), entry(later)]
    failed = run(FILES, tmp_path, files_args(tmp_path, failing))
    assert failed["failed"] is True and failed["msg"].startswith(f"cannot write {blocker / 'f.conf'}")
    assert written.exists() and not later.exists()
    manifest = json.loads((tmp_path / "state" / "files.json").read_text())
    assert sorted(f["path"] for f in manifest["files"]) == sorted([str(kept), str(written)])
    # a later desired state without them removes both: nothing of the failed run stays unmanaged
    after = run(FILES, tmp_path, files_args(tmp_path, [entry(later)]))
    assert sorted(after["removed"]) == sorted([str(kept), str(written)])
    assert not kept.exists() and not written.exists() and later.exists()


def test_files_switching_from_whole_to_append_does_not_keep_our_old_text(tmp_path: Path) -> None:
    path = tmp_path / "f.conf"
    entry = {"path": str(path), "content": "whole\n", "owner": ME, "permissions": "0644"}
    run(FILES, tmp_path, files_args(tmp_path, [entry]))
    run(FILES, tmp_path, files_args(tmp_path, [{**entry, "content": "block", "append": True}]))
    assert path.read_text() == f"# BEGIN inplace-extension {path}\nblock\n# END inplace-extension {path}\n"


def test_files_symlink_is_replaced_not_followed(tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.write_text("keep me\n")
    link = tmp_path / "link.conf"
    link.symlink_to(target)
    run(FILES, tmp_path, files_args(tmp_path, [{"path": str(link), "content": "new\n", "owner": ME}]))
    assert not link.is_symlink()
    assert link.read_text() == "new\n"
    assert target.read_text() == "keep me\n"


def test_files_invalid_entries_are_refused_all_at_once_and_nothing_is_written(tmp_path: Path) -> None:
    good = tmp_path / "good.conf"
    files = [
        {"path": str(good), "content": "some file text", "owner": ME},
        {"path": "relative", "content": "some file text"},
        {"path": f"{tmp_path}/a/../b", "content": "some file text"},
        {"path": str(good), "content": "duplicate text", "owner": ME},
        {"path": f"{tmp_path}/m", "content": "some file text", "owner": ME, "permissions": "rw-r--r--"},
        {"path": f"{tmp_path}/o", "content": "some file text", "owner": "no-such-user-here:root"},
        {
            "path": f"{tmp_path}/g",
            "content": "some file text",
            "owner": f"{ME.split(':')[0]}:no-such-group-here",
        },
    ]
    got = run(FILES, tmp_path, files_args(tmp_path, files))
    assert got["failed"] is True
    for expected in (
        "files[1].path must be absolute",
        "files[2].path must not contain '..'",
        "files[3].path repeats an earlier entry's path",
        "files[4].permissions must be an octal mode",
        "files[5].owner: owner names a user that does not exist",
        "files[6].owner: owner names a group that does not exist",
    ):
        assert expected in got["msg"]
    assert not good.exists()


def test_files_take_the_lock_first_and_leave_their_work_to_the_stamp(tmp_path: Path) -> None:
    """``host_lock``: the module takes the lock and reads the stamp in its own execution before the files
    (the play's first step); it leaves the files alone when the stamp shows this step applied with these
    inputs, and does nothing but give the lock back when the host has the whole update."""
    sd, conf = tmp_path / "state", tmp_path / "a.conf"
    files = [{"path": str(conf), "content": "v1\n", "owner": ME, "permissions": "0644"}]
    steps = {"kubeadm_files": "s1", "kubelet_args": "s2"}

    def lock(ident: str, fingerprint: str, **more: Any) -> dict[str, Any]:
        rider = {"step": "kubeadm_files", "ident": ident, "fingerprint": fingerprint, "steps": steps}
        return {"host_lock": {**rider, "token": f"token-{ident}", "state_dir": str(sd), **more}}

    first = run(FILES, tmp_path, {**files_args(tmp_path, files), **lock("a", "fp1")})
    assert (first["written"], first["host_lock"]["locked"], first["host_lock"]["unchanged"]) == (
        [str(conf)],
        True,
        [],
    )
    assert (
        json.loads((sd / "lock" / "owner.json").read_text())["token"] == "token-a"
    )  # held for the next steps
    stamped = lock_args(sd, "stamped", "a", fingerprint="fp1", steps=steps, token="token-a", release=True)
    assert run(HOST_STATE, tmp_path, stamped)["released"] is True

    conf.write_text("changed by hand\n")  # left as it is by a step the stamp shows applied
    unchanged = run(FILES, tmp_path, {**files_args(tmp_path, files), **lock("b", "fp2")})
    assert (unchanged["changed"], unchanged["written"], unchanged["host_lock"]["unchanged"]) == (
        False,
        [],
        ["kubeadm_files", "kubelet_args"],
    )
    assert conf.read_text() == "changed by hand\n" and (sd / "lock").exists()
    stamped = lock_args(sd, "stamped", "b", fingerprint="fp2", steps=steps, token="token-b", release=True)
    assert run(HOST_STATE, tmp_path, stamped)["released"] is True  # the play's stamp task, then

    # the whole update is there: the lock goes back in the same execution, no stamp written with it
    stamp_rider = {
        "ident": "c",
        "fingerprint": "fp1",
        "steps": steps,
        "token": "token-c",
        "state_dir": str(sd),
    }
    args = {**files_args(tmp_path, files), **lock("c", "fp2"), "host_stamp": stamp_rider}
    up_to_date = run(FILES, tmp_path, args)
    assert (up_to_date["changed"], up_to_date["host_lock"]["up_to_date"], "host_stamp" in up_to_date) == (
        False,
        True,
        False,
    )
    assert not (sd / "lock").exists()
    assert len((sd / "stamp.log").read_text().splitlines()) == 2


def test_files_that_cannot_have_the_lock_fail_naming_the_holder_and_write_nothing(tmp_path: Path) -> None:
    sd, conf = tmp_path / "state", tmp_path / "a.conf"
    holder = run(HOST_STATE, tmp_path, lock_args(sd, "locked", "other", fingerprint="fp0"))
    files = [{"path": str(conf), "content": "v1\n", "owner": ME, "permissions": "0644"}]
    rider = {"step": "kubeadm_files", "ident": "a", "fingerprint": "fp1", "token": "t", "state_dir": str(sd)}
    got = run(FILES, tmp_path, {**files_args(tmp_path, files), "host_lock": {**rider, "wait_seconds": 0.2}})
    assert got["failed"] is True and "held by run other" in got["msg"]
    assert (got["host_lock"]["locked"], got["host_lock"]["holder"]) == (False, "other")
    assert not conf.exists()
    assert json.loads((sd / "lock" / "owner.json").read_text())["token"] == holder["token"]
