"""ansible-playbook, detached from ansible-runner's pty so that a run outlives a killed service.

ansible-runner starts its command on a pty it owns. When the service dies (SIGKILL, OOM), the pty
hangs up and ansible-playbook dies with it, in the middle of a role and holding the host lock, which
then wedges the host until the lock counts as stale. Run through this wrapper (``runner.py`` installs
it under the runs dir and passes it as ansible-runner's ``binary``), ansible-playbook lives in its own
session and writes into a pipe we drain: when the pty goes away the wrapper keeps draining, the play
finishes and releases the lock, and the restarted service's next attempt finds the stamp.
When the whole pod dies, the play dies too: the play lease (``INPLACE_EXTENSION_PLAY_LEASE``, a file
we flock() and hand down to ansible-playbook) is then free, and the next attempt of the same Machine
takes over the lock its dead play left at once (artifacts.py). The lease names ansible-playbook's
process group (its pid, written into the file once it runs), so that a process told to stop (the
``attempt`` command in a Job whose Pod is deleted) can end the play: artifacts.stop_play().
Standard library only: it runs as a script, not as part of the package.
"""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys


def main(argv: list[str]) -> int:
    # the pty hanging up must not end us: we are the pipe's only reader
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    lease = _hold_lease(os.environ.get("INPLACE_EXTENSION_PLAY_LEASE", ""))
    proc = subprocess.Popen(
        ["ansible-playbook", *argv],
        # ansible-playbook (and the workers it forks) hold the lease too, so it is free only once the
        # play's last process is gone, whichever of us dies first
        pass_fds=lease,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        # a pipe would make Python block-buffer ansible's output; runner reads live events from it
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    _name_group(lease, proc.pid)
    pipe = proc.stdout
    if pipe is None:  # cannot happen with stdout=PIPE; keeps the type checker honest
        raise RuntimeError("no pipe from ansible-playbook")
    out = sys.stdout.buffer
    forwarding = True
    while chunk := os.read(pipe.fileno(), 65536):
        if forwarding:
            try:
                out.write(chunk)
                out.flush()
            except OSError:
                forwarding = False  # the service is gone; keep draining so the play is never blocked
    return proc.wait()


def _hold_lease(path: str) -> tuple[int, ...]:
    """flock() the play lease for as long as this process (and whoever inherits the fd) lives."""
    if not path:
        return ()
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return (fd,)


def _name_group(lease: tuple[int, ...], pgid: int) -> None:
    """Write the play's process group (ansible-playbook leads a session of its own) into the lease."""
    for fd in lease:
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(pgid).encode(), 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
