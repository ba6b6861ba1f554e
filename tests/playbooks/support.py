"""Helpers for the playbook tests: run playbooks/update_machine.yml on one lab host, read results.

``run_update`` drives the real playbook through ansible-runner exactly as inplace_extension.plays does (inputs
JSON file + the four update_machine_* extra vars, ANSIBLE_CONFIG pointing at playbooks/ansible.cfg,
host-key checking on with the lab's pinned known_hosts; ansible-playbook through detach.py and, as the
service's local executor does by default, forked from a fork server: one for the test session, or a fresh
process with ``RunSpec.fresh``) and returns a :class:`RunResult` built from the job events.
``ReleaseServer`` serves stand-in "release binaries" on the lab gateway for the kubernetes_version role's
binary download.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import re
import shlex
import shutil
import sys
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

import ansible_runner
from hostlab.lab import Host, Lab

from inplace_extension.inplace.plan import step_fingerprints
from inplace_extension.plays.detach import FORK_SERVER_ENV
from inplace_extension.plays.forkserver_process import ForkServer
from inplace_extension.plays.runner import PLAY_PYTHON_ENV, install_wrapper, play_python_env
from inplace_extension.plays.steps import JOINT_TASK

from .standins import KUBERNETES_BINARIES, standin_binary

REPO = Path(__file__).resolve().parents[2]
PLAYBOOK = REPO / "playbooks" / "update_machine.yml"
ANSIBLE_CFG = REPO / "playbooks" / "ansible.cfg"
STATE_DIR = "/var/lib/inplace-extension"
ALL_CAPABILITIES = ("users", "ntp", "kubeadm_files", "kubelet_args", "kubernetes_version")
STAMP_TASK = "Write the stamp of the applied fingerprint"  # the playbook task that stamps the host
LOCK_TASK = "Take the host lock and read the applied fingerprint"  # the task that reads the stamp


@dataclass
class RunResult:
    status: str
    rc: int
    events: list[dict[str, Any]]
    artifacts: Path
    private_data_dir: Path
    ident: str
    fingerprint: str

    def _task_results(self) -> Iterator[dict[str, Any]]:
        for event in self.events:
            if event["event"] in (
                "runner_on_ok",
                "runner_item_on_ok",
                "runner_on_failed",
                "runner_item_on_failed",
            ):
                yield event

    @property
    def changed_tasks(self) -> list[str]:
        """Names of tasks (handlers included) that reported a change, in order, without repeats. The
        stamp the last step's module wrote after its own work (its ``host_stamp`` result) counts as
        STAMP_TASK, the change it stands for."""
        names: list[str] = []
        for event in self._task_results():
            data = event["event_data"]
            res = data.get("res", {})
            if res.get("changed") and data["task"] not in names:
                names.append(data["task"])
            if (res.get("host_stamp") or {}).get("changed") and STAMP_TASK not in names:
                names.append(STAMP_TASK)
        return names

    def ran(self, task: str) -> bool:
        """The task ran on the host (not skipped)."""
        return any(e["event"] == "runner_on_ok" and e["event_data"].get("task") == task for e in self.events)

    @property
    def roles_run(self) -> list[str]:
        """Roles that ran at least one task (argument validation counts), and the steps the play's joint
        execution of kubeadm_files and kubelet_args did (each step's answer under its ``steps``, not
        ``skipped``), in order."""
        roles: list[str] = []
        for event in self.events:
            data = event.get("event_data", {})
            if event["event"] != "runner_on_ok":
                continue
            done = [data.get("role")] if data.get("role") else []
            if data.get("task") == JOINT_TASK:
                done = [step for step, res in data["res"]["steps"].items() if not res.get("skipped")]
            roles += [role for role in done if role not in roles]
        return roles

    @property
    def failure_messages(self) -> list[str]:
        return [
            str(e["event_data"].get("res", {}).get("msg", ""))
            for e in self.events
            if e["event"] in ("runner_on_failed", "runner_item_on_failed", "runner_on_unreachable")
        ]

    @property
    def unchanged(self) -> list[str]:
        """The steps the lock task (or the first step's module that took the lock) found applied with the
        same inputs in the host's stamp (skipped)."""
        return list(self.lock_answer.get("unchanged", []))

    @property
    def lock_answer(self) -> dict[str, Any]:
        """What taking the host lock answered: the lock task's result, or the ``host_lock`` of the first
        step's module that took it."""
        for event in self.events:
            data = event.get("event_data", {})
            if event["event"] not in ("runner_on_ok", "runner_on_failed"):
                continue
            res = data.get("res", {})
            if data.get("task") == LOCK_TASK:
                return dict(res)
            if isinstance(res.get("host_lock"), dict):
                return dict(res["host_lock"])
        raise AssertionError("nothing took the lock")

    @property
    def failed_roles(self) -> list[str | None]:
        """The role of each failed task, or the step the joint execution names (its answer's ``step``)."""
        return [
            e["event_data"].get("role") or e["event_data"].get("res", {}).get("step")
            for e in self.events
            if e["event"] == "runner_on_failed"
        ]

    def all_text(self) -> str:
        """Everything ansible-runner wrote for this run (job events, stdout, env), for secret checks.

        The inputs file is left out: it is the request data itself, written by the caller.
        """
        written = [
            p for p in sorted(self.private_data_dir.rglob("*")) if p.is_file() and p.name != "inputs.json"
        ]
        assert any(p.parent.name == "job_events" for p in written), "no job events were written"
        return "\n".join(p.read_text(errors="replace") for p in written)


def new_fingerprint() -> str:
    return hashlib.sha256(uuid.uuid4().bytes).hexdigest()


def inventory(lab: Lab, host: Host) -> dict[str, Any]:
    return {
        "all": {
            "hosts": {
                host.name: {
                    "ansible_host": host.address,
                    "ansible_user": "ansible",
                    "ansible_ssh_private_key_file": str(lab.private_key),
                    "ansible_python_interpreter": "/usr/bin/python3",
                    # host-key checking stays on (ansible.cfg): the lab pins every host's key
                    "ansible_ssh_common_args": (
                        f"-o UserKnownHostsFile={lab.known_hosts} -o GlobalKnownHostsFile=/dev/null "
                        "-o StrictHostKeyChecking=yes -o IdentitiesOnly=yes"
                    ),
                }
            }
        }
    }


def envvars(lab: Lab, workdir: Path) -> dict[str, str]:
    # ANSIBLE_HOME of the session, as the service's is of its runs dir: the fork server froze the first
    # play's settings, and a play whose settings differ is a fresh ansible-playbook
    return {**lab.ansible_env(), **base_envvars(workdir), "ANSIBLE_HOME": str(session_dir() / ".ansible")}


def base_envvars(workdir: Path) -> dict[str, str]:
    # ansible-runner spawns ansible-playbook through PATH: the venv's must win
    path = f"{Path(sys.executable).parent}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    return {
        "PATH": path,
        "ANSIBLE_CONFIG": str(ANSIBLE_CFG),
        "ANSIBLE_HOME": str(workdir / "ansible-home"),
        **PLAY_PYTHON_ENV,  # as the service runs its plays: no library's Python warnings in the output
    }


@dataclass
class RunSpec:
    lab: Lab
    host: Host
    workdir: Path
    inputs: Mapping[str, Any]
    capabilities: Sequence[str] | None = None  # default: the keys of inputs, in the fixed order
    fingerprint: str = field(default_factory=new_fingerprint)
    extravars: Mapping[str, Any] = field(default_factory=dict)
    # pass the per-step fingerprints as inplace_extension.plays does (False: a caller from before them)
    step_fingerprints: bool = False
    # ansible-playbook options after the playbook (ansible-runner's cmdline), e.g. the service's --skip-tags
    cmdline: str | None = None
    # hold the host lock with a token of the caller's, as inplace_extension.plays does (the first step's
    # module then takes the lock when it can: update_machine_lock_rides_on)
    lock_token: bool = False
    # a new ansible-playbook process (detach.py's own child) instead of a child of the fork server
    fresh: bool = False

    @property
    def ident(self) -> str:
        return f"test.{self.host.name}.{self.fingerprint[:12]}"


def start_update(
    spec: RunSpec, events: list[dict[str, Any]] | None = None
) -> tuple[threading.Thread, Any, Path]:
    """Start one run in ansible-runner's thread; returns (thread, runner, private_data_dir)."""
    pdd = spec.workdir / f"run-{uuid.uuid4().hex[:12]}"  # fresh per attempt: reused, stale env/ and stats
    pdd.mkdir(parents=True)
    inputs_file = pdd / "inputs.json"
    inputs_file.write_text(json.dumps(dict(spec.inputs)))
    caps = (
        list(spec.capabilities)
        if spec.capabilities is not None
        else [c for c in ALL_CAPABILITIES if c in spec.inputs]
    )
    sink = events if events is not None else []
    steps = {"update_machine_step_fingerprints": step_fingerprints({c: spec.inputs[c] for c in caps})}

    def on_event(event: dict[str, Any]) -> bool:
        sink.append(event)  # never raise here: it would kill runner's thread
        return True

    server = None if spec.fresh else fork_server().socket()
    thread, runner = ansible_runner.run_async(
        private_data_dir=str(pdd),
        ident=spec.ident,
        playbook=str(PLAYBOOK),
        # as the service starts it: detach.py, which leaves the playbook argument to cmdline
        binary=str(WRAPPER.get()),
        inventory=inventory(spec.lab, spec.host),
        extravars={
            "update_machine_ident": spec.ident,
            "update_machine_fingerprint": spec.fingerprint,
            "update_machine_capabilities": caps,
            "update_machine_inputs_file": str(inputs_file),
            **(steps if spec.step_fingerprints else {}),
            **({"update_machine_lock_token": uuid.uuid4().hex} if spec.lock_token else {}),
            **spec.extravars,
        },
        envvars={**envvars(spec.lab, spec.workdir), **({FORK_SERVER_ENV: server} if server else {})},
        quiet=True,
        suppress_env_files=True,
        cmdline=" ".join([shlex.quote(str(PLAYBOOK)), spec.cmdline or ""]),
        event_handler=on_event,
        cancel_callback=lambda: False,  # without it runner installs its own signal handlers
        timeout=600,
    )
    return thread, runner, pdd


class _Once:
    """A directory of the test session for detach.py and the fork server (made at the first play)."""

    def __init__(self) -> None:
        self.root: Path | None = None
        self.wrapper: Path | None = None
        self.server: ForkServer | None = None

    def get(self) -> Path:
        """detach.py, installed in the session's directory."""
        if self.wrapper is None:
            self.root = Path(tempfile.mkdtemp(prefix="inplace-playbooks-"))
            self.wrapper = install_wrapper(self.root)
            self.server = ForkServer(self.root, play_python_env())
        return self.wrapper

    def close(self) -> None:
        """Retire the fork server (it exits once its last play ends) and remove the directory."""
        if self.server is not None:
            self.server.close(30)
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)
        self.root = self.wrapper = self.server = None


WRAPPER = _Once()


def session_dir() -> Path:
    WRAPPER.get()
    assert WRAPPER.root is not None
    return WRAPPER.root


def fresh_plays() -> int:
    """How many plays the fork server sent to a fresh ansible-playbook (their settings differed)."""
    log = session_dir() / ".bin" / "forkserver.log"
    return log.read_text().count("fresh ansible-playbook") if log.exists() else 0


def fork_server() -> ForkServer:
    """The test session's fork server (conftest.py retires it at the session's end)."""
    WRAPPER.get()
    assert WRAPPER.server is not None
    return WRAPPER.server


# a line Python's warnings module prints ("/path/x.py:18: CryptographyDeprecationWarning: DSA is ...")
PYTHON_WARNING = re.compile(r"\.py:\d+: \w*Warning: ")


def event_data(event: Mapping[str, Any]) -> dict[str, Any]:
    """An event's data, as the service reads it (plays/outcomes.py): ansible-runner records a line of
    output that is no job event (a library's warning, a traceback) as an event without ``event_data``."""
    return dict(event.get("event_data") or {})


def finish(spec: RunSpec, thread: threading.Thread, runner: Any, pdd: Path) -> RunResult:
    thread.join()
    noise = [str(e.get("stdout")) for e in runner.events if PYTHON_WARNING.search(str(e.get("stdout") or ""))]
    assert not noise, f"a library's Python warning in the play's output: {noise}"
    return RunResult(
        status=str(runner.status),
        rc=int(runner.rc),
        events=list(runner.events),
        artifacts=pdd / "artifacts" / spec.ident,
        private_data_dir=pdd,
        ident=spec.ident,
        fingerprint=spec.fingerprint,
    )


def run_update(spec: RunSpec) -> RunResult:
    return finish(spec, *start_update(spec))


def host_text(lab: Lab, host: Host, path: str) -> str:
    return lab.read_file(host, path)


def host_exists(lab: Lab, host: Host, path: str) -> bool:
    return lab.exec_in(host, ["test", "-e", path]).returncode == 0


def host_json_lines(lab: Lab, host: Host, path: str) -> list[dict[str, Any]]:
    if not host_exists(lab, host, path):
        return []
    return [json.loads(line) for line in host_text(lab, host, path).splitlines() if line.strip()]


def host_root(lab: Lab, host: Host, argv: Sequence[str], stdin: str | None = None) -> str:
    """Run argv as root on the host (no SSH); fail the test with stderr when it fails."""
    proc = lab.exec_in(host, list(argv), input_text=stdin)
    assert proc.returncode == 0, f"{argv} on {host.name}: {proc.stderr}"
    return proc.stdout


KUBELET_KUBECONFIG = (
    "apiVersion: v1\nkind: Config\nusers: [{name: default-auth, user: "
    "{client-certificate: /var/lib/kubelet/pki/kubelet-client-current.pem}}]\n"
)


def write_kubelet_credentials(lab: Lab, host: Host, cert: str | None) -> None:
    """kubelet.conf and the client certificate as kubeadm leaves them after join: the kubeconfig names
    the current certificate by path; ``cert`` None leaves that file out (an empty pki directory)."""
    host_root(
        lab,
        host,
        ["sh", "-c", "mkdir -p /etc/kubernetes && cat >/etc/kubernetes/kubelet.conf"],
        stdin=KUBELET_KUBECONFIG,
    )
    host_root(lab, host, ["mkdir", "-p", "/var/lib/kubelet/pki"])
    if cert is not None:
        host_root(
            lab,
            host,
            ["sh", "-c", "cat >/var/lib/kubelet/pki/kubelet-client-current.pem"],
            stdin=cert,
        )


def calls(lab: Lab, host: Host) -> list[str]:
    """Lines of the stand-ins' call log on the host."""
    if not host_exists(lab, host, "/var/lib/inplace-standins/calls.log"):
        return []
    return host_text(lab, host, "/var/lib/inplace-standins/calls.log").splitlines()


class BackgroundHTTPServer:
    """An HTTP server on ``address`` (a lab gateway, port chosen by the kernel) served from a thread while
    the ``with`` block runs; shut down and joined on exit. Base of the tests' package/release servers."""

    def __init__(self, address: str, handler: type[http.server.BaseHTTPRequestHandler]) -> None:
        self._server = http.server.ThreadingHTTPServer((address, 0), handler)
        self.origin = f"http://{address}:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()


def _standin(name: str, version: str) -> bytes | None:
    return standin_binary(name, version) if name in KUBERNETES_BINARIES else None


class ReleaseServer(BackgroundHTTPServer):
    """Serves kubeadm/kubelet/kubectl as "release binaries" on the lab gateway (stand-ins by default).

    Layout as dl.k8s.io: ``/<version>/bin/linux/<arch>/<name>`` and ``<name>.sha256`` (hex digest only).
    """

    PATH_RE = re.compile(r"^/(v\d+\.\d+\.\d+)/bin/linux/[a-z0-9]+/([a-z]+)(\.sha256)?$")

    def __init__(self, address: str, binary: Callable[[str, str], bytes | None] | None = None) -> None:
        """``binary(name, version)`` gives the bytes to serve (None: 404); default: the stand-ins."""
        self.requests: list[str] = []
        outer = self
        serve = binary or _standin

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                outer.requests.append(self.path)
                match = outer.PATH_RE.match(self.path)
                body = serve(match.group(2), match.group(1)) if match else None
                if match is None or body is None:
                    self.send_error(404)
                    return
                if match.group(3):
                    body = hashlib.sha256(body).hexdigest().encode() + b"\n"
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                return

        super().__init__(address, Handler)
        self.base_url = self.origin
