"""pytest plugin: one Kubernetes lab per test session for tests marked ``kube`` (``pytest_plugins``).

Fixtures:

- ``kubelab`` (session): a running core :class:`kubelab.lab.Lab` named ``pytest-<pid>`` (etcd,
  kube-apiserver, kube-controller-manager, kwok), built first if needed, torn down at the end of the
  session, also after failures. Labs left by killed sessions are torn down first.
- ``kubelab_mcm`` / ``kubelab_nodes`` (session): the same lab with that flavour started (once);
  ``nodes`` lets real nodes join with ``kubeadm join`` (:mod:`kubelab.node_join`).
- ``kubelab_capi`` (session): a lab of its own with the ``capi`` flavour, **shared by every worker of a
  parallel run** (pytest-xdist): CAPD's in-memory backend listens on fixed ports, so one CAPI lab runs
  per machine, and the CAPI tests of several workers use it at once, each in namespaces of its own.
  The lab is named ``pytest-capi-<owner pid>``, owned by the xdist controller (or by the session itself
  in a serial run): the first worker that needs it starts it under a file lock, the others attach to it
  through its state file, and the owner tears it down when its session ends (a killed owner's lab is
  reaped like any other).
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
from contextlib import suppress
from pathlib import Path
from typing import Any, NoReturn, Protocol

import pytest
from hostlab.errors import LabError
from hostlab.proc import file_lock
from hostlab.pytest_plugin import lab_required

from kubelab import state
from kubelab.config import Config
from kubelab.lab import Lab, reap_stale

FIXTURE_MARKERS = {"kubelab": "kube", "kubelab_capi": "capi", "kubelab_mcm": "mcm", "kubelab_nodes": "kube"}
# the flavours whose lab every worker of a run shares (one per run), and the workerinput key naming its owner
SHARED_FLAVOURS = ("capi",)
OWNER_KEY = "kubelab_shared_labs_owner"
SHARED_START_TIMEOUT = 3600.0  # the starting worker may wait for another run's CAPD (capi.CAPD_WAIT) first


class WorkerNode(Protocol):
    """What the controller sees of an xdist worker here (xdist's WorkerController has no type hints)."""

    workerinput: dict[str, Any]


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


def _up(the_lab: Lab, owner: int) -> None:
    """Start the core lab, reaping killed sessions' labs first; fail (or skip) the test if it cannot."""
    cfg = the_lab.cfg
    go = shutil.which(cfg.go) if "/" not in cfg.go else cfg.go
    reap_stale(cfg)
    try:
        the_lab.up(owner_pid=owner)
    except LabError as exc:
        the_lab.down()
        if go is None:
            unavailable(f"no Go toolchain ({cfg.go}) to build the lab: {exc}")
        pytest.fail(f"kubelab: lab did not start: {exc}", pytrace=False)


@pytest.fixture(scope="session")
def kubelab() -> Iterator[Lab]:
    the_lab = Lab(f"pytest-{os.getpid()}", Config.from_env())
    _up(the_lab, os.getpid())
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


def shared_lab_name(flavour: str, owner: int) -> str:
    return f"pytest-{flavour}-{owner}"


def _shared_lock(cfg: Config, name: str) -> Path:
    # beside the lab's directory, not in it: `down` removes the directory while another worker may wait
    return cfg.run_dir / "labs" / f".{name}.lock"


def _owner(config: pytest.Config) -> int:
    """The process owning this run's shared labs: the xdist controller, else this session's process."""
    workerinput = getattr(config, "workerinput", {})
    return int(workerinput.get(OWNER_KEY, os.getpid()))


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: WorkerNode) -> None:
    """xdist controller: tell each worker which process owns (and tears down) the shared labs."""
    node.workerinput[OWNER_KEY] = os.getpid()


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    """The owner's session ends after every worker's: down the shared labs its workers started."""
    if hasattr(session.config, "workerinput"):
        return
    cfg = Config.from_env()
    for flavour in SHARED_FLAVOURS:
        name = shared_lab_name(flavour, os.getpid())
        the_lab = Lab(name, cfg)
        if the_lab.dir.exists():
            the_lab.down()
        with suppress(FileNotFoundError):
            _shared_lock(cfg, name).unlink()


def _shared(config: pytest.Config, flavour: str) -> Lab:
    """This run's lab for ``flavour``: the first worker that needs it starts it, the others attach."""
    owner = _owner(config)
    cfg = Config.from_env()
    the_lab = Lab(shared_lab_name(flavour, owner), cfg)
    lock = _shared_lock(cfg, the_lab.name)
    with file_lock(lock, what="kubelab shared lab lock", timeout=SHARED_START_TIMEOUT):
        current = state.load(the_lab.dir)
        if current is None or not all(c.running() for c in current.components):
            _up(the_lab, owner)
        return _flavoured(the_lab, flavour)


@pytest.fixture(scope="session")
def kubelab_capi(request: pytest.FixtureRequest) -> Iterator[Lab]:
    the_lab = _shared(request.config, "capi")
    yield the_lab
    if _owner(request.config) == os.getpid():  # a serial run; in parallel runs the controller downs it
        the_lab.down()


@pytest.fixture(scope="session")
def kubelab_mcm(kubelab: Lab) -> Lab:
    return _flavoured(kubelab, "mcm")


@pytest.fixture(scope="session")
def kubelab_nodes(kubelab: Lab) -> Lab:
    return _flavoured(kubelab, "nodes")
