"""Shared pytest configuration: registers the host lab plugin (``lab``, ``lab_hosts``, ``lab_inventory``)
and the Kubernetes lab plugin (``kubelab``, ``kubelab_capi``, ``kubelab_mcm``), and sorts the tests into
the work units of parallel runs.

``scripts/test`` runs the suite in pytest-xdist workers (``-n N --dist loadgroup``). Each worker is its
own pytest session, so it brings up its own host lab and Kubernetes lab (named after its PID, on a free
slot and free ports) when its first test needs one. A work unit is an ``xdist_group``: its tests run on
one worker, in order, as in a serial run:

- every test marked ``capi`` is in one unit: CAPD listens on fixed ports, so one CAPI lab runs per
  machine at a time, and its tests share the worker's lab (and module-scoped clusters) that way;
- every test marked ``mcm`` is in one unit: one MCM lab serves them all, as in a serial run;
- every other test is in the unit of its module, so a module-scoped fixture is made once.

The lab units come first in the collection, then the modules that use a lab, then the rest
(``--no-loadscope-reorder`` keeps this order): xdist hands the first units to the workers as they start,
so the two longest units start at once on two workers while the others share the remaining modules,
longest first, and the quick ones fill the end.
"""

from __future__ import annotations

import pytest

pytest_plugins = ["hostlab.pytest_plugin", "kubelab.pytest_plugin"]

# marker -> work unit; in this order at the start of the collection (the longest first)
LAB_UNITS = {"capi": "capi-lab", "mcm": "mcm-lab"}
LAB_MARKERS = ("lab", "kube", "image")  # tests that start hosts, a control plane or a container


def work_unit(item: pytest.Item) -> str:
    """The xdist_group of a test: its lab's unit, else its module."""
    for marker, unit in LAB_UNITS.items():
        if item.get_closest_marker(marker) is not None:
            return unit
    return item.nodeid.split("::", 1)[0]


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the xdist_group marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not hasattr(config, "workerinput"):
        return  # not an xdist worker: a serial run keeps the plain collection order
    for item in items:
        item.add_marker(pytest.mark.xdist_group(work_unit(item)))
    items.sort(key=_start_rank)  # stable: within a rank, the collection order stays


def _start_rank(item: pytest.Item) -> int:
    """Longest first: the lab units, then modules that use a lab, then the rest (seconds each)."""
    units = list(LAB_UNITS.values())
    unit = work_unit(item)
    if unit in units:
        return units.index(unit)
    uses_lab = any(item.get_closest_marker(m) is not None for m in LAB_MARKERS)
    return len(units) + (0 if uses_lab else 1)
