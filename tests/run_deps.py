"""The tests' way to build a :class:`~inplace_extension.runs.service.RunService`: :class:`RunDeps` with the
plain choice for each dependency a test does not name (no metrics, no cluster side, no checks of cluster
objects, no windows, the real clock, the ``local`` backend with no capabilities file). The service itself
has no defaults: ``engine.py`` names every dependency."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypedDict, Unpack

from inplace_extension.local.backend import LocalBackend
from inplace_extension.metrics import Metrics
from inplace_extension.plays.batch import NO_PLAY_CONFIG, PlayConfig
from inplace_extension.runs.backend import Backend
from inplace_extension.runs.model import NO_CLUSTER_SIDE, NO_OBJECT_HEALTH, ClusterSide, ObjectHealth
from inplace_extension.runs.service import RunDeps, RunService
from inplace_extension.runs.windows import NO_WINDOWS, Schedule
from inplace_extension.settings import Settings


def run_deps(
    settings: Settings,
    metrics: Metrics | None = None,
    *,
    cluster: ClusterSide = NO_CLUSTER_SIDE,
    object_health: ObjectHealth = NO_OBJECT_HEALTH,
    windows: Schedule = NO_WINDOWS,
    clock: Callable[[], float] = time.time,
    play: PlayConfig = NO_PLAY_CONFIG,
    backend: Backend | None = None,
) -> RunDeps:
    """``backend``: the one a test built (the ``kubernetes`` executor's, tests/kubejobs/support.py); None,
    the ``local`` backend of these choices (``play`` is its)."""
    return RunDeps(
        settings=settings,
        metrics=metrics,
        cluster=cluster,
        object_health=object_health,
        windows=windows,
        clock=clock,
        backend=(
            LocalBackend(settings, cluster=cluster, play=play, metrics=metrics, clock=clock)
            if backend is None
            else backend
        ),
    )


class DepChoices(TypedDict, total=False):
    """The dependencies a test may name (each one :func:`run_deps`'s keyword of the same name)."""

    cluster: ClusterSide
    object_health: ObjectHealth
    windows: Schedule
    clock: Callable[[], float]
    play: PlayConfig
    backend: Backend


def run_service(
    settings: Settings, metrics: Metrics | None = None, **choices: Unpack[DepChoices]
) -> RunService:
    """A service for ``settings`` and the dependencies a test names (the ``local`` executor unless it
    names a ``backend``)."""
    return RunService(run_deps(settings, metrics, **choices))
