"""``inplace-extension attempt`` told to stop mid-play (SIGTERM: its Job's Pod deleted or evicted), as a
process of its own and as PID 1 of a PID namespace as in its container (where the kernel drops a signal
the process has no handler for): it ends well within the Pod's grace period, its play's processes gone,
with an interrupted outcome as its termination message, and the host lock its play held is taken over
at once by the next attempt that names its token.

The play is a real ``ansible-playbook`` through the real ansible-runner and detach.py, of a stand-in
playbook (named so: ``connection: local``, this machine is its host) that takes the real host lock
(``inplace_host_state`` with a state dir of the test) and then works for two minutes unless told not to.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from inplace_extension.kubejobs.attempt import STOPPED_EXIT_STATUS
from inplace_extension.kubejobs.manifest import STOP_GRACE_SECONDS
from inplace_extension.kubejobs.spec import AttemptSpec, outcome_of
from inplace_extension.plays.artifacts import play_ended
from inplace_extension.runs.attempts import OutcomeKind
from inplace_extension.runs.resolve import HostTarget

from .test_manifest import request

PLAYBOOKS = Path(__file__).resolve().parents[2] / "playbooks"

STANDIN_PLAYBOOK = """\
# stand-in of update_machine.yml (tests/kubejobs/test_attempt_stop.py): the real host lock, then a long task
- hosts: all
  gather_facts: false
  connection: local
  vars:
    ansible_python_interpreter: "{{{{ ansible_playbook_python }}}}"
  tasks:
    - name: Take the host lock
      inplace_host_state:
        state: locked
        state_dir: {state_dir}
        ident: "{{{{ update_machine_ident }}}}"
        fingerprint: "{{{{ update_machine_fingerprint }}}}"
        token: "{{{{ update_machine_lock_token }}}}"
        takeover_tokens: "{{{{ update_machine_lock_takeover_tokens | default([]) }}}}"
        wait_seconds: 10
    - name: Work for two minutes while the hold file is there
      ansible.builtin.command:
        argv: ["{{{{ ansible_playbook_python }}}}", "-c", "import time; time.sleep(120)", {hold}]
        removes: {hold}
    - name: Give the lock back
      inplace_host_state:
        state: unlocked
        state_dir: {state_dir}
        ident: "{{{{ update_machine_ident }}}}"
        token: "{{{{ update_machine_lock_token }}}}"
"""


def standin_playbooks(root: Path, state_dir: Path, hold: Path) -> Path:
    playbooks = root / "playbooks"
    playbooks.mkdir()
    (playbooks / "update_machine.yml").write_text(STANDIN_PLAYBOOK.format(state_dir=state_dir, hold=hold))
    for shared in ("library", "module_utils"):  # the real lock module and its code, beside the playbook
        (playbooks / shared).symlink_to(PLAYBOOKS / shared)
    return playbooks


def local_target() -> HostTarget:
    return HostTarget(
        address="127.0.0.1",
        port=22,
        user=None,
        private_key_file=None,
        become=False,
        host_keys=(),
        insecure_skip_host_key_check=True,
        python_interpreter=None,
        source="inventory",
    )


def start_attempt(spec: AttemptSpec, work: Path, *, pid_one: bool) -> tuple[subprocess.Popen[bytes], int]:
    """The attempt command as a Job's container starts it; with ``pid_one``, as PID 1 of a new PID
    namespace (``unshare``). The process and the PID of the attempt itself, to signal."""
    spec_file = work / f"attempt-{spec.number}.json"
    spec_file.write_text(spec.encode())
    env = {**os.environ, "INPLACE_RUNS_DIR": str(work / f"scratch-{spec.number}")}
    env.pop("POD_NAME", None)  # not in a Pod: no phase to publish
    argv = [sys.executable, "-m", "inplace_extension", "attempt", "--spec", str(spec_file)]
    argv += ["--termination-log", str(work / f"termination-log-{spec.number}")]
    stderr = (work / f"stderr-{spec.number}").open("wb")  # a file: a pipe nobody reads could block it
    with stderr:
        if not pid_one:
            proc = subprocess.Popen(argv, env=env, stderr=stderr)
            return proc, proc.pid
        userns = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]
        proc = subprocess.Popen(
            ["unshare", *userns, "--pid", "--fork", "--kill-child", "--", *argv], env=env, stderr=stderr
        )
    children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children")
    deadline = time.monotonic() + 30
    while not (pids := children.read_text().split()):
        assert proc.poll() is None and time.monotonic() < deadline, "unshare started no attempt"
        time.sleep(0.02)
    return proc, int(pids[0])


def wait_for(what: str, check: Callable[[], bool], seconds: float, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert proc.poll() is None, f"the attempt ended before {what}"
        assert time.monotonic() < deadline, f"no {what} within {seconds}s"
        time.sleep(0.05)


@pytest.mark.parametrize("pid_one", [True, False], ids=["pid-1", "process"])
def test_sigterm_ends_the_attempt_within_the_grace_period_interrupted_its_lock_for_takeover(
    tmp_path: Path, pid_one: bool
) -> None:
    state_dir, hold = tmp_path / "host-state", tmp_path / "hold"
    hold.touch()
    playbooks = standin_playbooks(tmp_path, state_dir, hold)
    spec = AttemptSpec(
        request=request(),
        target=local_target(),
        number=2,
        token="",
        lock_token="lock-of-attempt-2",
        takeover_tokens=("lock-of-attempt-1",),
        host_checks=(),
        role_vars={},
        roles_paths=(),
        settings={"playbooks_dir": str(playbooks)},
    )
    proc, attempt_pid = start_attempt(spec, tmp_path, pid_one=pid_one)
    owner = state_dir / "lock" / "owner.json"
    batches = tmp_path / "scratch-2" / ".batches"
    try:
        # mid-play: the host lock is the play's, and its long task runs
        wait_for("host lock taken", owner.exists, 120, proc)
        wait_for("long task", lambda: _working(hold), 30, proc)
        os.kill(attempt_pid, signal.SIGTERM)
        stopped = time.monotonic()
        proc.wait(timeout=STOP_GRACE_SECONDS)
        took = time.monotonic() - stopped
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    # not 0: the deleted Pod ends Failed whichever the Job controller sees first (its deletion or its phase)
    assert proc.returncode == STOPPED_EXIT_STATUS == 143, (tmp_path / "stderr-2").read_text()
    assert took < STOP_GRACE_SECONDS / 2, f"the attempt took {took:.1f}s to end after SIGTERM"
    outcome = outcome_of((tmp_path / "termination-log-2").read_text())
    assert outcome is not None and outcome.kind is OutcomeKind.INTERRUPTED, outcome
    assert "SIGTERM" in outcome.detail
    # the play is over (its lease free, its task gone), and the lock it held is still its own
    (batch,) = batches.glob("batch-*")
    assert play_ended(batch)
    assert not _working(hold)
    assert json.loads(owner.read_text())["token"] == "lock-of-attempt-2"
    # the record names its token with its outcome: the next attempt takes the lock over at once
    hold.unlink()
    again = replace(spec, number=3, lock_token="lock-of-attempt-3", takeover_tokens=("lock-of-attempt-2",))
    proc, _ = start_attempt(again, tmp_path, pid_one=False)
    assert proc.wait(timeout=120) == 0, (tmp_path / "stderr-3").read_text()
    events = [json.loads(line) for line in (state_dir / "lock.log").read_text().splitlines()]
    taken = [e for e in events if e.get("event") == "took-over"]
    assert taken and taken[-1]["reason"] == "own-dead-attempt", events
    assert not owner.exists(), "the next attempt gave the lock back"


def _working(hold: Path) -> bool:
    """Whether the play's long task runs: a process whose command line names this test's hold file."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if str(hold).encode() in argv and b"import time; time.sleep(120)" in argv:
                return True
    return False
