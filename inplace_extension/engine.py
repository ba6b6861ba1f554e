"""The engine both entry points run updates with: the one place that turns the settings, the capabilities
file and the cluster access into a ready :class:`~inplace_extension.runs.service.RunService`.

``serve`` (the CAPI Runtime Extension) and ``mcm-agent`` (MCM's node-side updater) build it here, so
what the capabilities file says (its roles, the health gate's command checks, the maintenance windows)
holds in every mode.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inplace_extension.capabilities_file import CapabilitiesFileError, FileConfig, load_file
from inplace_extension.inplace.custom import NO_CUSTOM, CustomTable
from inplace_extension.kube.client import KubeConfigError
from inplace_extension.kube.cluster import connect_attempts
from inplace_extension.kube.errors import KubeError
from inplace_extension.kube.port import JobCluster, RecordRef
from inplace_extension.kubejobs.backend import JobBackend
from inplace_extension.kubejobs.manifest import JobConfig
from inplace_extension.kubejobs.spec import JOB_SETTINGS
from inplace_extension.local.backend import LocalBackend
from inplace_extension.metrics import Metrics
from inplace_extension.plays.batch import PlayConfig
from inplace_extension.runs.backend import Backend
from inplace_extension.runs.model import (
    ClusterSide,
    CommandCheck,
    ObjectHealth,
    RunRequest,
)
from inplace_extension.runs.service import RunDeps, RunService
from inplace_extension.settings import Settings

log = logging.getLogger(__name__)


def load_config(path: Path | None) -> FileConfig:
    """What ``--capabilities-file`` configures (nothing without one), logged by name only; a bad file
    raises :class:`~inplace_extension.capabilities_file.CapabilitiesFileError` naming the line and field."""
    if path is None:
        return FileConfig(NO_CUSTOM)
    config = load_file(path.expanduser())
    names = ", ".join(config.custom.names) or "no capabilities"
    windows = ", ".join(window.name for window in config.windows.windows) or "none"
    checks = ", ".join(check.name for check in config.custom.health_checks) or "none"
    log.info(
        "capabilities file %s: %s; maintenance windows: %s; health checks: %s", path, names, windows, checks
    )
    return config


def refuse_url_checks(config: FileConfig, path: Path | None, mode: str) -> None:
    """``url`` health checks are asked only by the health gate of ``serve``'s Kubernetes-aware mode
    (after the Node checks): ``mode``, which has no such gate, refuses a file that has one, naming the
    first and the mode, rather than ignoring it (``CapabilitiesFileError``, exit 2)."""
    if config.custom.http_checks:
        check = config.custom.http_checks[0]
        raise CapabilitiesFileError(
            f'capabilities file {path}: the url health check "{check.name}" is asked only by the health '
            f"gate of serve's Kubernetes-aware mode (--kube or --kubeconfig): {mode} would never ask it"
        )


def host_checks(custom: CustomTable) -> tuple[CommandCheck, ...]:
    """The health gate's command checks, which the play runs on the host before it writes the stamp."""
    return tuple(CommandCheck(c.name, c.command, c.timeout_seconds) for c in custom.command_checks)


@dataclass(frozen=True)
class Records:
    """Where the ``kubernetes`` executor keeps each update's record: on the CAPI ``Machine`` (``serve``)
    or on the ``Node`` (``mcm-agent``), in the cluster of ``kubeconfig`` (None: the in-cluster account)."""

    kind: str
    kubeconfig: Path | None


class ExecutorError(ValueError):
    """The executor cannot run as configured (said at start-up, naming the flag)."""


def build_engine(
    settings: Settings,
    config: FileConfig,
    metrics: Metrics,
    cluster: ClusterSide,
    object_health: ObjectHealth,
    *,
    records: Records | None,
    jobs_kubeconfig: Path | None,
) -> RunService:
    """The run service for ``settings`` and what the capabilities file configures (its roles, the health
    gate's command checks, the maintenance windows); ``cluster`` is what a run does in the cluster around
    its play (the Kubernetes-aware mode of ``serve``), nothing otherwise; ``object_health``: the file's
    ``kubernetes`` health checks over the cluster the caller reads them in (``serve``: each Machine's
    workload cluster; ``mcm-agent``: the target cluster). ``--executor kubernetes`` needs ``records``
    (the edge's cluster access; None: it has none, and the start is refused) and runs its Jobs in the
    cluster of ``jobs_kubeconfig``. Every dependency is given: a caller that forgets one is a type error,
    not a service that silently runs without it (``NO_CLUSTER_SIDE``, ``NO_OBJECT_HEALTH``: none)."""
    play = play_config(config)
    backend: Backend
    if settings.executor == "kubernetes":
        refuse_own_roles(config)
        backend = kubernetes_backend(settings, play, records, jobs_kubeconfig, cluster)
    else:
        backend = LocalBackend(
            settings,
            cluster=cluster,
            play=play,
            metrics=metrics,
            clock=time.time,
            fork_server=settings.fork_server,
        )
    return RunService(
        RunDeps(
            settings=settings,
            metrics=metrics,
            cluster=cluster,
            object_health=object_health,
            windows=config.windows,
            clock=time.time,
            backend=backend,
        )
    )


def refuse_own_roles(config: FileConfig) -> None:
    """The ``kubernetes`` executor plays in a Job of the service's image, which has the shipped roles and
    nothing the service's Pod mounts besides: a capabilities file's own roles (their ``roles_path``) are
    refused at start-up rather than missing from every play."""
    own = [c for c in config.custom.capabilities if c.roles_path]
    if own:
        named = ", ".join(f"{c.name} (roles_path {c.roles_path})" for c in own)
        raise ExecutorError(
            "--executor kubernetes cannot play the capabilities file's own roles: its Jobs run the "
            f"service's image, which does not have them: {named}; run these capabilities with "
            "--executor local"
        )


def job_settings(settings: Settings) -> dict[str, Any]:
    """The settings each Job runs with (spec.JOB_SETTINGS), as the service has them."""
    chosen = {name: getattr(settings, name) for name in JOB_SETTINGS}
    chosen["kube"] = settings.kube_aware  # the Job reaches the cluster with its in-cluster account
    # a path in the Job's image: the service's own directory unless --job-playbooks-dir names another
    playbooks_dir = settings.job_playbooks_dir or settings.playbooks_dir
    chosen["playbooks_dir"] = None if playbooks_dir is None else str(playbooks_dir)
    return chosen


def kubernetes_backend(
    settings: Settings,
    play: PlayConfig,
    records: Records | None,
    jobs_kubeconfig: Path | None,
    cluster: ClusterSide,
) -> JobBackend:
    """The ``kubernetes`` executor's backend: refused with a clear message without cluster access or image;
    ``cluster``: where it posts a Job that did not start (an Event)."""
    if records is None:
        raise ExecutorError("--executor kubernetes needs cluster access, and this command has none")
    kind = records.kind
    try:
        store = connect_attempts(records.kubeconfig)
        jobs = store if records.kubeconfig == jobs_kubeconfig else connect_attempts(jobs_kubeconfig)
    except KubeConfigError as exc:
        raise ExecutorError(
            f"--executor kubernetes needs cluster access (--kubeconfig, else the in-cluster account): {exc}"
        ) from None
    image = settings.job_image or own_image(settings, jobs)

    def where(request: RunRequest) -> RecordRef:
        if kind == "Node":  # the MCM agent's: one run per Node, named after it
            return RecordRef("Node", request.name)
        return RecordRef("Machine", request.name, request.namespace)

    capabilities = settings.capabilities_file
    return JobBackend(
        jobs=jobs,
        records=store,
        where=where,
        config=JobConfig.of(settings, image),
        play=play,
        job_settings=job_settings(settings),
        capabilities_file=None
        if capabilities is None
        else capabilities.expanduser().read_text(encoding="utf-8"),
        clock=time.time,
        cluster=cluster,
        start_seconds=settings.job_start_timeout_seconds,
    )


def own_image(settings: Settings, jobs: JobCluster) -> str:
    """The service's own image, read from its Pod (--pod-name, in --job-namespace)."""
    if settings.pod_name is None:
        raise ExecutorError(
            "--executor kubernetes needs --job-image, or --pod-name to run the Jobs from this Pod's image"
        )
    try:
        image = jobs.pod_image(settings.job_namespace, settings.pod_name)
    except KubeError as exc:
        raise ExecutorError(f"--executor kubernetes: cannot read this Pod's image: {exc}") from None
    if image is None:
        raise ExecutorError(
            f"--executor kubernetes: no Pod {settings.job_namespace}/{settings.pod_name} (--pod-name) to "
            "take the Jobs' image from: give --job-image"
        )
    return image


def play_config(config: FileConfig) -> PlayConfig:
    """What the capabilities file adds to every play: its roles, command checks and role settings."""
    return PlayConfig(
        roles_paths=tuple(Path(path) for path in config.custom.roles_paths),
        host_checks=host_checks(config.custom),
        role_vars=dict(config.role_vars),
    )
