"""One attempt inside its Job: the ``local`` backend's plumbing (the same playbook, host lock and stamp,
drain point, outcome classification) for the one attempt the service decided, then its outcome as the
container's termination message. The phase is published as it changes (the Pod's own annotation), so
a poll to any replica answers ``running: <phase>`` without reading logs.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Final

from inplace_extension.kube.errors import KubeError
from inplace_extension.kube.jobs import PHASE_ANNOTATION
from inplace_extension.kube.port import JobCluster
from inplace_extension.kubejobs.spec import AttemptSpec, interrupted, termination_message
from inplace_extension.runs.artifacts import Outcome
from inplace_extension.runs.backend import Launch
from inplace_extension.runs.local import HostLock, LocalBackend, PlayConfig
from inplace_extension.runs.model import ClusterSide
from inplace_extension.runs.outcomes import load_attempts
from inplace_extension.settings import Settings

log = logging.getLogger(__name__)

CLOSE_WAIT_SECONDS: Final = 15.0


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


def run_attempt(
    spec: AttemptSpec,
    *,
    settings: Settings,
    cluster: ClusterSide,
    publish: Callable[[str], None],
    termination_log: Path,
    timeout: float,
    clock: Callable[[], float] = time.time,
) -> Outcome:
    """Play ``spec``'s attempt in this process and write its outcome to ``termination_log``; an attempt
    whose play does not end within ``timeout`` seconds is interrupted (the Job's deadline ends it)."""
    play = PlayConfig(
        roles_paths=tuple(Path(path) for path in spec.roles_paths),
        host_checks=spec.host_checks,
        role_vars=spec.role_vars,
    )
    backend = LocalBackend(
        settings,
        cluster=cluster,
        play=play,
        metrics=None,
        clock=clock,
        on_phase=lambda _, phase: publish(phase),
    )
    request = spec.request
    log.info("machine=%s run=%s attempt=%d: playing", request.machine, request.ident, spec.number)
    try:
        backend.submit(
            Launch(request, spec.target, spec.token), HostLock(spec.lock_token, spec.takeover_tokens)
        )
        backend.wait_ended(request.ident, timeout)
    finally:
        backend.close(CLOSE_WAIT_SECONDS)
    attempts = load_attempts(settings.runs_dir.expanduser().resolve() / request.ident, request.fingerprint)
    last = attempts[-1].outcome if attempts else None
    outcome = last or interrupted(f"the play did not end within {timeout:.0f}s", clock())
    termination_log.write_text(termination_message(outcome), encoding="utf-8")
    return outcome
