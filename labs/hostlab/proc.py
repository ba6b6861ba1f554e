"""Process and command helpers: run a tool with a precise error, poll a condition, stop a process by PID
(one the lab recorded, or a child of ours).

Processes are only ever stopped by the PID the lab recorded, after checking that the PID still runs
the program we started (PIDs get reused); nothing is killed by name.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from hostlab.errors import LabError

KILLED_SECONDS = 10.0  # a SIGKILLed process ends once the kernel runs it; a bound all the same


def run(
    argv: Sequence[str], *, check: bool = True, timeout: float = 60, input_text: str | None = None
) -> str:
    """Run ``argv`` (never through a shell) and return its stdout; on failure raise LabError with stderr."""
    try:
        proc = subprocess.run(
            list(argv), capture_output=True, text=True, timeout=timeout, input=input_text, check=False
        )
    except FileNotFoundError as exc:
        raise LabError(f"command not found: {argv[0]}") from exc
    except subprocess.TimeoutExpired as exc:
        raise LabError(f"timed out after {timeout:g}s: {' '.join(argv)}") from exc
    if check and proc.returncode != 0:
        detail = (proc.stderr or proc.stdout).strip()
        raise LabError(f"{' '.join(argv)} failed (exit {proc.returncode}): {detail}")
    return proc.stdout


def spawn(argv: Sequence[str], *, output: Path | None, env: dict[str, str]) -> int:
    """Start a long-lived process in its own session (Ctrl-C of the caller does not reach it); return its PID.

    posix_spawn rather than subprocess.Popen: the lab's daemons outlive the Popen object that would
    track them, and a collected Popen of a running child warns (an error under pytest's settings).
    The caller reaps the child when it stops it (``alive`` does).
    """
    out_fd = (
        os.open(output, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        if output
        else os.open(os.devnull, os.O_WRONLY)
    )
    null_fd = os.open(os.devnull, os.O_RDONLY)
    try:
        actions = [
            (os.POSIX_SPAWN_DUP2, null_fd, 0),
            (os.POSIX_SPAWN_DUP2, out_fd, 1),
            (os.POSIX_SPAWN_DUP2, out_fd, 2),
        ]
        try:
            return os.posix_spawnp(argv[0], list(argv), env, file_actions=actions, setsid=True)
        except OSError as exc:
            raise LabError(f"cannot start {argv[0]}: {exc}") from exc
    finally:
        os.close(out_fd)
        os.close(null_fd)


def wait_until(cond: Callable[[], bool], timeout: float, interval: float = 0.05) -> bool:
    """Poll ``cond`` until it is true or ``timeout`` seconds passed; return its last value."""
    deadline = time.monotonic() + timeout
    while True:
        if cond():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)


def cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


# how each child reaped by ``alive`` ended (raw wait status), so an error can say "killed by signal 9"
_ENDINGS: dict[int, int] = {}


def alive(pid: int) -> bool:
    """True if ``pid`` exists and is not a zombie. Reaps it first if it is our own child."""
    with contextlib.suppress(ChildProcessError, OSError):
        reaped, status = os.waitpid(pid, os.WNOHANG)
        if reaped == pid:
            _ENDINGS[pid] = status
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    # the state field follows the parenthesised command name, which may itself contain spaces
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def ending(pid: int) -> str:
    """How our child ``pid`` ended ("exit status 2", "killed by signal 9"), or "" if not known."""
    status = _ENDINGS.get(pid)
    if status is None:
        return ""
    if os.WIFSIGNALED(status):
        return f"killed by signal {os.WTERMSIG(status)} ({signal.Signals(os.WTERMSIG(status)).name})"
    return f"exit status {os.waitstatus_to_exitcode(status)}"


def children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(part) for part in text.split()]


def namespace_init(pid: int) -> int | None:
    """The first process at or below ``pid`` (breadth first) that is PID 1 of a PID namespace of its own:
    a chroot host's init under its ``unshare``, a node's systemd under its ``systemd-nspawn``."""
    queue = [pid]
    while queue:
        current = queue.pop(0)
        try:
            status = Path(f"/proc/{current}/status").read_text()
        except OSError:
            continue
        ns_pids = next((line.split()[1:] for line in status.splitlines() if line.startswith("NSpid:")), [])
        if len(ns_pids) > 1 and ns_pids[-1] == "1":
            return current
        queue.extend(children(current))
    return None


def _parent(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])


def is_ours(pid: int, marker: str) -> bool:
    """True if ``pid`` is alive and is the program we started: our own child (its PID cannot have been
    reused before we reap it), or a process whose command line contains ``marker`` (a path only the
    lab uses; for a lab started by another process, whose PIDs may have been reused since)."""
    if not alive(pid):
        return False
    return _parent(pid) == os.getpid() or any(marker in arg for arg in cmdline(pid))


def not_ours_because(pid: int, marker: str) -> str:
    """Why ``is_ours`` is false, for an error message: how it ended, or what the PID is now."""
    living = alive(pid)  # first: it reaps our ended child, so ``ending`` knows its status
    if (how := ending(pid)) != "":
        return how
    if not living:
        return "ended; exit status unknown (not our child, or reaped elsewhere)"
    return f"PID {pid} now runs {' '.join(cmdline(pid))[:200]!r}, which does not name {marker}"


def stop_child(proc: subprocess.Popen[Any], grace: float) -> None:
    """Stop our child ``proc`` by its PID (which cannot be reused before we reap it): SIGTERM, up to
    ``grace`` seconds to end, then SIGKILL; reaped either way. A child that ended already is only reaped."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(KILLED_SECONDS)


def kill_and_wait(pid: int, sig: int = signal.SIGKILL, timeout: float = 10.0) -> None:
    """Send ``sig`` to ``pid`` and wait until it is gone (reaping it if it is our child)."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)
    if not wait_until(lambda: not alive(pid), timeout):
        raise LabError(f"process {pid} did not exit within {timeout:g}s after signal {sig}")


@contextlib.contextmanager
def file_lock(
    path: Path,
    *,
    timeout: float = 900.0,
    what: str = "lock",
    on_wait: Callable[[], None] | None = None,
    unless: Callable[[], bool] | None = None,
) -> Iterator[bool]:
    """Exclusive advisory lock on ``path`` (created if missing), waiting at most ``timeout`` seconds;
    yields whether it holds the lock.

    ``on_wait`` is called once if the lock is busy, before waiting (to tell the user why nothing happens).
    ``unless`` is asked before each try: once it holds, the wait ends without the lock (yields False), e.g.
    when what the lock's holder makes is there already.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline = time.monotonic() + timeout
        while True:
            if unless is not None and unless():
                yield False
                return
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if on_wait is not None:
                    on_wait()
                    on_wait = None
                if time.monotonic() >= deadline:
                    raise LabError(f"could not take the {what} {path} within {timeout:g}s") from None
                time.sleep(0.2)
        yield True
    finally:
        os.close(fd)
