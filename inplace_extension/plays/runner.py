"""The ansible-runner adapter: the one module that imports ``ansible_runner``.

It prepares a fresh private data dir for one batch of Machine attempts (per Machine: inputs file,
host variables with the SSH settings of ssh.py), starts ``update_machine.yml`` once for all of them with
``run_async`` and reports live task starts per host. It never decides what an
outcome means (that is :mod:`inplace_extension.plays.outcomes`); ansible-runner exceptions become
:class:`RunStartError` here. Used by :mod:`inplace_extension.runs.service` from worker threads only.
"""

from __future__ import annotations

import logging
import os
import shlex
import sys
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ansible_runner

import inplace_extension
from inplace_extension.inplace.capabilities import CAPABILITIES
from inplace_extension.inplace.plan import step_fingerprints
from inplace_extension.plays import ssh
from inplace_extension.plays.artifacts import PLAY_LEASE, PLAY_LEASE_ENV, drain_file, write_json
from inplace_extension.plays.forkserver_process import FORK_SERVER_ENV, ForkServer
from inplace_extension.plays.steps import JOINT_STEPS
from inplace_extension.runs.model import CommandCheck
from inplace_extension.runs.resolve import HostTarget

log = logging.getLogger(__name__)

# update_machine.yml's tags for what a play may leave out (its update_machine_tags_not_needed says the
# same, for the stamp): the input checks the service made in Python before the play, and the parts no
# Machine of the batch has. Tasks filtered out by tags are never queued, where a task skipped by its
# `when` still costs the controller a worker process, a templating of its variables and two job events.
RECHECK_TAG = "update_machine_recheck"
DRAIN_TAG = "update_machine_drain"
CUSTOM_TAG = "update_machine_custom"
HEALTH_TAG = "update_machine_health"
STEP_TAG = (
    "update_machine_step_{}"  # a built-in step's role (not its bare name: a user's role may tag with it)
)
LOCK_TAG = "update_machine_lock"  # the lock task, which a first step's module can do instead
# update_machine.yml's update_machine_lock_riders: the steps whose module takes the host lock and reads
# the stamp in its own execution when it is the first step of the play
LOCK_RIDERS = frozenset({"ntp", "kubeadm_files", "kubelet_args"})
# update_machine.yml's update_machine_joint: JOINT_STEPS, both to run and with no drain point between
# them, are one module execution (JOINT_TAG) instead of their roles' (APART_TAG)
JOINT_TAG = "update_machine_joint"
APART_TAG = "update_machine_apart"


class RunStartError(Exception):
    """ansible-runner refused to start the run (bad private data dir, missing playbook, ...)."""


@dataclass(frozen=True)
class HostRun:
    """One Machine's attempt inside a batch, fully decided: nothing here comes from a request unvalidated."""

    ident: str
    host_name: str  # inventory host name (the Machine name, DNS-1123 checked by the service)
    fingerprint: str
    capabilities: tuple[str, ...]
    inputs: Mapping[str, Mapping[str, Any]]
    target: HostTarget
    attempt_dir: Path  # this Machine's attempt: inputs.json, known_hosts, meta.json, outcome.json
    roles: Mapping[str, str] = field(default_factory=dict)  # user-defined capability -> role (ours, checked)
    lock_token: str = ""  # the host lock token this attempt's play holds ("" = the module picks one)
    takeover_tokens: tuple[str, ...] = ()  # this Machine's dead plays' lock tokens: taken over at once
    drain_before: str | None = None  # the capability before which the play waits for the Node's drain
    drain_wait_seconds: int = 0  # how long it waits there for the service's word (drain.json)


@dataclass(frozen=True)
class BatchSpec:
    """One ansible-playbook run for one or more Machines (one Ansible start-up, one fork per host)."""

    ident: str  # names artifacts/<ident>/ in batch_dir
    batch_dir: Path  # ansible-runner's private data dir, fresh for every batch
    hosts: tuple[HostRun, ...]
    playbook: Path
    ansible_cfg: Path | None
    state_dir: Path  # the runs dir: ANSIBLE_HOME and the ssh control sockets live below it
    wrapper: Path  # from install_wrapper()
    roles_paths: tuple[Path, ...] = ()  # user roles directories (--capabilities-file), searched after ours
    host_checks: tuple[CommandCheck, ...] = ()  # the health gate's command checks, run before the stamp
    host_checks_timeout_seconds: int = 300  # --health-gate-timeout-seconds: until they must pass
    role_vars: Mapping[str, Any] = field(default_factory=dict)  # capabilities file role_settings
    # the dry run (plays/dry_run.py): ansible-playbook --check --diff, which changes nothing on the host
    check: bool = False
    # the service's fork server: ansible-playbook forked from a warm one (None: a new process per play)
    fork_server: ForkServer | None = None


TaskListener = Callable[[str, str | None, str], None]  # (host name, role or None, task) per task start


class RunHandle:
    """A started run. ``wait()`` blocks until ansible-playbook is gone and returns runner's status."""

    def __init__(self, thread: threading.Thread, runner: Any) -> None:
        self._thread = thread
        self._runner = runner

    def wait(self) -> str:
        self._thread.join()
        return str(self._runner.status)

    def events(self) -> list[dict[str, Any]]:
        """The run's job events, in order (after :meth:`wait`): ansible-runner's ``Runner.events``."""
        return [dict(event) for event in self._runner.events]


def _never_cancel() -> bool:
    return False


def install_wrapper(state_dir: Path) -> Path:
    """Write ``detach.py`` as an executable under the runs dir, pinned to this interpreter.

    Written at start-up rather than executed from the package because installed packages do not keep
    the executable bit; the shebang names ``sys.executable`` so no other Python is picked up.
    """
    source = Path(__file__).with_name("detach.py").read_text(encoding="utf-8")
    bin_dir = state_dir / ".bin"
    bin_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    wrapper = bin_dir / "ansible-playbook-detached"
    tmp = bin_dir / ".ansible-playbook-detached.tmp"
    tmp.write_text(f"#!{sys.executable}\n{source}", encoding="utf-8")
    tmp.chmod(0o700)
    tmp.replace(wrapper)
    return wrapper


def start(spec: BatchSpec, on_task: TaskListener) -> RunHandle:
    """Write every host's files and start ansible-playbook for the batch in ansible-runner's thread."""
    hosts: dict[str, dict[str, Any]] = {}
    for run in spec.hosts:
        inputs_file = run.attempt_dir / "inputs.json"
        # request data reaches the play only through this file (lookup(file)|from_json, never templated)
        write_json(inputs_file, {cap: dict(run.inputs.get(cap, {})) for cap in run.capabilities})
        # the playbook's run parameters (architecture.md), as host variables so that one play can
        # carry several Machines, each with its own ident, fingerprint and inputs
        hosts[run.host_name] = {
            **ssh.host_vars(run.target, run.attempt_dir),
            **run_parameters(run, inputs_file),
        }
        if spec.host_checks:
            # argv lists reach the play like request data: a file read with lookup(file)|from_json
            checks_file = run.attempt_dir / "health_checks.json"
            write_json(checks_file, [_check_json(check) for check in spec.host_checks])
            hosts[run.host_name]["update_machine_health_file"] = str(checks_file)
            hosts[run.host_name]["update_machine_health_timeout_seconds"] = spec.host_checks_timeout_seconds
        hosts[run.host_name]["update_machine_decided"] = decided(spec, run)

    def event_handler(event: dict[str, Any]) -> bool:
        # an exception here would kill runner's thread and leave status "running" for ever, rc None
        try:
            if event.get("event") == "runner_on_start":
                data = event.get("event_data") or {}
                on_task(str(data.get("host") or ""), data.get("role") or None, str(data.get("task") or ""))
        except Exception:
            log.exception("run=%s: task listener failed", spec.ident)
        return True

    try:
        thread, runner = ansible_runner.run_async(
            private_data_dir=str(spec.batch_dir),
            ident=spec.ident,
            playbook=str(spec.playbook),
            # ansible-playbook via detach.py, which survives the service's death; with a custom binary
            # ansible-runner leaves out the playbook argument, so it goes in through cmdline
            binary=str(spec.wrapper),
            cmdline=" ".join(
                shlex.quote(arg)
                for arg in [
                    str(spec.playbook),
                    "--skip-tags",
                    ",".join(skip_tags(spec)),
                    *(["--check", "--diff"] if spec.check else []),
                    *_role_vars_args(spec),
                ]
            ),
            inventory={"all": {"hosts": hosts}},
            forks=len(hosts),
            envvars=_envvars(spec),
            quiet=True,
            suppress_env_files=True,
            event_handler=event_handler,
            # Always given: without it runner installs its own SIGINT/SIGTERM handlers for good.
            # Never true: killing a play mid-way leaves the host lock held until it counts as stale,
            # while a play left alone finishes (detach.py) and a later attempt finds its stamp.
            cancel_callback=_never_cancel,
        )
    except Exception as exc:  # ConfigurationError, ValueError, OSError...: all mean "did not start"
        raise RunStartError(f"ansible-runner could not start: {type(exc).__name__}: {exc}") from exc
    return RunHandle(thread, runner)


def skip_tags(spec: BatchSpec) -> list[str]:
    """The play's tags this batch leaves out: the re-checks of what Python checked (the inputs were made
    and validated by :mod:`inplace_extension.inplace`, the run parameters by :func:`run_parameters`), the
    built-in steps no Machine of the batch has, the drain points, user-defined steps and health gate
    command checks when none of its Machines has any, the lock task when every Machine's first
    step takes the lock, and of kubeadm_files and kubelet_args the roles when every Machine with
    either does both in one module execution, that execution when none does."""
    steps = {cap for run in spec.hosts for cap in run.capabilities}
    tags = [RECHECK_TAG, *(STEP_TAG.format(c.name) for c in CAPABILITIES if c.name not in steps)]
    if all(run.drain_before is None for run in spec.hosts):
        tags.append(DRAIN_TAG)
    if not any(cap in run.roles for run in spec.hosts for cap in run.capabilities):
        tags.append(CUSTOM_TAG)
    if not spec.host_checks:
        tags.append(HEALTH_TAG)
    if all(lock_rides_on_first_step(run) for run in spec.hosts):
        tags.append(LOCK_TAG)
    joint = [joint_steps(run) for run in spec.hosts if set(JOINT_STEPS) & set(run.capabilities)]
    if joint and all(joint):
        tags.append(APART_TAG)
    if not any(joint):
        tags.append(JOINT_TAG)
    return tags


def joint_steps(run: HostRun) -> bool:
    """Whether the play does ``run``'s kubeadm_files and kubelet_args in one module execution
    (update_machine.yml's ``update_machine_joint`` for a run of the service, which leaves out the roles'
    input checks and never a step of its own): it has both, and no drain point between them."""
    return set(JOINT_STEPS) <= set(run.capabilities) and run.drain_before != JOINT_STEPS[1]


def lock_rides_on_first_step(run: HostRun) -> bool:
    """Whether the play has ``run``'s first step take the host lock in its own module execution
    (update_machine.yml's ``update_machine_lock_rides_on`` for a run of the service, which never leaves
    out a step of its own): the step is one of :data:`LOCK_RIDERS`, the play has the lock token and no
    drain point. Every host of a batch that takes it so lets the batch leave the lock task out."""
    return (
        bool(run.lock_token)
        and bool(run.capabilities)
        and run.capabilities[0] in LOCK_RIDERS
        and run.drain_before is None
    )


def tags_not_needed(spec: BatchSpec, run: HostRun) -> set[str]:
    """update_machine.yml's ``update_machine_tags_not_needed`` for ``run`` in a run of the service: the
    play's tags whose leaving out does not keep the run from being the host's whole update."""
    tags = {RECHECK_TAG, *(STEP_TAG.format(c.name) for c in CAPABILITIES if c.name not in run.capabilities)}
    if lock_rides_on_first_step(run):
        tags.add(LOCK_TAG)
    if run.drain_before is None:
        tags.add(DRAIN_TAG)
    if not any(cap in run.roles for cap in run.capabilities):
        tags.add(CUSTOM_TAG)
    if not spec.host_checks:
        tags.add(HEALTH_TAG)
    tags.add(APART_TAG if joint_steps(run) else JOINT_TAG)
    if not set(JOINT_STEPS) & set(run.capabilities):
        tags.add(APART_TAG)  # the two roles' tag, which a batch whose other hosts do both in one leaves out
    return tags


def decided(spec: BatchSpec, run: HostRun) -> dict[str, Any]:
    """update_machine.yml's ``update_machine_decided`` for ``run``: three of the play's decisions, made here
    by the play's own rules for a run of the service (no ``--tags``, the roles' input checks left out):
    ansible-core compiles a template again wherever a variable is used, and the play's rules for them are
    its biggest templates, used about twenty times per host (bench/README.md, issue 40). The play makes
    them itself without it (a play run by hand); tests/playbooks/test_decided.py holds the two equal.

    - ``lock_rides_on``: the first step when its module takes the host lock (``..._lock_rides_on``);
    - ``joint``: kubeadm_files and kubelet_args in one module execution (``update_machine_joint``);
    - ``whole_run``: the run is the host's whole update, so that it may stamp (``update_machine_whole_run``):
      the batch leaves out no tag this host needs."""
    return {
        "lock_rides_on": run.capabilities[0] if lock_rides_on_first_step(run) else "",
        "joint": joint_steps(run),
        "whole_run": set(skip_tags(spec)) <= tags_not_needed(spec, run),
    }


def _role_vars_args(spec: BatchSpec) -> list[str]:
    """``-e @file`` with the roles' settings: a JSON file, so they are data on the command line's side
    (never a string Ansible parses as key=value), checked at start-up (role_settings.py)."""
    if not spec.role_vars:
        return []
    path = spec.batch_dir / "role_settings.json"
    write_json(path, dict(spec.role_vars))
    return ["--extra-vars", f"@{path}"]


def run_parameters(run: HostRun, inputs_file: Path) -> dict[str, Any]:
    """The play's ``update_machine_*`` variables for one Machine: all ours, no request string among them."""
    extra: dict[str, Any] = {}
    if run.lock_token:
        extra["update_machine_lock_token"] = run.lock_token
    if run.takeover_tokens:
        extra["update_machine_lock_takeover_tokens"] = list(run.takeover_tokens)
    if run.drain_before is not None:  # the drain point (tasks/drain_point.yml)
        extra["update_machine_drain_before"] = run.drain_before
        extra["update_machine_drain_file"] = str(drain_file(run.attempt_dir))
        extra["update_machine_drain_wait_seconds"] = run.drain_wait_seconds
    return {
        **extra,
        "update_machine_ident": run.ident,
        "update_machine_fingerprint": run.fingerprint,
        # one fingerprint per step: the host's stamp keeps them, and a step the host's last complete
        # run applied with the same inputs is skipped without touching the host (inplace_host_state)
        "update_machine_step_fingerprints": step_fingerprints(
            {cap: run.inputs.get(cap, {}) for cap in run.capabilities}
        ),
        "update_machine_capabilities": list(run.capabilities),
        "update_machine_inputs_file": str(inputs_file),
        # user-defined steps in run order: the play includes each role by this name (from the
        # capabilities file); their inputs still come only from the inputs file
        "update_machine_custom": [
            {"capability": cap, "role": run.roles[cap]} for cap in run.capabilities if cap in run.roles
        ],
    }


def _check_json(check: CommandCheck) -> dict[str, Any]:
    return {"name": check.name, "argv": list(check.argv), "timeout_seconds": check.timeout_seconds}


# ansible-playbook's own interpreter: Python warnings off. ansible-core reports its own warnings and
# deprecations through its display (``[WARNING]``, ``[DEPRECATION WARNING]``), which stay; what Python's
# warnings module prints there comes from the libraries under it (cryptography 51 warns about DSA when
# ansible-core's SSH-agent support imports it), is nothing a play's reader can act on, and ansible-runner
# records each such line as an event of its own (no ``event_data``) in the run's artifacts and Events.
PLAY_PYTHON_ENV: dict[str, str] = {"PYTHONWARNINGS": "ignore"}


def play_python_env() -> dict[str, str]:
    """The ``PYTHON*`` variables of ansible-playbook's interpreter: ours and detach.py's unbuffered output
    (the fork server's interpreter starts with them: the fork server's children inherit what it read)."""
    return {**PLAY_PYTHON_ENV, "PYTHONUNBUFFERED": "1"}


def _envvars(spec: BatchSpec) -> dict[str, str]:
    cp_dir = ssh.control_path_dir(spec.state_dir)
    cp_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    home = spec.state_dir / ".ansible"
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    # ansible-runner spawns ansible-playbook through PATH: ours must win, or rc 127 ("not found")
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", os.defpath)])
    env = {
        "PATH": path,
        "ANSIBLE_HOME": str(home),
        "ANSIBLE_SSH_CONTROL_PATH_DIR": str(cp_dir),
        "ANSIBLE_NOCOLOR": "1",
        PLAY_LEASE_ENV: str(spec.batch_dir / PLAY_LEASE),  # detach.py holds it while the play lives
        "ANSIBLE_RETRY_FILES_ENABLED": "False",
        # Each host of a batch goes through the play on its own. With the default linear strategy every
        # host waits for all the others at each task, and two plays that each hold the lock of a host
        # the other one waits for would deadlock until the lock wait times out.
        "ANSIBLE_STRATEGY": "free",
        **PLAY_PYTHON_ENV,
    }
    # the fork server, started (again) here when none is running
    if spec.fork_server is not None and (socket := spec.fork_server.socket()) is not None:
        env[FORK_SERVER_ENV] = socket
    if spec.ansible_cfg is not None:
        env["ANSIBLE_CONFIG"] = str(spec.ansible_cfg)
    if spec.roles_paths:
        # replaces ansible.cfg's roles_path, so ours comes first; the playbook's roles/ is searched anyway
        ours = spec.playbook.parent / "roles"
        env["ANSIBLE_ROLES_PATH"] = os.pathsep.join(str(path) for path in (ours, *spec.roles_paths))
    return env


class RunConfigError(ValueError):
    """The service cannot run updates as configured (no playbook). Raised at start-up only."""


def default_playbooks_dir() -> Path:
    """The repository's ``playbooks/`` beside the ``inplace_extension`` package."""
    return Path(inplace_extension.__file__).resolve().parent.parent / "playbooks"


def locate_playbook(playbooks_dir: Path | None) -> tuple[Path, Path | None]:
    """``update_machine.yml`` and its ``ansible.cfg`` (if any) in ``playbooks_dir`` (default: ours)."""
    playbooks = (playbooks_dir or default_playbooks_dir()).resolve()
    playbook = playbooks / "update_machine.yml"
    if not playbook.is_file():
        raise RunConfigError(f"playbook {playbook} not found (set --playbooks-dir)")
    cfg = playbooks / "ansible.cfg"
    return playbook, cfg if cfg.is_file() else None
