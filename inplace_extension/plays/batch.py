"""A batch play: the attempts one ``ansible-playbook`` carries, from their records to their outcomes.

Each attempt of the batch gets its directory and ``meta.json`` (artifacts.py: the host lock token its
play holds, the episode it began in, where its drain point is), the cluster side prepares it (a Machine
with no Node to drain stays out), ansible-runner plays the batch (runner.py), the cluster side drains a
Machine when the play reaches its drain point (in a thread of its own: the play waits there for
``drain.json``), and each outcome is classified (outcomes.py) and written as ``outcome.json``.

Shared by the two executors, which differ in everything around it: the ``local`` backend's worker threads
play each batch its queue admits (local/backend.py), the ``kubernetes`` executor's attempt Job plays its
one attempt in the calling thread (kubejobs/attempt.py). Neither queue, record nor episodes are this
module's: the caller names the episode an attempt begins in and hears of each outcome written.
"""

from __future__ import annotations

import logging
import os
import secrets
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Final

from inplace_extension.metrics import Metrics
from inplace_extension.plays import runner
from inplace_extension.plays.artifacts import (
    BatchRef,
    drain_failure_file,
    drain_file,
    ended_lock_tokens,
    new_attempt_dir,
    stop_waiting_plays,
    write_json,
)
from inplace_extension.plays.forkserver_process import ForkServer
from inplace_extension.plays.outcomes import classify
from inplace_extension.plays.steps import StepTracker, blocked_outcome, drain_outcome
from inplace_extension.runs.attempts import Outcome, OutcomeKind
from inplace_extension.runs.backend import Launch
from inplace_extension.runs.model import Blocked, ClusterSide, CommandCheck, RunRequest
from inplace_extension.settings import Settings

log = logging.getLogger(__name__)

# Beyond the drain timeout, how long a play waits at its drain point (cordon, API retries, the file write)
DRAIN_POINT_MARGIN_SECONDS = 120


@dataclass(frozen=True, kw_only=True)
class PlayConfig:
    """What the capabilities file adds to every play: user-defined roles' directories, the health gate's
    command checks (run on the host before the stamp) and the roles' settings (extra vars)."""

    roles_paths: tuple[Path, ...]
    host_checks: tuple[CommandCheck, ...]
    role_vars: Mapping[str, Any]


# no capabilities file: the shipped roles only, no command checks, no role settings
NO_PLAY_CONFIG: Final = PlayConfig(roles_paths=(), host_checks=(), role_vars={})


@dataclass(frozen=True)
class HostLock:
    """The host lock an attempt's play holds (``token``) and the tokens of ended attempts it may take
    over at once; given by the caller when the record is elsewhere (the ``kubernetes`` backend's Job)."""

    token: str
    takeover_tokens: tuple[str, ...]


@dataclass(frozen=True)
class BatchAttempt:
    """One attempt to play in a batch: what the service decided (``launch``) and the host lock its play
    holds; ``lock`` None: a fresh token, which may take over the locks this Machine's ended plays left in
    the runs directory."""

    launch: Launch
    lock: HostLock | None = None


class BatchPlayer:
    """Plays batches of attempts in the calling thread, recording each in ``settings.runs_dir``.

    ``set_phase(ident, phase)`` hears each attempt's phase (its step, the drain's progress);
    ``episode(request)`` names the episode a beginning attempt belongs to (the ``local`` record's
    episodes, local/episode.py; a Job's runs dir holds one attempt); ``finished(request)`` is called once
    its ``outcome.json`` is written."""

    def __init__(
        self,
        settings: Settings,
        *,
        cluster: ClusterSide,
        play: PlayConfig,
        metrics: Metrics | None,
        clock: Callable[[], float],
        set_phase: Callable[[str, str], None],
        episode: Callable[[RunRequest], str],
        finished: Callable[[RunRequest], object],  # what it returns is not used
        fork_server: bool = False,
    ) -> None:
        """``fork_server``: plays start from this process's fork server (forkserver_process.py), not as a
        new ansible-playbook (a Job's attempt plays once: it has nothing to share)."""
        self._runs_dir = settings.runs_dir.expanduser().resolve()
        self._runs_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._cluster = cluster
        self._play = play
        self._metrics = metrics
        self._clock = clock
        self._set_phase = set_phase
        self._episode = episode
        self._finished = finished
        self._playbook, self._ansible_cfg = runner.locate_playbook(settings.playbooks_dir)
        self._wrapper = runner.install_wrapper(self._runs_dir)
        self._fork_server = ForkServer(self._runs_dir, runner.play_python_env()) if fork_server else None
        self._host_checks_timeout = settings.health_gate_timeout_seconds
        # a play at its drain point waits this long for the drain's end (it has its own timeout)
        self._drain_wait_seconds = settings.drain_timeout_seconds + DRAIN_POINT_MARGIN_SECONDS

    def play(self, attempts: Sequence[BatchAttempt]) -> None:
        """One play for ``attempts``, from their directories to their outcomes, all on disk when this
        returns (an attempt the cluster side kept out has its outcome too)."""
        batch_ident = f"batch-{uuid.uuid4().hex[:12]}"
        batch_dir = self._runs_dir / ".batches" / batch_ident
        batch_dir.mkdir(mode=0o700, parents=True)
        played: list[tuple[RunRequest, runner.HostRun, int]] = []
        for attempt in attempts:
            ref = BatchRef(batch_dir, batch_ident, attempt.launch.request.ident)
            begun = self._begin(attempt, ref)
            if begun is not None:
                played.append((attempt.launch.request, *begun))
        if played:
            self._play_batch(batch_dir, batch_ident, played)

    def close(self, timeout: float) -> None:
        """Let the fork server go: it exits after its last play, as that play's detach.py does."""
        if self._fork_server is not None:
            self._fork_server.close(timeout)

    def _begin(self, attempt: BatchAttempt, ref: BatchRef) -> tuple[runner.HostRun, int] | None:
        """Record a new attempt (its directory and ``meta.json``) and prepare its cluster side; the host's
        part of the play and the attempt's number, or None when the cluster side kept it out (its outcome
        is written)."""
        launch = attempt.launch
        request, target = launch.request, launch.target
        ident_dir = self._runs_dir / request.ident
        # before the new attempt exists: the lock tokens of this Machine's plays that have ended
        given = attempt.lock
        takeover_tokens = given.takeover_tokens if given else ended_lock_tokens(ident_dir)
        lock_token = given.token if given else secrets.token_hex(16)
        stop_waiting_plays(ident_dir)  # an orphaned play at its drain point gives up
        began_in = self._episode(request)
        number, attempt_dir = new_attempt_dir(ident_dir)
        meta = {
            "attempt": number,
            "started": self._clock(),
            "retry_token": launch.token,
            "machine": request.machine,
            "address": target.address,
            # recorded before the play starts, so a later attempt can tell a lock left by this one
            "lock_token": lock_token,
            "episode": began_in,  # only attempts of the machine's current episode answer (episode.py)
            # it finishes a play that died past its drain point: if it dies too, the machine stays as
            # disrupted as that one left it, wherever this play gets to (outcomes.past_drain_point)
            "resumes": launch.resumes,
        }
        write_json(attempt_dir / "meta.json", {**meta, "pid": os.getpid(), **ref.to_meta()})
        log.info(
            "machine=%s run=%s state=started attempt=%d host=%s source=%s batch=%s",
            request.machine,
            request.ident,
            number,
            target.address,
            target.source,
            ref.ident,
        )
        self._cluster.state(request, "Started", f"started on host {target.address} ({target.source})")
        failure = self._cluster.before_play(request)
        if failure is not None:  # no Node to drain: this Machine stays out of the play
            self._finish(request, number, attempt_dir, blocked_outcome(failure, self._clock()), "not started")
            return None
        drain_before = self._cluster.drain_point(request)
        # where the play may start disrupting the machine: a later attempt tells by it (and the play's
        # events) whether a play that died had passed it (outcomes.past_drain_point)
        write_json(
            attempt_dir / "meta.json",
            {**meta, "pid": os.getpid(), **ref.to_meta(), "drain_before": drain_before},
        )
        run = runner.HostRun(
            ident=request.ident,
            host_name=request.ident,  # the ident is the inventory host name
            fingerprint=request.fingerprint,
            capabilities=request.capabilities,
            inputs=request.inputs,
            target=target,
            attempt_dir=attempt_dir,
            roles=request.roles,
            lock_token=lock_token,
            takeover_tokens=takeover_tokens,
            drain_before=drain_before,
            drain_wait_seconds=self._drain_wait_seconds,
        )
        return run, number

    def _play_batch(
        self, batch_dir: Path, batch_ident: str, played: list[tuple[RunRequest, runner.HostRun, int]]
    ) -> None:
        """Run one ansible-playbook for the begun attempts, then classify and finish each of them."""
        hosts = tuple(run for _, run, _ in played)
        spec = runner.BatchSpec(
            ident=batch_ident,
            batch_dir=batch_dir,
            hosts=hosts,
            playbook=self._playbook,
            ansible_cfg=self._ansible_cfg,
            state_dir=self._runs_dir,
            wrapper=self._wrapper,
            fork_server=self._fork_server,
            roles_paths=self._play.roles_paths,
            host_checks=self._play.host_checks,
            host_checks_timeout_seconds=self._host_checks_timeout,
            role_vars=self._play.role_vars,
        )
        by_ident = {run.ident: (request, run) for request, run, _ in played}
        steps = StepTracker(
            [request for request, _, _ in played],
            self._set_phase,
            self._cluster,
            on_drain_point=lambda ident: self._start_drain(*by_ident[ident]),
        )
        started = time.monotonic()
        try:
            status = runner.start(spec, steps.on_task).wait()
            ended = self._clock()
            outcomes = {
                run.ident: drain_outcome(run.attempt_dir, ended)
                or classify(BatchRef(batch_dir, batch_ident, run.host_name), run.fingerprint, ended)
                for run in hosts
            }
        except runner.RunStartError as exc:
            status, ended = "not started", self._clock()
            outcomes = {
                run.ident: Outcome(OutcomeKind.INTERRUPTED, detail=str(exc), finished=ended) for run in hosts
            }
        seconds = time.monotonic() - started
        for request, run, number in played:
            self._finish(request, number, run.attempt_dir, outcomes[run.ident], status)
            if self._metrics is not None:
                self._metrics.run_finished(outcomes[run.ident].kind.value, seconds)

    def _start_drain(self, request: RunRequest, run: runner.HostRun) -> None:
        """The play reached ``run``'s drain point: drain in a thread of its own (the event thread serves
        every host of the batch), then tell the play waiting there how it went."""
        thread = threading.Thread(
            target=self._drain_at_point, args=(request, run), name=f"drain-{run.ident}", daemon=True
        )
        thread.start()

    def _drain_at_point(self, request: RunRequest, run: runner.HostRun) -> None:
        try:
            # the cluster side reports progress (``draining: 3 pods left``) as the attempt's phase
            failure = self._cluster.drain(request, partial(self._set_phase, request.ident))
        except Exception:  # the play must hear back in any case, or it waits until its own timeout
            log.exception("machine=%s run=%s: drain failed unexpectedly", request.machine, request.ident)
            failure = Blocked("drain: failed unexpectedly (see the service log)", retriable=True)
        if failure is not None:
            done = (
                request.capabilities[: request.capabilities.index(run.drain_before)]
                if run.drain_before
                else ()
            )
            message = failure.message
            if done:  # they stay applied: say so, the host is not as it was
                message += f"; applied before the drain: {', '.join(done)}"
            write_json(
                drain_failure_file(run.attempt_dir), {"message": message, "retriable": failure.retriable}
            )
        write_json(drain_file(run.attempt_dir), {"drained": failure is None})

    def _finish(
        self, request: RunRequest, number: int, attempt_dir: Path, outcome: Outcome, status: str
    ) -> None:
        self._cluster.after_play(request)  # before the outcome: a restart in between cleans up on its poll
        write_json(attempt_dir / "outcome.json", outcome.to_json())
        log.info(
            "machine=%s run=%s state=%s attempt=%d runner_status=%s %s",
            request.machine,
            request.ident,
            outcome.kind.value,
            number,
            status,
            outcome.detail,
        )
        if outcome.kind is OutcomeKind.TASK_FAILED:
            log.warning(
                "machine=%s run=%s failed: capability=%s task=%r (artifacts: %s)",
                request.machine,
                request.ident,
                outcome.capability,
                outcome.task,
                attempt_dir,
            )
        self._finished(request)
