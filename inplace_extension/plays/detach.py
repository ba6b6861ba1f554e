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

With ``INPLACE_EXTENSION_FORK_SERVER`` set (the local executor's service, forkserver_process.py), the
ansible-playbook is a child of the service's fork server (forkserver.py) instead of a new process: we
send it our argv, environment, cwd and umask with our stdin and the output pipe, and relay the pipe
and the child's exit status as for our own child (a signal's death as a negative status, as
``Popen.wait`` gives it). The child leads its own session and holds the lease, as ansible-playbook
does here. A server that is not there, or answers ``fresh``, costs only speed: we run ansible-playbook
ourselves. A server that dies during the play leaves nobody to report the play's status: we kill the
play's process group, and the attempt ends as a killed play does.
Standard library only: it runs as a script, not as part of the package.
"""

from __future__ import annotations

import array
import contextlib
import fcntl
import json
import os
import selectors
import signal
import socket
import struct
import subprocess
import sys
from pathlib import Path

FORK_SERVER_ENV = "INPLACE_EXTENSION_FORK_SERVER"  # the fork server's socket (forkserver_process.py)
CONNECT_SECONDS = 5.0  # to connect and send; the server answers at once (or after its one-time import)
KILLED = -signal.SIGKILL  # the status of a play whose server died under it


def main(argv: list[str]) -> int:
    # the pty hanging up must not end us: we are the pipe's only reader
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    lease = _hold_lease(os.environ.get("INPLACE_EXTENSION_PLAY_LEASE", ""))
    # a pipe would make Python block-buffer ansible's output; runner reads live events from it
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    server = env.pop(FORK_SERVER_ENV, "")
    if server:
        status = _through_server(server, argv, env, lease)
        if status is not None:
            return status
    proc = subprocess.Popen(
        ["ansible-playbook", *argv],
        # ansible-playbook (and the workers it forks) hold the lease too, so it is free only once the
        # play's last process is gone, whichever of us dies first
        pass_fds=lease,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env=env,
    )
    _name_group(lease, proc.pid)
    pipe = proc.stdout
    if pipe is None:  # cannot happen with stdout=PIPE; keeps the type checker honest
        raise RuntimeError("no pipe from ansible-playbook")
    relay = _Relay()
    while chunk := os.read(pipe.fileno(), 65536):
        relay.write(chunk)
    return proc.wait()


class _Relay:
    """Our stdout (ansible-runner's pty) for the play's output, until the service is gone."""

    def __init__(self) -> None:
        self.forwarding = True

    def write(self, chunk: bytes) -> None:
        if self.forwarding:
            try:
                sys.stdout.buffer.write(chunk)
                sys.stdout.buffer.flush()
            except OSError:
                self.forwarding = False  # the service is gone; keep draining so the play is never blocked


def _through_server(path: str, argv: list[str], env: dict[str, str], lease: tuple[int, ...]) -> int | None:
    """Have the fork server run the play; its exit status, or None when we are to run it ourselves."""
    read_end, write_end = os.pipe()
    stdin = os.open(os.devnull, os.O_RDONLY)
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.settimeout(CONNECT_SECONDS)
        conn.connect(path)
        umask = os.umask(0)
        os.umask(umask)
        body = json.dumps({"argv": argv, "env": env, "cwd": str(Path.cwd()), "umask": umask}).encode()
        fds = array.array("i", [stdin, write_end, *lease])
        conn.sendmsg([struct.pack(">I", len(body))], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
        conn.sendall(body)
        conn.settimeout(None)  # the server's first request imports ansible-core before it answers
        received = b""
        while b"\n" not in received and (data := conn.recv(4096)):
            received += data
    except OSError:
        received = b""
    finally:
        os.close(stdin)
        os.close(write_end)  # the child has its own; the pipe ends when the play's last process is gone
    first, _, rest = received.partition(b"\n")
    if first == b"fresh":  # the server forked nothing (it may still hold its copy of the pipe a moment)
        conn.close()
        os.close(read_end)
        return None
    if not first.startswith(b"pid "):
        conn.close()
        if _writers_gone(read_end):
            os.close(read_end)
            return None  # no child: run ansible-playbook ourselves
        # the server died between its fork and its answer: a play we cannot name runs; relay it
        _relay_pipe(read_end)
        return KILLED
    pid = int(first.split()[1])
    _name_group(lease, pid)
    return _follow(pid, read_end, conn, rest)


def _follow(pid: int, read_end: int, conn: socket.socket, lines: bytes) -> int:
    """Relay the play's output until the pipe ends, and its status from the server."""
    relay = _Relay()
    selector = selectors.DefaultSelector()
    selector.register(read_end, selectors.EVENT_READ)
    selector.register(conn, selectors.EVENT_READ)
    status: int | None = None
    pipe_open = True
    server_open = True
    status = _status(lines)
    while pipe_open or (server_open and status is None):
        for key, _ in selector.select():
            if key.fileobj == read_end:
                chunk = os.read(read_end, 65536)
                if chunk:
                    relay.write(chunk)
                else:
                    pipe_open = False
                    selector.unregister(read_end)
            else:
                data = conn.recv(4096)
                lines += data
                status = _status(lines) if status is None else status
                if not data:
                    server_open = False
                    selector.unregister(conn)
                    if status is None:
                        _kill_group(pid)  # nobody will report this play's end: it ends as killed
    os.close(read_end)
    conn.close()
    return KILLED if status is None else status


def _status(lines: bytes) -> int | None:
    """The play's exit status once the server's ``exit <wait status>`` line is in."""
    word, _, value = lines.partition(b"\n")[0].partition(b" ")
    if b"\n" not in lines or word != b"exit":
        return None
    return os.waitstatus_to_exitcode(int(value))


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(OSError):
        os.killpg(pgid, signal.SIGKILL)


def _writers_gone(read_end: int) -> bool:
    """Whether nobody holds the pipe's write end any more (a read would say end of file at once)."""
    selector = selectors.DefaultSelector()
    selector.register(read_end, selectors.EVENT_READ)
    if not selector.select(0):
        return False
    chunk = os.read(read_end, 65536)
    _Relay().write(chunk)
    return chunk == b""


def _relay_pipe(read_end: int) -> None:
    relay = _Relay()
    while chunk := os.read(read_end, 65536):
        relay.write(chunk)
    os.close(read_end)


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
