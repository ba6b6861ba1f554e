"""Shared pytest configuration: registers the host lab plugin (``lab``, ``lab_hosts``, ``lab_inventory``)
and the Kubernetes lab plugin (``kubelab``, ``kubelab_capi``, ``kubelab_mcm``), and sorts the tests into
the work units of parallel runs. The async tests (``pytest.mark.anyio``) run on asyncio, the loop the
service runs on (uvicorn's).

``scripts/test`` runs the suite in pytest-xdist workers (``-n N --dist loadgroup``). Each worker is its
own pytest session, so it brings up its own host lab and Kubernetes lab (named after its PID, on a free
slot and free ports) when its first test needs one. A work unit is an ``xdist_group``: its tests run on
one worker, in order, as in a serial run:

- every test marked ``mcm`` is in one unit: one MCM lab serves them all, as in a serial run;
- the tests marked ``capi`` are in one unit per module (``capi-lab:<module>``): CAPD listens on fixed
  ports, so one CAPI lab runs per machine, and the workers share it (``kubelab_capi``), each module's
  clusters in namespaces of its own; a new CAPI module is a new unit, spread with no list to edit;
- every test on the real nodes (fixtures ``node_cluster`` and ``kubeadm_cluster``) is in one unit: one
  node lab (four booted nodes with kubelets) per run, and the kubeadm cluster's two nodes;
- every other test is in the unit of its module, so a module-scoped fixture is made once.

The lab units come first in the collection, then the modules that use a lab, then the rest
(``--no-loadscope-reorder`` keeps this order): xdist hands the first units to the workers as they start,
so the node unit (the longest since its kubeadm control plane and MCM Jobs tests: about 20 minutes) and
the MCM unit (about 15) start at once, the CAPI modules on the third worker and on each worker that
frees (several at a time, on the shared CAPI lab), and the quick modules fill the end.

On a machine whose kubelab binaries are not all built, ``scripts/test`` runs the suite in two parts, split
by ``--kube-tests``: ``deselect`` (every test not marked ``kube``: they need no kubelab binary) while the
build runs in the background, then ``only`` (the tests marked ``kube``) beside the rest of the build, each
lab waiting for its own binaries (``kubelab.build.ensure_built``). The default ``run`` keeps them all, as a
warm run does in one part.

The CAPI tests share one CAPI lab per machine (CAPD listens on fixed ports), so every test marked
``capi`` holds a shared lock on ``<KUBELAB_RUN_DIR>/capi-tests.lock`` from its setup to its teardown, and
a test marked ``capi_alone`` (it restarts a part of the lab, e.g. the kube-apiserver) holds it
exclusively: it waits for the CAPI tests running elsewhere to end and none starts meanwhile.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from kubelab.config import Config

# run_timeline: where a run's time goes, when INPLACE_TEST_TIMELINE names a file (scripts/test)
pytest_plugins = ["hostlab.pytest_plugin", "kubelab.pytest_plugin", "run_timeline"]

# the lab units, in this order at the start of the collection (the longest first); "capi-lab" stands
# for every "capi-lab:<module>" unit
# (Not the CAPI workload module earlier, though it is one of the longest: it would meet the node unit at
# the start, and their ten nodes' writable layers are tmpfs of 1-2 GiB each: 16.5 GiB measured.)
LAB_UNITS = ("node-lab", "mcm-lab", "capi-lab")
LAB_MARKERS = ("lab", "kube", "image")  # tests that start hosts, a control plane or a container
# the fixtures of the real nodes' unit: the shared node lab, and the kubeadm cluster of
# test_node_control_plane.py (two nodes of its own); one unit, so their tests run one after another
NODE_LAB_FIXTURES = {"node_cluster", "kubeadm_cluster"}


# --kube-tests: which side of the split by the kube marker a run keeps (scripts/test's two parts)
KUBE_TESTS = {
    "run": "every test (the default)",
    "deselect": "deselect the tests marked kube: those that need the kubelab's built binaries",
    "only": "deselect every test not marked kube",
}


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--kube-tests",
        choices=tuple(KUBE_TESTS),
        default="run",
        help="; ".join(f"{choice}: {what}" for choice, what in KUBE_TESTS.items()),
    )


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _module(item: pytest.Item) -> str:
    return item.nodeid.split("::", 1)[0]


def _lab_unit(item: pytest.Item) -> str | None:
    if item.get_closest_marker("capi") is not None:
        return f"capi-lab:{_module(item)}"  # one unit per module: the workers share the CAPI lab
    if item.get_closest_marker("mcm") is not None:
        return "mcm-lab"
    if NODE_LAB_FIXTURES & set(getattr(item, "fixturenames", ())):
        return "node-lab"  # the real nodes (tests/nodes/conftest.py): one node lab per run
    return None


def work_unit(item: pytest.Item) -> str:
    """The xdist_group of a test: its lab's unit, else its module."""
    return _lab_unit(item) or _module(item)


def kube_tests_kept(items: list[pytest.Item], choice: str) -> tuple[list[pytest.Item], list[pytest.Item]]:
    """The tests a run keeps and those it deselects under ``--kube-tests=choice``."""
    if choice == "run":
        return items, []
    keep_kube = choice == "only"
    kept = [item for item in items if (item.get_closest_marker("kube") is not None) == keep_kube]
    dropped = [item for item in items if (item.get_closest_marker("kube") is not None) != keep_kube]
    return kept, dropped


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the xdist_group marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    kept, dropped = kube_tests_kept(items, config.getoption("kube_tests", default="run"))
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept
    if not hasattr(config, "workerinput"):
        return  # not an xdist worker: a serial run keeps the plain collection order
    for item in items:
        item.add_marker(pytest.mark.xdist_group(work_unit(item)))
    items.sort(key=_start_rank)  # stable: within a rank, the collection order stays


def _start_rank(item: pytest.Item) -> int:
    """Longest first: the lab units, then modules that use a lab, then the rest (seconds each)."""
    unit = _lab_unit(item)
    if unit is not None:
        return LAB_UNITS.index(unit.split(":", 1)[0])
    uses_lab = any(item.get_closest_marker(m) is not None for m in LAB_MARKERS)
    return len(LAB_UNITS) + (0 if uses_lab else 1)


@contextmanager
def capi_lab_share(alone: bool) -> Iterator[None]:
    """Hold the machine's CAPI lab with the others (shared) or alone (exclusive) while the block runs.

    flock(2) grants a shared lock while an exclusive one waits, so tests starting one after another on
    the other workers could keep an exclusive waiter out for ever. A turnstile lock orders them: a test
    passes it before it takes its share, and an exclusive waiter holds it until it has the lab, so the
    tests that start meanwhile queue behind it.
    """
    run_dir = Config.from_env().run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    turnstile = os.open(run_dir / "capi-tests.turnstile", os.O_RDWR | os.O_CREAT, 0o644)
    fd = os.open(run_dir / "capi-tests.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        finally:
            fcntl.flock(turnstile, fcntl.LOCK_UN)
        yield
    finally:
        os.close(fd)
        os.close(turnstile)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Setup (module fixtures included), call and teardown of a CAPI test under the lab's share lock."""
    if item.get_closest_marker("capi") is None:
        return (yield)
    with capi_lab_share(alone=item.get_closest_marker("capi_alone") is not None):
        return (yield)
