"""The fork server: a warm ``ansible-playbook`` for every attempt of one service process.

ansible-core spends most of a play's controller start-up importing itself and parsing the documentation
of its connection, shell and become plugins (bench/README.md, issue 40). This program, started once by
exec (:mod:`inplace_extension.plays.forkserver_process`), does that once, single-threaded, and then forks
one child per request that runs ansible-core's public console entry point (``ansible.cli.playbook:main``,
the ``ansible-playbook`` script) with the request's argv, environment, cwd and umask, on the stdin and
output pipe the request passed: each attempt is still one ansible-playbook run, through ansible-runner
and detach.py (the client, which asks for the child and relays its output and exit status).

What keeps a child equal to a fresh ``ansible-playbook``:

- ansible-core loads its configuration when it is imported, so the server imports it only at its first
  request, with that request's environment, cwd and umask (the service's attempt environment), and each
  child compares every base setting it would see as a fresh process (its own environment and cwd, the
  same ``ansible.cfg``, unchanged) with what was frozen; any difference but
  :data:`SETTINGS_READ_WHEN_USED` makes the child exec a fresh ``ansible-playbook`` instead (a plain
  exec: same pid, pipes and process group). The interpreter's own ``PYTHON*`` variables, read at its
  start, are compared the same way.
- ansible-core's AnsiballZ payload cache lives in the temporary directory it makes at import, shared by
  the children; a payload is keyed by the module's name, so when a file under the playbook's directory,
  the roles, library or module_utils paths changes, the server forks no more: it answers ``fresh`` (the
  client runs a fresh ``ansible-playbook``) and retires, and the service starts a new one.
- Only ansible-core's connection, shell and become plugins are preloaded (what ``PlaybookExecutor.run``
  primes); never a callback: ansible-runner's reads the run's data dir when it is imported.
- A child ends with ``os._exit`` after flushing: a normal exit would run the server's clean-up and delete
  the shared temporary directory.
- The server leads a session of its own and outlives the service (a play survives the service's
  restart); once its service is gone it retires: no new children, and it exits when its last child has
  been reaped and its status sent (then ansible-core's clean-up removes the temporary directory).

Protocol, on a unix stream socket: the client sends a 4-byte big-endian length with SCM_RIGHTS fds
(stdin, the output pipe's write end, and optionally the play lease), then that many bytes of JSON
``{"argv", "env", "cwd", "umask"}``; the server answers ``pid <n>\\n`` once the child is forked, then
``exit <wait status>\\n`` when it is reaped; or ``fresh\\n`` when it will not fork. Standard library and
ansible-core only: it runs as a script, not as part of the package.
"""

from __future__ import annotations

import array
import contextlib
import hashlib
import importlib
import json
import os
import selectors
import shutil
import signal
import socket
import struct
import sys
import traceback
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

# base settings that ansible-runner sets per run and ansible-core reads only where they are used, after
# the child has its own environment: the fact cache's directory (the ``jsonfile`` cache plugin's
# ``_uri`` option, read when the play's variable manager loads the plugin; ``C.CACHE_PLUGIN_CONNECTION``
# is used nowhere). tests/plays/test_forkserver.py checks that a child's facts land in its own run's dir.
SETTINGS_READ_WHEN_USED = frozenset({"CACHE_PLUGIN_CONNECTION"})
# environment variables ansible-core's defaults are made from (``~``, the user, the temporary directory)
DEFAULTS_FROM = ("HOME", "USER", "LOGNAME", "TMPDIR")
# settings whose value is made, not read (a fresh temporary directory per process): never compared
MADE_SETTING_TYPES = frozenset({"tmppath", "temppath", "tmp"})
# the trees whose files the AnsiballZ payloads are built from: beyond this many files the server gives up
# watching them and answers every request ``fresh``
WATCHED_FILES_MAX = 5000
# how long a client may take to send its request (the server serves one at a time)
REQUEST_SECONDS = 10.0
PARENT_CHECK_SECONDS = 1.0


class Refused(Exception):
    """This request gets ``fresh``: the client runs a fresh ansible-playbook."""


class Warm:
    """ansible-core imported with the first request's environment: what the children are compared to."""

    def __init__(self, request: dict[str, Any], python: dict[str, str]) -> None:
        _enter(request)
        from ansible.cli.playbook import main  # imports ansible-core and loads its configuration

        _preload(request)
        self.main: Callable[[], None] = main
        self.settings = _settings()
        self.python = python  # what this interpreter read when it started
        self.trees = _trees(request)
        self.files = _fingerprint(self.trees)
        os.chdir("/")  # the first request's cwd (a batch dir) may be removed while the server lives

    def unchanged(self) -> bool:
        return self.files is not None and _fingerprint(self.trees) == self.files


def _preload(request: dict[str, Any]) -> None:
    """Do once, in the server, what every ``ansible-playbook`` run does first with the same settings: its
    children find it done (about 0.1 s of each play's CPU and wall time, bench/README.md, issue 40).

    - The collection loader, as ``CLI.run`` installs it (``init_plugin_loader``: ansible-playbook has no
      collections path argument, so the child's own call would install the same one; it finds this one
      and leaves it, with a Python warning :func:`_child` silences), and ``ansible.builtin``'s routing
      metadata, which the first plugin a run loads through it parses (``ansible_builtin_runtime.yml``).
    - The documentation of the plugins a play loads by name, parsed into the configuration's definitions
      (``PlaybookExecutor.run`` primes every connection, shell and become plugin; the inventory manager
      loads the enabled inventory plugins, the task queue manager every callback, the variable manager
      the fact cache; the strategy, the ``file`` lookup and the ``normal`` action every play of ours
      uses). Only ansible-core's own: a plugin of a configured directory is not among the files the
      server watches (:func:`_trees`), and ansible-runner's callback reads the run's data dir when it is
      imported, so a name that finds another plugin first is left to the child, and so is a name the
      playbook's own directory has a plugin of (``callback_plugins/`` beside the playbook, which a run
      searches first: the child must read that plugin's documentation, not find ansible-core's read).
    """
    import ansible
    from ansible import constants
    from ansible.plugins import callback
    from ansible.plugins.loader import (
        action_loader,
        become_loader,
        cache_loader,
        callback_loader,
        connection_loader,
        init_plugin_loader,
        inventory_loader,
        lookup_loader,
        shell_loader,
        strategy_loader,
    )

    init_plugin_loader()
    importlib.import_module("ansible_collections.ansible.builtin")
    for loader in (connection_loader, shell_loader, become_loader):
        list(loader.all(class_only=True))
    core = Path(ansible.__file__).parent
    callbacks = sorted(path.stem for path in Path(callback.__file__).parent.glob("*.py"))
    beside = [Path(path) for path in _playbook_dirs(request)]
    for loader, names in (
        (inventory_loader, list(constants.INVENTORY_ENABLED)),
        (callback_loader, [name for name in callbacks if name != "__init__"]),
        (cache_loader, [constants.CACHE_PLUGIN]),
        (strategy_loader, [constants.DEFAULT_STRATEGY]),
        (lookup_loader, ["ansible.builtin.file"]),
        (action_loader, ["ansible.legacy.normal"]),
    ):
        for name in names:
            own = f"{name.rsplit('.', 1)[-1]}.py"
            if any((directory / loader.subdir / own).exists() for directory in beside):
                continue
            found = loader.find_plugin_with_context(name)
            path = found.plugin_resolved_path if found.resolved else None
            if path and Path(path).resolve().is_relative_to(core):
                loader.get(name, class_only=True)


def _enter(request: dict[str, Any]) -> None:
    """Take the request's environment, cwd and umask (in the server before import, in a child)."""
    os.umask(int(request["umask"]))
    os.chdir(str(request["cwd"]))
    os.environ.clear()
    os.environ.update({str(k): str(v) for k, v in dict(request["env"]).items()})


def _settings() -> dict[str, Any]:
    """What ansible-core's base settings are made of in this process: the environment variables each
    setting reads (and those its defaults are made from), the config file it finds (its path and content),
    and the cwd when an environment variable gives a setting a relative path (resolved against it).
    Comparing what settings are made of, not their values: ansible-core templates its defaults (``{{
    ANSIBLE_HOME ~ ... }}``) only while it loads ``ansible.constants``, so a value read later is not the
    one a fresh process would hold."""
    from ansible import constants
    from ansible.config.manager import find_ini_config_file

    inputs: dict[str, Any] = {name: os.environ.get(name) for name in DEFAULTS_FROM}
    relative = False
    for name, definition in constants.config.get_configuration_definitions().items():
        if definition.get("type") in MADE_SETTING_TYPES or name in SETTINGS_READ_WHEN_USED:
            continue
        for entry in definition.get("env") or ():
            value = os.environ.get(str(entry.get("name")))
            inputs[f"{name}:{entry.get('name')}"] = value
            if value and "path" in str(definition.get("type")) and not value.startswith(("/", "~")):
                relative = True
    cfg = find_ini_config_file()
    inputs["<ansible.cfg>"] = (cfg, _digest(cfg) if cfg else None)
    if relative:
        inputs["<cwd>"] = str(Path.cwd())
    return inputs


def _digest(path: str) -> str | None:
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return None


def _python_env(env: dict[str, str]) -> dict[str, str]:
    """The interpreter's own settings, read when it starts (the server's are its exec's)."""
    return {k: v for k, v in env.items() if k.startswith("PYTHON")}


def _playbook_dirs(request: dict[str, Any]) -> list[str]:
    """The directories of the playbooks on the request's command line (relative to its cwd)."""
    return [
        str(Path(arg).absolute().parent)
        for arg in request["argv"]
        if str(arg).endswith((".yml", ".yaml")) and Path(arg).is_file()
    ]


def _trees(request: dict[str, Any]) -> tuple[str, ...]:
    """Where module code may come from: the playbook's directory, the config file's, and the roles,
    library and module_utils paths of the environment."""
    env: dict[str, str] = request["env"]
    trees: list[str] = _playbook_dirs(request)
    cfg = env.get("ANSIBLE_CONFIG")
    if cfg:
        trees.append(str(Path(cfg).absolute().parent))
    for name in ("ANSIBLE_ROLES_PATH", "ANSIBLE_LIBRARY", "ANSIBLE_MODULE_UTILS"):
        trees += [path for path in env.get(name, "").split(os.pathsep) if path]
    return tuple(dict.fromkeys(trees))


def _fingerprint(trees: tuple[str, ...]) -> str | None:
    """A digest of every file's path, size and mtime under ``trees`` (None: too many to watch)."""
    digest = hashlib.sha256()
    for count, (path, size, mtime) in enumerate(_walk(trees), 1):
        if count > WATCHED_FILES_MAX:
            return None
        digest.update(f"{path}\0{size}\0{mtime}\n".encode())
    return digest.hexdigest()


def _walk(trees: tuple[str, ...]) -> Iterator[tuple[str, int, int]]:
    for tree in trees:
        for root, dirs, files in os.walk(tree, followlinks=True):
            # bytecode Python writes beside a plugin it imports is not a change of the plugin
            dirs[:] = sorted(name for name in dirs if name != "__pycache__")
            for name in sorted(files):
                path = Path(root, name)
                try:
                    stat = path.stat()
                except OSError:
                    continue
                yield str(path), stat.st_size, stat.st_mtime_ns


def _differences(warm: Warm, python: dict[str, str], settings: dict[str, Any]) -> list[str]:
    """The names of what a fresh process would see otherwise than the server froze it."""
    differ = [
        name for name in sorted(set(python) | set(warm.python)) if python.get(name) != warm.python.get(name)
    ]
    names = sorted(set(settings) | set(warm.settings))
    return differ + [name for name in names if settings.get(name) != warm.settings.get(name)]


def _child(warm: Warm, request: dict[str, Any], fds: list[int], others: list[int], log: int) -> None:
    """In the forked child: become the request's ansible-playbook; never returns."""
    status = 70  # EX_SOFTWARE: anything that went wrong before ansible-playbook ran
    try:
        os.setsid()  # the play's process group, which stop_play() signals, as detach.py's Popen makes
        for fd in others:
            os.close(fd)
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGCHLD, signal.SIGTERM):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a fresh interpreter
        signal.signal(signal.SIGHUP, signal.SIG_IGN)  # as detach.py's own child inherits it
        stdin, out, *lease = fds
        os.dup2(stdin, 0)
        os.dup2(out, 1)
        os.dup2(out, 2)
        os.close(stdin)
        os.close(out)
        for fd in lease:
            os.set_inheritable(fd, True)  # held by the play and its processes, as detach.py's pass_fds
        _enter(request)
        # the ansible-playbook detach.py would start: the first on the play's PATH
        program = shutil.which("ansible-playbook") or str(Path(sys.executable).parent / "ansible-playbook")
        argv = [program, *[str(arg) for arg in request["argv"]]]
        differ = _differences(warm, _python_env(dict(os.environ)), _settings())
        if differ:
            # settings differ from what the server froze: a plain exec, as without the server
            os.write(log, f"forkserver: pid {os.getpid()} runs a fresh ansible-playbook: {differ}\n".encode())
            os.execve(program, argv, dict(os.environ))  # noqa: S606 - ansible-playbook's argv, no shell
        sys.argv = argv
        # CLI.run installs the collection loader, which the server did (_preload): it says so, and leaves it
        warnings.filterwarnings("ignore", message="AnsibleCollectionFinder has already been configured")
        try:
            warm.main()
            status = 0
        except SystemExit as exc:
            status = _exit_status(exc.code)
    except BaseException:  # the child must reach os._exit whatever happens
        with contextlib.suppress(BaseException):
            traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(status)


def _exit_status(code: object) -> int:
    """What the interpreter exits with for ``SystemExit(code)``."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


class Server:
    """One listening socket, one child per request, statuses sent as children are reaped."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.parent = os.getppid()
        self.python = _python_env(dict(os.environ))
        self.log = os.dup(2)  # the server's log (a child's own stderr is its play's output)
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(path)
        self.inode = Path(path).stat().st_ino
        self.listener.listen(64)
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(self.wake_w, False)
        signal.set_wakeup_fd(self.wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so that the wakeup fd is written
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        self.children: dict[int, socket.socket] = {}
        self.warm: Warm | None = None
        self.retiring = False

    def serve(self) -> None:
        selector = selectors.DefaultSelector()
        selector.register(self.listener, selectors.EVENT_READ)
        selector.register(self.wake_r, selectors.EVENT_READ)
        while not (self.retiring and not self.children):
            for key, _ in selector.select(PARENT_CHECK_SECONDS):
                if key.fileobj is self.listener and not self.retiring:
                    self._accept()
                elif key.fileobj == self.wake_r:
                    _drain(self.wake_r)
            self._reap()
            if not self.retiring and (os.getppid() != self.parent or not self._bound()):
                self.retire()  # the service is gone or closed us: it starts a new server when it needs one
            if self.retiring and self.listener.fileno() >= 0:
                selector.unregister(self.listener)
                self.listener.close()

    def _accept(self) -> None:
        conn, _ = self.listener.accept()
        fds: list[int] = []
        try:
            conn.settimeout(REQUEST_SECONDS)
            request, fds = _receive(conn)
            if self.warm is None:
                self.warm = Warm(request, self.python)
            elif not self.warm.unchanged():
                print(
                    "forkserver: files changed under the playbook's, roles or module paths: a fresh "
                    "ansible-playbook runs this play, and a new server the next",
                    file=sys.stderr,
                    flush=True,
                )
                self.retire()
                raise Refused
            pid = os.fork()
            if pid == 0:
                others = [self.listener.fileno(), self.wake_r, self.wake_w, conn.fileno()]
                others += [c.fileno() for c in self.children.values()]
                _child(self.warm, request, fds, others, self.log)
            self.children[pid] = conn
            with contextlib.suppress(OSError):  # the client is gone: the play goes on, never "fresh" now
                conn.sendall(f"pid {pid}\n".encode())
        except Refused:
            _close(fds)  # before the answer: the client's pipe has no writer of ours left when it reads it
            _answer(conn, b"fresh\n")
        except Exception as exc:  # a bad request or a failed import: this client runs a fresh process
            print(
                f"forkserver: request refused (a fresh ansible-playbook runs it): {exc!r}",
                file=sys.stderr,
                flush=True,
            )
            _close(fds)
            _answer(conn, b"fresh\n")
            if self.warm is None:
                self.retire()  # ansible-core did not import: nothing to fork from
        finally:
            _close(fds)

    def _bound(self) -> bool:
        try:
            return Path(self.path).stat().st_ino == self.inode
        except OSError:
            return False

    def retire(self) -> None:
        self.retiring = True
        if self._bound():
            Path(self.path).unlink()

    def _reap(self) -> None:
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            conn = self.children.pop(pid, None)
            if conn is not None:
                _answer(conn, f"exit {status}\n".encode())


def _close(fds: list[int]) -> None:
    """Close the descriptors a request passed us, once (the list is emptied)."""
    while fds:
        os.close(fds.pop())


def _answer(conn: socket.socket, message: bytes) -> None:
    with contextlib.suppress(OSError):  # the client is gone (killed with its pty): its play goes on
        conn.sendall(message)
    conn.close()


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 512):
            pass
    except BlockingIOError:
        pass


def _receive(conn: socket.socket) -> tuple[dict[str, Any], list[int]]:
    fds = array.array("i")
    data, ancdata, _, _ = conn.recvmsg(4, socket.CMSG_SPACE(8 * fds.itemsize))
    for level, kind, payload in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
    received = list(fds)
    if len(data) != 4 or not 2 <= len(received) <= 3:
        for fd in received:
            os.close(fd)
        raise ValueError("malformed request header")
    (length,) = struct.unpack(">I", data)
    body = b""
    while len(body) < length:
        chunk = conn.recv(min(65536, length - len(body)))
        if not chunk:
            break
        body += chunk
    try:
        request = json.loads(body)
        for key in ("argv", "env", "cwd", "umask"):
            request[key]
    except (ValueError, KeyError, TypeError):
        for fd in received:
            os.close(fd)
        raise
    return request, received


def main(argv: list[str]) -> int:
    server = Server(argv[0])
    try:
        server.serve()
    finally:
        if not server.retiring:
            server.retire()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
