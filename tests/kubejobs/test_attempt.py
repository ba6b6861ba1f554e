"""One attempt inside its Job (kubejobs/attempt.py, ``inplace-extension attempt``): the ``local`` plumbing
with the lock the service decided, its phases published, its outcome as the termination message; and
the start-up refusals of ``--executor kubernetes``. The play is the fake runner's (tests/runs/fakes.py);
the real play inside a real Job is the lab's."""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest
from kubefake import FakeJobs
from runs.fakes import FakeRunner, unreachable_events

from inplace_extension.capabilities_file import FileConfig, load_file
from inplace_extension.cli import main
from inplace_extension.engine import ExecutorError, Records, build_engine, job_settings, own_image
from inplace_extension.inplace.custom import NO_CUSTOM
from inplace_extension.kubejobs.attempt import PlayStop, run_attempt
from inplace_extension.kubejobs.spec import AttemptSpec, outcome_of, termination_message
from inplace_extension.metrics import Metrics
from inplace_extension.plays import runner as runner_mod
from inplace_extension.plays.steps import DRAIN_TASK
from inplace_extension.runs.attempts import Outcome, OutcomeKind
from inplace_extension.runs.model import NO_CLUSTER_SIDE, NO_OBJECT_HEALTH, NoClusterSide, RunRequest
from inplace_extension.settings import Settings

from .test_manifest import request, target

PLAYBOOKS = Path(__file__).resolve().parents[2] / "playbooks"


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeRunner:
    fake = FakeRunner()
    monkeypatch.setattr(runner_mod, "start", fake.start)
    return fake


def spec(takeover: tuple[str, ...] = ("lock-of-attempt-1",)) -> AttemptSpec:
    return AttemptSpec(
        request=request(),
        target=target(),
        number=2,
        token="",
        lock_token="lock-of-attempt-2",
        takeover_tokens=takeover,
        host_checks=(),
        role_vars={},
        roles_paths=(),
    )


def test_the_attempt_plays_with_the_services_lock_and_writes_its_outcome(
    tmp_path: Path, fake: FakeRunner
) -> None:
    settings = Settings(runs_dir=tmp_path / "scratch", playbooks_dir=PLAYBOOKS)
    phases: list[str] = []
    log = tmp_path / "termination-log"
    outcome = run_attempt(
        spec(),
        settings=settings,
        cluster=NO_CLUSTER_SIDE,
        publish=phases.append,
        termination_log=log,
        timeout=30,
    )
    assert outcome.kind is OutcomeKind.SUCCESSFUL
    assert outcome_of(log.read_text()) == outcome
    (run,) = fake.started
    assert run.lock_token == "lock-of-attempt-2"
    assert run.takeover_tokens == ("lock-of-attempt-1",)
    assert phases, "the phases were published"


def test_a_failed_attempt_is_an_outcome_too(tmp_path: Path, fake: FakeRunner) -> None:
    fake.scripts[request().name] = [lambda run: ("failed", 4, unreachable_events())]
    settings = Settings(runs_dir=tmp_path / "scratch", playbooks_dir=PLAYBOOKS)
    log = tmp_path / "termination-log"
    run_attempt(
        spec(()),
        settings=settings,
        cluster=NO_CLUSTER_SIDE,
        publish=lambda p: None,
        termination_log=log,
        timeout=30,
    )
    written = outcome_of(log.read_text())
    assert written is not None and written.kind is OutcomeKind.UNREACHABLE


def test_the_attempt_command_refuses_a_spec_it_cannot_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "attempt.json"
    bad.write_text('{"request": {}}')
    assert main(["attempt", "--spec", str(bad), "--termination-log", str(tmp_path / "log")]) == 2
    assert "the attempt spec is not valid: KeyError 'target'" in capsys.readouterr().err
    assert not (tmp_path / "log").exists()


def test_the_kubernetes_executor_is_refused_without_cluster_access(tmp_path: Path) -> None:
    settings = Settings(runs_dir=tmp_path / "runs", playbooks_dir=PLAYBOOKS, executor="kubernetes")
    with pytest.raises(ExecutorError, match="needs cluster access, and this command has none"):
        build_engine(
            settings,
            FileConfig(NO_CUSTOM),
            Metrics(),
            NO_CLUSTER_SIDE,
            NO_OBJECT_HEALTH,
            records=None,
            jobs_kubeconfig=None,
        )
    with pytest.raises(ExecutorError, match=r"needs cluster access \(--kubeconfig, else the in-cluster"):
        build_engine(
            settings,
            FileConfig(NO_CUSTOM),
            Metrics(),
            NO_CLUSTER_SIDE,
            NO_OBJECT_HEALTH,
            records=Records("Machine", None),
            jobs_kubeconfig=None,
        )


def test_serve_says_why_the_kubernetes_executor_cannot_start(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [
        "serve",
        "--plain-http",
        "--executor",
        "kubernetes",
        "--job-image",
        "inplace-extension:0.1.0",
        "--runs-dir",
        str(tmp_path),
        "--listen",
        "127.0.0.1:0",
    ]
    assert main(argv) == 2
    error = capsys.readouterr().err  # no --kubeconfig, and not in a Pod: no in-cluster account either
    assert "--executor kubernetes needs cluster access (--kubeconfig, else the in-cluster account)" in error


def test_the_jobs_run_the_services_own_image_read_from_its_pod(tmp_path: Path) -> None:
    cluster = FakeJobs()
    settings = Settings(runs_dir=tmp_path, executor="kubernetes", pod_name="inplace-extension-5d8f-x2")
    with pytest.raises(ExecutorError, match="no Pod inplace-extension-system/inplace-extension-5d8f-x2"):
        own_image(settings, cluster)
    cluster.pod_images[("inplace-extension-system", "inplace-extension-5d8f-x2")] = "reg.example/ie:1.2.3"
    assert own_image(settings, cluster) == "reg.example/ie:1.2.3"
    with pytest.raises(ExecutorError, match="needs --job-image, or --pod-name"):
        own_image(settings.model_copy(update={"pod_name": None}), cluster)


def test_the_jobs_play_the_playbooks_of_their_image(tmp_path: Path) -> None:
    settings = Settings(runs_dir=tmp_path, executor="kubernetes", playbooks_dir=PLAYBOOKS)
    # by default the service's own directory: the same path in the same image
    assert job_settings(settings)["playbooks_dir"] == str(PLAYBOOKS)
    # a service outside the Jobs' image names the directory in it
    outside = settings.model_copy(update={"job_playbooks_dir": "/opt/inplace-extension/playbooks"})
    assert job_settings(outside)["playbooks_dir"] == "/opt/inplace-extension/playbooks"
    assert Settings(**job_settings(outside)).playbooks_dir == Path("/opt/inplace-extension/playbooks")


def test_the_kubernetes_executor_refuses_the_capabilities_files_own_roles_at_start_up(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The Jobs run the service's image, which has no roles_path directory of the file's: refused with the
    capability and its roles_path named, before anything connects (not a play failing on a missing role)."""
    roles = tmp_path / "roles"
    (roles / "motd" / "tasks").mkdir(parents=True)
    (roles / "motd" / "tasks" / "main.yml").write_text("---\n[]\n")
    caps = tmp_path / "caps.yaml"
    caps.write_text(
        f"capabilities:\n  - name: motd\n    role: motd\n    roles_path: {roles}\n    claims:\n"
        "      - {kind: KubeadmConfig, pointer: /preKubeadmCommands}\n"
    )
    argv = ["serve", "--plain-http", "--executor", "kubernetes", "--job-image", "inplace-extension:0.1.0"]
    argv += [
        "--runs-dir",
        str(tmp_path / "runs"),
        "--listen",
        "127.0.0.1:0",
        "--capabilities-file",
        str(caps),
    ]
    assert main(argv) == 2
    error = capsys.readouterr().err
    assert "--executor kubernetes cannot play the capabilities file's own roles" in error
    assert f"motd (roles_path {roles})" in error
    assert "--executor local" in error
    # the same file with the local executor is fine: the refusal is the kubernetes executor's
    settings = Settings(runs_dir=tmp_path / "runs", playbooks_dir=PLAYBOOKS)
    build_engine(
        settings,
        load_file(caps),
        Metrics(),
        NO_CLUSTER_SIDE,
        NO_OBJECT_HEALTH,
        records=None,
        jobs_kubeconfig=None,
    ).close()


def test_a_play_past_the_attempts_deadline_is_stopped_and_the_attempt_interrupted(
    tmp_path: Path, fake: FakeRunner
) -> None:
    """The deadline (before the Job's own ends the Pod) stops the play as SIGTERM does; a stopped play's
    remains are not its outcome (a killed ssh reads as unreachable): interrupted, why named."""
    fake.gate = threading.Event()
    fake.scripts[request().name] = [lambda run: ("failed", 4, unreachable_events())]
    settings = Settings(runs_dir=tmp_path / "scratch", playbooks_dir=PLAYBOOKS)
    stop = PlayStop(tmp_path / "scratch" / ".batches")
    log = tmp_path / "termination-log"
    ended: list[Outcome] = []
    attempt = threading.Thread(
        target=lambda: ended.append(
            run_attempt(
                spec(),
                settings=settings,
                cluster=NO_CLUSTER_SIDE,
                publish=lambda p: None,
                termination_log=log,
                timeout=0.2,
                stop=stop,
            )
        )
    )
    attempt.start()
    deadline = time.monotonic() + 10
    while stop.reason is None:  # the deadline has told the play to stop
        assert time.monotonic() < deadline, "the deadline never stopped the play"
        time.sleep(0.01)
    fake.gate.set()  # the fake play ends as a stopped one does
    attempt.join(10)
    (outcome,) = ended
    assert outcome.kind is OutcomeKind.INTERRUPTED
    assert outcome.detail == "the play did not end within 0s"
    assert outcome_of(log.read_text()) == outcome


class DrainsFirst(NoClusterSide):
    """A cluster side whose drain point is the request's one step, and whose drain succeeds."""

    def drain_point(self, request: RunRequest) -> str | None:
        return request.capabilities[0]


CHECK = (None, "Check the run parameters")  # update_machine.yml's first task: no step, nothing changed


@pytest.mark.parametrize(
    ("drains", "tasks", "resumes", "past"),
    [
        (True, [CHECK], False, False),  # stopped before its drain point: nothing disrupted
        (True, [CHECK, (None, DRAIN_TASK)], False, True),  # at its drain point: the Node may be cordoned
        (False, [CHECK], False, False),  # no drain point, and no step began
        (False, [CHECK, ("kubeadm_files", "Write the files")], False, True),  # a step began
        (False, [], True, True),  # it resumed a disrupted machine: disrupted, wherever it got to
    ],
    ids=["before-its-drain-point", "at-its-drain-point", "no-step", "a-step-began", "a-resume"],
)
def test_a_stopped_play_says_whether_it_had_passed_its_drain_point(
    tmp_path: Path,
    fake: FakeRunner,
    drains: bool,
    tasks: list[tuple[str | None, str]],
    resumes: bool,
    past: bool,
) -> None:
    """The Job's play killed mid-way (SIGTERM, its deadline) tells by its own events, as the ``local``
    executor tells of a play whose process died, whether it may have disrupted the machine: the
    service resumes the next attempt unchecked if so, else it is a new start."""
    fake.gate = threading.Event()
    events = [{"event": "runner_on_start", "event_data": {"role": r, "task": t}} for r, t in tasks]
    fake.scripts[request().name] = [lambda run: ("failed", 2, events)]
    settings = Settings(runs_dir=tmp_path / "scratch", playbooks_dir=PLAYBOOKS)
    stop = PlayStop(tmp_path / "scratch" / ".batches")
    log = tmp_path / "termination-log"
    ended: list[Outcome] = []
    attempt = threading.Thread(
        target=lambda: ended.append(
            run_attempt(
                replace(spec(), resumes=resumes),
                settings=settings,
                cluster=DrainsFirst() if drains else NO_CLUSTER_SIDE,
                publish=lambda p: None,
                termination_log=log,
                timeout=30,
                stop=stop,
            )
        )
    )
    attempt.start()
    deadline = time.monotonic() + 10
    while not fake.started:  # its play runs
        assert time.monotonic() < deadline, "the play never started"
        time.sleep(0.01)
    stop("the attempt was stopped (SIGTERM: its Pod was deleted or evicted)")
    fake.gate.set()  # the fake play ends as a stopped one does, with the events it wrote so far
    attempt.join(10)
    (outcome,) = ended
    assert outcome.kind is OutcomeKind.INTERRUPTED
    assert outcome.died_past_drain_point is past
    assert log.read_text() == termination_message(outcome)
    assert outcome_of(log.read_text()) == outcome, "the service reads it from the termination message"
