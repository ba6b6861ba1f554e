"""pytest plugin: one Kubernetes lab per test session for tests marked ``kube`` (``pytest_plugins``).

Fixtures:

- ``kubelab`` (session): a running core :class:`kubelab.lab.Lab` named ``pytest-<pid>`` (etcd,
  kube-apiserver, kube-controller-manager, kwok), built first if needed, torn down at the end of the
  session, also after failures. Labs left by killed sessions are torn down first.
- ``kubelab_capi`` / ``kubelab_mcm`` / ``kubelab_nodes`` (session): the same lab with that flavour
  started (once); ``nodes`` lets real nodes join with ``kubeadm join`` (:mod:`kubelab.node_join`).
- helpers to create kwok Nodes, Pods and evictions: :mod:`kubelab.objects`.

When the lab cannot start for a reason of the machine (no Go toolchain and nothing built): with
``CI=true`` the test errors with the reason, elsewhere it is skipped with it (hostlab's rule). Any
other start failure is an error everywhere. A test using these fixtures must be marked
``@pytest.mark.kube`` (and ``capi`` / ``mcm`` for the flavours).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from typing import NoReturn

import pytest
from hostlab.errors import LabError
from hostlab.pytest_plugin import lab_required

from kubelab.config import Config
from kubelab.lab import Lab, reap_stale

FIXTURE_MARKERS = {"kubelab": "kube", "kubelab_capi": "capi", "kubelab_mcm": "mcm", "kubelab_nodes": "kube"}


def unavailable(reason: str) -> NoReturn:
    if lab_required():
        pytest.fail(
            f"kubelab: the Kubernetes lab is required here (CI=true) but cannot start: {reason}",
            pytrace=False,
        )
    pytest.skip(f"kubelab: {reason}")


def pytest_runtest_setup(item: pytest.Item) -> None:
    names = set(getattr(item, "fixturenames", ()))
    for fixture, marker in FIXTURE_MARKERS.items():
        for needed in {marker, "kube"}:
            if fixture in names and item.get_closest_marker(needed) is None:
                pytest.fail(
                    f"{item.nodeid} uses {fixture} but is not marked @pytest.mark.{needed}", pytrace=False
                )


@pytest.fixture(scope="session")
def kubelab() -> Iterator[Lab]:
    cfg = Config.from_env()
    go = shutil.which(cfg.go) if "/" not in cfg.go else cfg.go
    reap_stale(cfg)
    the_lab = Lab(f"pytest-{os.getpid()}", cfg)
    try:
        the_lab.up(owner_pid=os.getpid())
    except LabError as exc:
        the_lab.down()
        if go is None:
            unavailable(f"no Go toolchain ({cfg.go}) to build the lab: {exc}")
        pytest.fail(f"kubelab: lab did not start: {exc}", pytrace=False)
    try:
        yield the_lab
    finally:
        the_lab.down()


def _flavoured(lab: Lab, flavour: str) -> Lab:
    try:
        lab.ensure_flavour(flavour)
    except LabError as exc:
        pytest.fail(f"kubelab: flavour {flavour} did not start: {exc}", pytrace=False)
    return lab


@pytest.fixture(scope="session")
def kubelab_capi(kubelab: Lab) -> Lab:
    return _flavoured(kubelab, "capi")


@pytest.fixture(scope="session")
def kubelab_mcm(kubelab: Lab) -> Lab:
    return _flavoured(kubelab, "mcm")


@pytest.fixture(scope="session")
def kubelab_nodes(kubelab: Lab) -> Lab:
    return _flavoured(kubelab, "nodes")
