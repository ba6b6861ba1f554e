"""The service's fork server (forkserver.py): started by exec at the first play, started again if it died.

One per service process of the ``local`` executor (``--fork-server``, on by default). It is exec'd, never
forked from this threaded process, in a session of its own (it outlives the service, as detach.py's
plays do, and retires once the service is gone), with the Python settings a play's interpreter gets, and
listens on a socket of its own under the runs dir (a new name per start: a retiring server unlinks its
own). The play's wrapper (detach.py) is told the socket through ``INPLACE_EXTENSION_FORK_SERVER``; a
server that died or retired costs that play only speed (a fresh ansible-playbook), and the next play
starts a new one. The ``kubernetes`` executor plays one attempt per Pod: nothing to share, no server.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from inplace_extension.plays.detach import FORK_SERVER_ENV

log = logging.getLogger(__name__)

__all__ = ["FORK_SERVER_ENV", "ForkServer"]

SOCKET_PATH_MAX = 100  # a unix socket's path has room for 107 bytes
BIND_SECONDS = 5.0  # how long a play waits for a just-started server's socket before it goes without


class ForkServer:
    """Starts the fork server when a play asks for its socket and none is running; reaps dead ones."""

    def __init__(self, state_dir: Path, python_env: dict[str, str]) -> None:
        """``state_dir``: the runs dir (the program and sockets go under its ``.bin``); ``python_env``: the
        ``PYTHON*`` variables of a play's interpreter (the server's must be the same)."""
        self._bin = state_dir / ".bin"
        self._python_env = dict(python_env)
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._socket: Path | None = None
        self._retired: list[subprocess.Popen[bytes]] = []  # still serving their last children
        self._starts = itertools.count(1)

    def socket(self) -> str | None:
        """The running server's socket, after starting one if there is none (or it died, or retired);
        None when none could be started (the play then runs as a new ansible-playbook)."""
        with self._lock:
            self._retired = [proc for proc in self._retired if proc.poll() is None]
            proc, path = self._proc, self._socket
            if proc is not None and path is not None and proc.poll() is None and path.exists():
                return str(path)
            if proc is not None:
                if proc.poll() is None:
                    self._retired.append(proc)  # its socket is gone: it exits after its last child
                else:
                    log.warning(
                        "fork server (pid %d) ended with %s; starting a new one", proc.pid, proc.returncode
                    )
            try:
                self._proc, self._socket = self._start()
            except OSError as exc:
                log.warning("fork server not started (%s): plays start a new ansible-playbook", exc)
                self._proc, self._socket = None, None
                return None
            return str(self._socket)

    def pid(self) -> int | None:
        """The running server's pid (for tests and logs)."""
        with self._lock:
            return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    def _start(self) -> tuple[subprocess.Popen[bytes], Path]:
        self._bin.mkdir(mode=0o700, parents=True, exist_ok=True)
        program = self._bin / "forkserver.py"
        tmp = self._bin / ".forkserver.py.tmp"
        tmp.write_text(
            Path(__file__).with_name("forkserver.py").read_text(encoding="utf-8"), encoding="utf-8"
        )
        tmp.replace(program)
        # a name of its own per start and process: a retiring server unlinks only its own socket, and a
        # restarted service never connects to the server of the process before it
        path = _socket_dir(self._bin) / f"fs-{os.getpid()}-{next(self._starts)}.sock"
        path.unlink(missing_ok=True)
        log_file = (self._bin / "forkserver.log").open("ab")
        with log_file:
            proc = subprocess.Popen(
                [sys.executable, str(program), str(path)],
                env={**os.environ, **self._python_env},  # what a play's environment has (runner.py)
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=log_file,
                start_new_session=True,
            )
        # the server binds its socket before it imports anything: a play started now finds it
        deadline = time.monotonic() + BIND_SECONDS
        while not path.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        log.info("fork server started (pid %d, %s)", proc.pid, path)
        return proc, path

    def close(self, timeout: float = 0.0) -> None:
        """Have the server retire: it forks no more and exits once its last play has ended (runs are
        never killed); wait up to ``timeout`` seconds for that (a server still serving a play then is
        left to end on its own, reaped by the next call). The next :meth:`socket` starts a new one."""
        with self._lock:
            if self._socket is not None:
                self._socket.unlink(missing_ok=True)
            if self._proc is not None:
                self._retired.append(self._proc)
            self._proc, self._socket = None, None
            deadline = time.monotonic() + timeout
            while any(proc.poll() is None for proc in self._retired) and time.monotonic() < deadline:
                time.sleep(0.02)
            self._retired = [proc for proc in self._retired if proc.poll() is None]


def _socket_dir(bin_dir: Path) -> Path:
    """Where the sockets go: beside the program unless that path is too long for a socket (then a
    directory of ours in the temporary directory, named after the runs dir, as ssh.py's sockets)."""
    if len(str(bin_dir)) + len("/fs-4194304-999999.sock") <= SOCKET_PATH_MAX:
        return bin_dir
    digest = hashlib.sha256(str(bin_dir).encode()).hexdigest()[:10]
    short = Path(tempfile.gettempdir()) / f"inplace-fs-{os.getuid()}-{digest}"
    short.mkdir(mode=0o700, exist_ok=True)
    if short.stat().st_uid != os.getuid() or short.stat().st_mode & 0o077:
        raise OSError(f"{short} is not a private directory of ours")
    return short
