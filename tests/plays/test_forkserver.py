"""The fork server (plays/forkserver.py, forkserver_process.py, detach.py's client): a play forked from a
warm ansible-playbook is the play a fresh one would be.

Each play is a real ``ansible-playbook`` through the real ansible-runner and detach.py (runner.start), of
stand-in playbooks (named so: ``connection: local``, this machine is their host) in a playbooks dir of
the test, with a module of their own in ``library/`` (a payload ansible-core caches by name).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from inplace_extension.plays import runner, ssh
from inplace_extension.plays.artifacts import play_ended, stop_play
from inplace_extension.plays.detach import FORK_SERVER_ENV
from inplace_extension.plays.forkserver_process import ForkServer
from inplace_extension.runs.resolve import HostTarget

STANDIN_PLAYBOOK = """\
# stand-in of update_machine.yml (tests/runs/test_forkserver.py): this machine, over connection local
- hosts: all
  gather_facts: false
  connection: local
  vars:
    ansible_python_interpreter: "{{ ansible_playbook_python }}"
  tasks:
    - name: Ask the playbook's own module
      standin_answer:
      register: answer
    - name: Change something
      ansible.builtin.command:
        argv: ["{{ ansible_playbook_python }}", "-c", "print('changed')"]
    - name: Cache a fact in the run's fact cache
      ansible.builtin.set_fact:
        standin_fact: "{{ answer.said }}"
        cacheable: true
    - name: Work while the hold file is there
      ansible.builtin.command:
        argv: ["{{ ansible_playbook_python }}", "-c", "import time; time.sleep(120)", "{{ hold }}"]
        removes: "{{ hold }}"
      when: hold | default('') | length > 0
    - name: Fail when asked to
      ansible.builtin.fail:
        msg: "told to fail"
      when: update_machine_fingerprint == "fail"
"""

STANDIN_MODULE = """\
#!/usr/bin/python
# stand-in module (tests/runs/test_forkserver.py): answers what this file says
from ansible.module_utils.basic import AnsibleModule

AnsibleModule(argument_spec={{}}).exit_json(changed=False, said={said!r})
"""


def standin_playbooks(root: Path, said: str = "first") -> Path:
    playbooks = root / "playbooks"
    (playbooks / "library").mkdir(parents=True, exist_ok=True)
    (playbooks / "update_machine.yml").write_text(STANDIN_PLAYBOOK)
    write_module(playbooks, said)
    return playbooks / "update_machine.yml"


def write_module(playbooks: Path, said: str) -> None:
    (playbooks / "library" / "standin_answer.py").write_text(STANDIN_MODULE.format(said=said))


def local_target() -> HostTarget:
    return HostTarget("127.0.0.1", 22, None, None, False, (), True, None, "inventory")


class Plays:
    """Stand-in plays of one runs dir, started like the service's (runner.start), with or without a
    fork server."""

    def __init__(self, root: Path, fork_server: ForkServer | None) -> None:
        self.root = root
        self.playbook = standin_playbooks(root)
        self.runs_dir = root / "runs"
        self.wrapper = runner.install_wrapper(self.runs_dir)
        self.fork_server = fork_server
        self.count = 0

    def start(
        self,
        fingerprint: str = "ab" * 32,
        hold: Path | None = None,
        on_task: runner.TaskListener | None = None,
    ) -> tuple[runner.RunHandle, Path]:
        self.count += 1
        attempt = self.runs_dir / "m" / f"attempt-{self.count:04d}"
        attempt.mkdir(parents=True)
        run = runner.HostRun("ns.m1", "m1", fingerprint, ("ntp",), {"ntp": {}}, local_target(), attempt)
        batch_dir = self.runs_dir / ".batches" / f"b{self.count}"
        batch_dir.mkdir(parents=True)
        spec = runner.BatchSpec(
            f"b{self.count}",
            batch_dir,
            (run,),
            self.playbook,
            None,
            self.runs_dir,
            self.wrapper,
            role_vars={"hold": str(hold)} if hold is not None else {},
            fork_server=self.fork_server,
        )
        return runner.start(spec, on_task or (lambda host, role, task: None)), batch_dir

    def play(self, fingerprint: str = "ab" * 32) -> tuple[str, list[dict[str, Any]], Path]:
        handle, batch_dir = self.start(fingerprint)
        return handle.wait(), handle.events(), batch_dir


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ForkServer]:
    fork_server = ForkServer(tmp_path / "fork" / "runs", runner.play_python_env())
    yield fork_server
    pid = fork_server.pid()
    fork_server.close(10)  # it retires within a second once its socket is gone
    assert pid is None or not alive(pid), "the fork server outlived its close"
    ssh.close_control_masters(tmp_path / "fork" / "runs")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is dead: our ForkServer reaps it only at its next socket()
    return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"


def wait_for(what: str, check: Callable[[], bool], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, f"no {what} within {seconds}s"
        time.sleep(0.02)


def sequence(events: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """What must be the same: each job event's kind, task, host, changed and rc, in order."""
    out = []
    for event in events:
        data = event.get("event_data") or {}
        res = data.get("res") or {}
        out.append(
            (event.get("event"), data.get("task"), data.get("host"), res.get("changed"), res.get("rc"))
        )
    return out


def forked(server: ForkServer, runs_dir: Path) -> bool:
    """Whether the server's ansible-core cached the stand-in module's payload: a play forked from it built
    it in the server's temporary directory (a fresh ansible-playbook makes one of its own)."""
    pid = server.pid()
    assert pid is not None
    return any((runs_dir / ".ansible" / "tmp").glob(f"ansible-local-{pid}*/ansiballz_cache/*standin_answer*"))


def fact_cached(batch_dir: Path) -> bool:
    return any((batch_dir / "artifacts" / batch_dir.name / "fact_cache").glob("*m1"))


def test_a_forked_play_has_the_status_events_and_artifacts_of_a_fresh_one(
    tmp_path: Path, server: ForkServer
) -> None:
    fresh = Plays(tmp_path / "fresh", None)
    warm = Plays(tmp_path / "fork", server)
    try:
        for fingerprint, status in (("ab" * 32, "successful"), ("fail", "failed")):
            plain = fresh.play(fingerprint)
            first, second = warm.play(fingerprint), warm.play(fingerprint)
            assert plain[0] == first[0] == second[0] == status, (plain[2] / "artifacts").rglob("stdout")
            assert sequence(plain[1]) == sequence(first[1]) == sequence(second[1])
            assert any(e.get("event") == "runner_on_ok" for e in plain[1])
            # ansible-runner's per-run setting (the fact cache's directory) reaches each forked play
            assert fact_cached(plain[2]) and fact_cached(first[2]) and fact_cached(second[2])
            for batch_dir in (plain[2], first[2], second[2]):
                assert (batch_dir / "artifacts" / batch_dir.name / "rc").read_text() == (
                    "0" if status == "successful" else "2"
                )
        assert forked(server, warm.runs_dir)
        assert "fresh ansible-playbook" not in (warm.runs_dir / ".bin" / "forkserver.log").read_text()
    finally:
        ssh.close_control_masters(fresh.runs_dir)


def test_a_stopped_forked_play_ends_as_a_stopped_fresh_one(tmp_path: Path, server: ForkServer) -> None:
    """stop_play (the ``attempt`` command's PlayStop, a stopped Pod) signals the play's process group,
    which the forked child leads as a fresh ansible-playbook does; the wrapper reports it as killed."""
    results = []
    for name, fork_server in (("fresh", None), ("fork", server)):
        plays = Plays(tmp_path / name, fork_server)
        hold = tmp_path / f"{name}.hold"
        hold.touch()
        try:
            waiter, batch_dir = start_working(plays, hold)
            wait_for("the play's group in the lease", partial(stop_play, batch_dir, signal.SIGTERM), 10)
            status = waiter.status(30)
            results.append((status, (batch_dir / "artifacts" / batch_dir.name / "rc").read_text()))
            # ansible-core's worker leads a session of its own: the module it waits for outlives the
            # signal of the play's group, in a fresh ansible-playbook as in a forked one (PlayStop's
            # SIGKILL does not reach it either); ended here, the worker ends and the lease is free
            end_play(hold, batch_dir)
        finally:
            ssh.close_control_masters(plays.runs_dir)
    assert results[0] == results[1], results
    assert results[1][0] == "failed"


class Waiter:
    """A started play's status, waited for in a thread of its own."""

    def __init__(self, handle: runner.RunHandle) -> None:
        self.result: list[str] = []
        self.thread = threading.Thread(target=lambda: self.result.append(handle.wait()))
        self.thread.start()

    def status(self, seconds: float) -> str:
        self.thread.join(seconds)
        assert not self.thread.is_alive(), f"the play did not end within {seconds}s"
        return self.result[0]


def end_play(hold: Path, batch_dir: Path) -> None:
    """Wait for the play's processes to be gone, SIGKILLing the long task's process (its argv names
    ``hold``) by its pid if the worker ran it (it may start it after the controller was stopped)."""
    wait_for("the long task's end", lambda: play_ended(batch_dir) or _kill_holding(hold), 30)
    wait_for("the play's lease free", partial(play_ended, batch_dir), 30)


def _kill_holding(hold: Path) -> bool:
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if str(hold).encode() in argv and b"import time; time.sleep(120)" in argv:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(proc.name), signal.SIGKILL)
                return True
    return False


def start_working(plays: Plays, hold: Path) -> tuple[Waiter, Path]:
    """A play started and at its long task (it works until ``hold`` is removed)."""
    working = threading.Event()

    def on_task(host: str, role: str | None, task: str) -> None:
        if task.startswith("Work while"):
            working.set()

    handle, batch_dir = plays.start(hold=hold, on_task=on_task)
    waiter = Waiter(handle)
    assert working.wait(60), "the long task did not start"
    return waiter, batch_dir


def test_a_dead_server_costs_only_speed_and_is_started_again(tmp_path: Path, server: ForkServer) -> None:
    """Killed between plays, the next play finds a new server; killed during a play, that play ends as a
    killed one (its group killed, its lease free) and the next one runs through a new server."""
    plays = Plays(tmp_path / "fork", server)
    try:
        assert plays.play()[0] == "successful"
        first = server.pid()
        assert first is not None
        os.kill(first, signal.SIGKILL)
        wait_for("the killed server's end", lambda: server.pid() != first, 10)
        assert plays.play()[0] == "successful"
        second = server.pid()
        assert second not in (None, first)
        assert forked(server, plays.runs_dir)

        hold = tmp_path / "hold"
        hold.touch()
        waiter, batch_dir = start_working(plays, hold)
        assert second is not None
        os.kill(second, signal.SIGKILL)  # mid-play: nobody is left to report the play's end
        assert waiter.status(30) == "failed"
        end_play(hold, batch_dir)
        assert plays.play()[0] == "successful"
        assert server.pid() not in (None, first, second)
    finally:
        ssh.close_control_masters(plays.runs_dir)


def test_a_changed_module_retires_the_server_and_the_next_play_sees_it(
    tmp_path: Path, server: ForkServer
) -> None:
    """ansible-core caches a module's payload by its name in the server's temporary directory: a changed
    file under the playbook's directory sends the play to a fresh ansible-playbook and retires the
    server, so no forked play ever runs a stale payload."""
    plays = Plays(tmp_path / "fork", server)

    def said() -> str:
        events = plays.play()[1]
        results = [e for e in events if e.get("event") == "runner_on_ok"]
        return str(results[0]["event_data"]["res"]["said"])

    try:
        assert said() == "first"
        old = server.pid()
        write_module(plays.playbook.parent, "second")
        assert said() == "second"  # a fresh ansible-playbook: the server answered "fresh"
        assert said() == "second"  # through a new server
        assert server.pid() not in (None, old)
        assert forked(server, plays.runs_dir)
    finally:
        ssh.close_control_masters(plays.runs_dir)


def test_a_child_whose_settings_differ_runs_a_fresh_ansible_playbook(
    tmp_path: Path, server: ForkServer
) -> None:
    """ansible-core froze its configuration when the server imported it: a request whose environment
    gives a base setting another value (here ``ANSIBLE_FORKS``) is run by a plain exec, which honours it."""
    playbook = standin_playbooks(tmp_path)
    socket = server.socket()
    assert socket is not None
    wrapper = runner.install_wrapper(tmp_path / "fork" / "runs")
    env = {
        **os.environ,
        **runner.play_python_env(),
        FORK_SERVER_ENV: socket,
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]),
        "ANSIBLE_HOME": str(tmp_path / "home"),
    }
    argv = [str(wrapper), str(playbook), "-i", "m1,", "-e", "update_machine_fingerprint=x"]
    seen = []
    for forks in ("5", "5", "7"):
        proc = subprocess.run(argv, env={**env, "ANSIBLE_FORKS": forks}, capture_output=True, timeout=120)
        assert proc.returncode == 0, proc.stdout.decode()
        seen.append(proc.stdout)
    log = (tmp_path / "fork" / "runs" / ".bin" / "forkserver.log").read_text()
    assert log.count("fresh ansible-playbook") == 1, log
    assert "DEFAULT_FORKS" in log
    assert all(b"ok=3" in out for out in seen)


PRELOAD_PROBE = """\
import json, sys
from inplace_extension.plays import forkserver
forkserver._preload({"argv": sys.argv[1:], "env": {}})
from ansible import constants as C
from ansible.utils.collection_loader import AnsibleCollectionConfig
asked = [("inventory", "yaml"), ("inventory", "script"), ("callback", "default"), ("callback", "junit"),
         ("callback", "tree"), ("callback", "minimal"), ("callback", "awx_display"), ("cache", "jsonfile"),
         ("lookup", "ansible_collections.ansible.builtin.plugins.lookup.file")]
files = sorted(str(getattr(m, "__file__", "") or "") for m in list(sys.modules.values()))
defined = sorted(f"{k}/{n}" for k, n in asked if C.config.has_configuration_definition(k, n))
print(json.dumps({"finder": AnsibleCollectionConfig.collection_finder is not None,
                  "builtin": "ansible_collections.ansible.builtin" in sys.modules,
                  "defined": defined, "files": files}))
"""


def test_the_server_preloads_only_ansible_cores_own_plugins(tmp_path: Path) -> None:
    """What every play loads first is loaded once in the server (forkserver._preload): the collection
    loader with ansible.builtin's routing, and the documentation of ansible-core's inventory, callback,
    cache, strategy and lookup plugins the play loads by name. A plugin of a configured directory is never
    loaded there (the server does not watch its files), nor ansible-runner's callback (it reads the
    run's data dir when imported), nor a plugin the playbook's directory has one of its own of (a run
    searches there first): here a callback of a configured directory named as one of ansible-core's
    (``minimal``), ansible-runner's ``awx_display`` on the callback path and a ``junit`` beside the
    playbook stay the child's."""
    import ansible_runner

    own = tmp_path / "callbacks"
    own.mkdir()
    (own / "minimal.py").write_text("raise SystemExit('the server loaded a configured callback')\n")
    runner_callbacks = Path(ansible_runner.__file__).parent / "display_callback" / "callback"
    playbooks = tmp_path / "playbooks"
    (playbooks / "callback_plugins").mkdir(parents=True)
    (playbooks / "callback_plugins" / "junit.py").write_text("raise SystemExit('the server loaded it')\n")
    (playbooks / "site.yml").write_text("- hosts: all\n  tasks: []\n")
    env = {
        **os.environ,
        "ANSIBLE_CALLBACK_PLUGINS": os.pathsep.join([str(own), str(runner_callbacks)]),
        "ANSIBLE_CACHE_PLUGIN": "jsonfile",
        "ANSIBLE_STRATEGY": "free",
        "ANSIBLE_HOME": str(tmp_path / "home"),
        "PYTHONWARNINGS": "ignore",
    }
    probe = subprocess.run(
        [sys.executable, "-c", PRELOAD_PROBE, "--skip-tags", "x", str(playbooks / "site.yml")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert probe.returncode == 0, probe.stderr
    seen = json.loads(probe.stdout.splitlines()[-1])
    assert seen["finder"] and seen["builtin"]
    # minimal: found in the configured directory first; awx_display: ansible-runner's; junit: the playbook's
    assert seen["defined"] == [
        "cache/jsonfile",
        "callback/default",
        "callback/tree",
        "inventory/script",
        "inventory/yaml",
        "lookup/ansible_collections.ansible.builtin.plugins.lookup.file",
    ]
    assert not [f for f in seen["files"] if f.startswith((str(own), str(runner_callbacks), str(playbooks)))]
