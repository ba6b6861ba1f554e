"""The engine both entry points run updates with: the one place that turns the settings, the capabilities
file and the cluster access into a ready :class:`~inplace_extension.runs.service.RunService`.

``serve`` (the CAPI Runtime Extension) and ``mcm-agent`` (MCM's node-side updater) build it here, so
what the capabilities file says (its roles, the health gate's command checks, the maintenance windows)
holds in every mode.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from inplace_extension.capabilities_file import CapabilitiesFileError, FileConfig, load_file
from inplace_extension.inplace.custom import NO_CUSTOM, CustomTable
from inplace_extension.metrics import Metrics
from inplace_extension.runs.local import LocalBackend, PlayConfig
from inplace_extension.runs.model import (
    NO_CLUSTER_SIDE,
    NO_OBJECT_HEALTH,
    ClusterSide,
    HostCheck,
    ObjectHealth,
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


def host_checks(custom: CustomTable) -> tuple[HostCheck, ...]:
    """The health gate's command checks, which the play runs on the host before it writes the stamp."""
    return tuple(HostCheck(c.name, c.command, c.timeout_seconds) for c in custom.command_checks)


def build_engine(
    settings: Settings,
    config: FileConfig,
    metrics: Metrics,
    cluster: ClusterSide = NO_CLUSTER_SIDE,
    object_health: ObjectHealth = NO_OBJECT_HEALTH,
) -> RunService:
    """The run service for ``settings`` and what the capabilities file configures (its roles, the health
    gate's command checks, the maintenance windows); ``cluster`` is what a run does in the cluster around
    its play (the Kubernetes-aware mode of ``serve``), nothing otherwise; ``object_health``: the file's
    ``kubernetes`` health checks over the cluster the caller reads them in (``serve``: each Machine's
    workload cluster; ``mcm-agent``: the target cluster)."""
    backend = LocalBackend(
        settings, cluster=cluster, play=play_config(config), metrics=metrics, clock=time.time
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


def play_config(config: FileConfig) -> PlayConfig:
    """What the capabilities file adds to every play: its roles, command checks and role settings."""
    return PlayConfig(
        roles_paths=tuple(Path(path) for path in config.custom.roles_paths),
        host_checks=host_checks(config.custom),
        role_vars=dict(config.role_vars),
    )
