"""The fixtures the ``kubernetes`` executor's lab-free tests share: the service's settings for it and a
management cluster (tests/kubefake.py) holding the Machine ``m1``. A module whose tests need other
settings defines its own ``settings``."""

from __future__ import annotations

from pathlib import Path

import pytest
from kubefake import FakeJobs

from inplace_extension.settings import Settings

from .support import kube_settings, machine_cluster


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return kube_settings(tmp_path)


@pytest.fixture
def cluster() -> FakeJobs:
    return machine_cluster()
