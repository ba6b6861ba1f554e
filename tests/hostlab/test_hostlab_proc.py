"""hostlab.proc: whether a recorded PID is still the program we started, and how it ended.

A lab component counts as running while it is our unreaped child (its PID cannot be reused then),
whatever its command line says; when it ended, the error names its exit status or signal.
"""

from __future__ import annotations

import os
import signal

from hostlab.proc import alive, is_ours, not_ours_because, spawn, wait_until


def test_our_running_child_is_ours_even_without_the_marker_in_its_command_line() -> None:
    pid = spawn(["sleep", "60"], output=None, env=dict(os.environ))
    try:
        assert is_ours(pid, "/no/such/lab/dir")
    finally:
        os.kill(pid, signal.SIGKILL)
    assert wait_until(lambda: not is_ours(pid, "/no/such/lab/dir"), 10)
    assert not_ours_because(pid, "/no/such/lab/dir") == "killed by signal 9 (SIGKILL)"
    assert not alive(pid)


def test_an_exited_child_is_reported_with_its_exit_status() -> None:
    pid = spawn(["sh", "-c", "exit 3"], output=None, env=dict(os.environ))
    assert wait_until(lambda: not is_ours(pid, "sh"), 10)
    assert not_ours_because(pid, "sh") == "exit status 3"


def test_a_process_that_is_not_our_child_is_judged_by_its_command_line() -> None:
    # PID 1 is never our child: only the marker decides
    assert is_ours(1, "") is alive(1)
    assert not is_ours(1, "/no/such/lab/dir")
    assert not_ours_because(1, "/no/such/lab/dir").startswith("PID 1 now runs ")
