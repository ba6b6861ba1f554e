"""A component a test adds to a lab and removes again leaves the lab whole: a shared lab with a stopped
component still recorded is started again by the next worker that attaches to it
(``kubelab.pytest_plugin._shared``), under the feet of the other workers' tests."""

from __future__ import annotations

import os
from pathlib import Path

from hostlab.proc import alive
from kubelab import state
from kubelab.config import Config
from kubelab.lab import Lab
from kubelab.state import LabState


def test_a_removed_component_is_stopped_and_no_longer_recorded(tmp_path: Path) -> None:
    lab = Lab("components", Config(cache_dir=tmp_path / "cache", run_dir=tmp_path / "run", go="go"))
    lab.dir.mkdir(parents=True)
    state.save(lab.dir, LabState(lab.name, owner_pid=os.getpid()))
    kept = lab.start_component("kept", ["sleep", "300"])
    added = lab.start_component("added", ["sleep", "301"])
    try:
        lab.remove_component("added")
        assert not alive(added.pid)
        assert [c.name for c in lab.state().components] == ["kept"]
        assert all(c.running() for c in lab.state().components)  # what _shared asks of a shared lab
        lab.stop_component("kept")  # stopped, still recorded: a broken lab to _shared
        assert [c.running() for c in lab.state().components] == [False]
    finally:
        lab.stop_component("kept")
        lab.stop_component("added")
    assert not alive(kept.pid)
