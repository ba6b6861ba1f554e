"""pytest plugin: a session-wide host lab for tests marked ``lab`` (register with ``pytest_plugins``).

Fixtures:

- ``lab`` (session): a :class:`hostlab.lab.Lab` named ``pytest-<pid>`` with ``HOSTLAB_HOSTS`` hosts
  (default 3), brought up once and torn down at the end of the session, also after failures. Labs left
  by killed sessions (owner process gone) are torn down first. Helpers on it: ``lab.ssh(host, argv)``,
  ``lab.read_file(host, path)``, ``lab.exec_in(host, argv)``, ``lab.reset(host)``, ``lab.ansible_env()``.
- ``lab_hosts`` (function): the lab's hosts, each reset to a clean state (and every fault undone)
  before the test.
- ``lab_inventory`` (function): a callable writing an inventory file into the test's tmp_path.

And :func:`nodes_lab`, a lab of nodes of a module's own (systemd, containerd: for kubeadm), as a
context manager for a module's fixture.

When the lab cannot start: with ``CI=true`` (or ``HOSTLAB_REQUIRED=1``) the test errors with the reason,
elsewhere it is skipped with the reason (not root, no network namespaces, ...). A test that uses these
fixtures must be marked ``@pytest.mark.lab``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import NoReturn

import pytest

from hostlab import prereqs
from hostlab.config import Config
from hostlab.errors import LabError, LabUnavailable
from hostlab.inventory import render
from hostlab.lab import Host, Lab, reap_stale
from hostlab.state import NODE

LAB_FIXTURES = {"lab", "lab_hosts", "lab_inventory"}
WriteInventory = Callable[..., Path]


def lab_required() -> bool:
    """CI must not silently skip the lab tests: there, a lab that cannot start is an error."""
    return os.environ.get("CI", "").lower() == "true" or os.environ.get("HOSTLAB_REQUIRED") == "1"


def required(what: str, reason: str) -> NoReturn:
    """``what`` a test needs cannot run for ``reason``: an error where the labs are required (CI), else
    a skip saying why. The one place a lab-side test decides between the two."""
    if lab_required():
        pytest.fail(f"{what}: required here (CI=true) but cannot run: {reason}", pytrace=False)
    pytest.skip(f"{what}: {reason}")


def unavailable(reason: str) -> NoReturn:
    """Something the host lab needs is missing (see :func:`required`)."""
    required("hostlab", reason)


@contextmanager
def nodes_lab(suffix: str, count: int = 2) -> Iterator[Lab]:
    """A lab of ``count`` nodes (``kind="node"``: systemd, containerd) of its own, named
    ``pytest-<pid>-<suffix>``, down at the end; :func:`unavailable` where nodes cannot run."""
    cfg = Config.from_env()
    why = prereqs.missing(cfg, NODE)
    if why:
        unavailable(why)
    the_lab = Lab(f"pytest-{os.getpid()}-{suffix}", cfg)
    try:
        the_lab.up(count, owner_pid=os.getpid(), kind=NODE)
        yield the_lab
    finally:
        the_lab.down()


def pytest_runtest_setup(item: pytest.Item) -> None:
    uses_lab = LAB_FIXTURES & set(getattr(item, "fixturenames", ()))
    if uses_lab and item.get_closest_marker("lab") is None:
        pytest.fail(
            f"{item.nodeid} uses {', '.join(sorted(uses_lab))} but is not marked @pytest.mark.lab",
            pytrace=False,
        )


@pytest.fixture(scope="session")
def lab() -> Iterator[Lab]:
    cfg = Config.from_env()
    why = prereqs.missing(cfg)
    if why:
        unavailable(why)
    wanted = os.environ.get("HOSTLAB_HOSTS", "3")
    if not wanted.isdigit():
        pytest.fail(f"hostlab: HOSTLAB_HOSTS must be a number of hosts, got {wanted!r}", pytrace=False)
    count = int(wanted)
    reap_stale(cfg)
    the_lab = Lab(f"pytest-{os.getpid()}", cfg)
    try:
        the_lab.up(count, owner_pid=os.getpid())
    except LabUnavailable as exc:
        the_lab.down()
        unavailable(str(exc))
    except LabError as exc:
        the_lab.down()
        pytest.fail(f"hostlab: lab did not start: {exc}", pytrace=False)
    try:
        yield the_lab
    finally:
        the_lab.down()


@pytest.fixture
def lab_hosts(lab: Lab) -> list[Host]:
    """Every host of the session lab, reset to a fresh state (no changes, no faults) for this test."""
    return [lab.reset(host.name) for host in lab.hosts()]


@pytest.fixture
def lab_inventory(lab: Lab, tmp_path: Path) -> WriteInventory:
    """``lab_inventory(machine_names=None, fmt="service") -> Path`` writes an inventory into tmp_path."""

    def write(machine_names: Sequence[str] | None = None, fmt: str = "service") -> Path:
        path = tmp_path / f"inventory-{fmt}.{'ini' if fmt == 'ini' else 'yaml'}"
        path.write_text(render(lab, fmt, machine_names))
        return path

    return write
