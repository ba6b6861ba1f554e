"""One attempt inside its Job: the batch play the ``local`` backend's worker threads run (plays/batch.py: the
same playbook, host lock and stamp, drain point, outcome classification) for the one attempt the service
decided, played at once in the calling thread (no queue, batch window or worker thread), then its outcome
as the container's termination message. The phase is published as it changes (the Pod's own annotation),
so a poll to any replica answers ``running: <phase>`` without reading logs. A deleted or evicted Pod
(SIGTERM) or the attempt's own deadline stops the play (:class:`PlayStop`): the outcome is then
interrupted, written within the Pod's grace period, and says whether the play had passed its drain point
(by its own events, as the ``local`` executor tells of a play whose process died), so that the next
attempt resumes it unchecked, or is a new start.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Final

from inplace_extension.kube.errors import KubeError
from inplace_extension.kube.jobs import PHASE_ANNOTATION
from inplace_extension.kube.port import JobCluster
from inplace_extension.kubejobs.spec import AttemptSpec, interrupted, termination_message
from inplace_extension.plays.artifacts import read_json, stop_play
from inplace_extension.plays.batch import BatchAttempt, BatchPlayer, HostLock, PlayConfig
from inplace_extension.plays.outcomes import load_attempts, past_drain_point
from inplace_extension.runs.attempts import Attempt, Outcome, OutcomeKind
from inplace_extension.runs.backend import Launch
from inplace_extension.runs.model import ClusterSide
from inplace_extension.settings import Settings

log = logging.getLogger(__name__)

# a play told to stop gets this long to end on SIGTERM before SIGKILL: with the outcome written after it,
# well within the Pod's grace period (manifest.py's STOP_GRACE_SECONDS)
KILL_AFTER_SECONDS: Final = 5.0
STOP_POLL_SECONDS: Final = 0.5


class PhasePublisher:
    """Publishes the attempt's phase on the Job's own Pod when it changes; a failed write is logged and
    the next change tries again (the phase is for the operator's eye, the outcome is what counts)."""

    def __init__(self, jobs: JobCluster, namespace: str, pod: str) -> None:
        self._jobs = jobs
        self._namespace = namespace
        self._pod = pod
        self._last: str | None = None

    def __call__(self, phase: str) -> None:
        if phase == self._last:
            return
        try:
            self._jobs.annotate_pod(self._namespace, self._pod, PHASE_ANNOTATION, phase)
            self._last = phase
        except KubeError as exc:
            log.warning(
                "cannot publish the phase %r on Pod %s/%s: %s", phase, self._namespace, self._pod, exc
            )


class PlayStop:
    """Ends the attempt's play early when told why (SIGTERM: the Pod is being deleted or evicted; the
    attempt's own deadline): SIGTERM to the play's processes at once, SIGKILL after
    :data:`KILL_AFTER_SECONDS`, asked again every :data:`STOP_POLL_SECONDS` until the play is over (a play
    that was about to start when told is ended as it starts). The host lock the play held stays with its
    token, which the record's outcome names: the next attempt takes it over at once."""

    def __init__(self, batches_dir: Path) -> None:
        self._batches_dir = batches_dir  # the Job's own runs dir: this attempt's play and no other
        self._reason: str | None = None
        # set by __call__, which a signal handler runs: it takes no lock the interrupted code may hold
        self._told = threading.Event()
        self._over = threading.Event()
        threading.Thread(target=self._stop, name="play-stop", daemon=True).start()

    @property
    def reason(self) -> str | None:
        """Why the play was told to stop (None: it was not, or only once it had ended)."""
        return self._reason

    def __call__(self, reason: str) -> None:
        """Stop the play, for ``reason`` (the first reason given is the one recorded). Returns at once."""
        if self._over.is_set():
            return
        if self._reason is None:
            self._reason = reason
        self._told.set()

    def over(self) -> None:
        """The play has ended: nothing left to stop."""
        self._over.set()
        self._told.set()

    def _stop(self) -> None:
        self._told.wait()
        if self._over.is_set():
            return
        log.warning("stopping the play: %s", self._reason)
        started = time.monotonic()
        while True:
            sig = signal.SIGTERM if time.monotonic() - started < KILL_AFTER_SECONDS else signal.SIGKILL
            for batch_dir in self._batches_dir.glob("batch-*"):
                stop_play(batch_dir, sig)
            if self._over.wait(STOP_POLL_SECONDS):
                return


# the attempt's exit status once SIGTERM stopped its play (128 + the signal, as a shell reports it): not
# 0, so that its deleted or evicted Pod ends Failed and so does its Job. With 0, the Job controller counts
# the Pod failed or succeeded by which it sees first, its deletion or the kubelet's Succeeded phase (a
# whole CI run saw a deleted Pod's Job end Complete); the outcome in the termination message is the same.
STOPPED_EXIT_STATUS: Final = 128 + signal.SIGTERM


def stop_on_sigterm(stop: Callable[[str], None]) -> threading.Event:
    """Have SIGTERM stop the play; the event returned is set once it has. Without a handler of its own,
    the attempt, PID 1 of its container, would never see the kubelet's SIGTERM: the kernel drops it, and
    the play ran on until SIGKILL at the end of the grace period, with no outcome written. Main thread
    only."""
    told = threading.Event()

    def on_sigterm(signum: int, frame: FrameType | None) -> None:
        told.set()
        stop("the attempt was stopped (SIGTERM: its Pod was deleted or evicted)")

    signal.signal(signal.SIGTERM, on_sigterm)
    return told


def run_attempt(
    spec: AttemptSpec,
    *,
    settings: Settings,
    cluster: ClusterSide,
    publish: Callable[[str], None],
    termination_log: Path,
    timeout: float,
    stop: PlayStop | None = None,
    clock: Callable[[], float] = time.time,
) -> Outcome:
    """Play ``spec``'s attempt in this thread and write its outcome to ``termination_log``. The play is
    stopped when ``stop`` is called (SIGTERM), or after ``timeout`` seconds (before the Job's deadline
    ends the Pod); a play stopped before it proved its update is interrupted (retried)."""
    play = PlayConfig(
        roles_paths=tuple(Path(path) for path in spec.roles_paths),
        host_checks=spec.host_checks,
        role_vars=spec.role_vars,
    )
    player = BatchPlayer(
        settings,
        cluster=cluster,
        play=play,
        metrics=None,
        clock=clock,
        set_phase=lambda _, phase: publish(phase),
        # the Job's own runs dir holds this one attempt: the episodes are the record's (record.py)
        episode=lambda _: "",
        finished=lambda _: None,
    )
    runs_dir = settings.runs_dir.expanduser().resolve()
    stop = stop or PlayStop(runs_dir / ".batches")
    deadline = threading.Timer(timeout, stop, args=(f"the play did not end within {timeout:.0f}s",))
    deadline.daemon = True
    request = spec.request
    log.info("machine=%s run=%s attempt=%d: playing", request.machine, request.ident, spec.number)
    deadline.start()
    try:
        player.play(
            [
                BatchAttempt(
                    Launch(request, spec.target, spec.token, resumes=spec.resumes),
                    HostLock(spec.lock_token, spec.takeover_tokens),
                )
            ]
        )
    finally:
        deadline.cancel()
        stop.over()
    # the Job's own runs dir (an emptyDir) holds this one attempt: of whichever episode
    attempts = load_attempts(runs_dir / request.ident, request.fingerprint, episode=None)
    last = attempts[-1].outcome if attempts else None
    # a play that dies here was begun by this Job: whether it may have disrupted the machine, by its own
    # events (a resumed one leaves the machine disrupted in any case: the play it resumed did)
    disrupted = spec.resumes or (bool(attempts) and _past_drain_point(attempts[-1]))
    stopped = stop.reason
    if stopped is not None and (last is None or last.kind is not OutcomeKind.SUCCESSFUL):
        # killed mid-way, whatever the remains look like (a killed ssh reads as unreachable)
        outcome = interrupted(stopped, clock(), died_past_drain_point=disrupted)
    else:
        outcome = last or interrupted(
            "the play ended without an outcome", clock(), died_past_drain_point=disrupted
        )
    termination_log.write_text(termination_message(outcome), encoding="utf-8")
    return outcome


def _past_drain_point(attempt: Attempt) -> bool:
    """Whether ``attempt``'s play (recorded in the Job's own runs dir) reached its drain point, or, with
    none, began a step: as the ``local`` executor tells of a play whose process died (outcomes.py)."""
    meta = read_json(attempt.path / "meta.json") if attempt.path is not None else None
    return past_drain_point(meta or {})
