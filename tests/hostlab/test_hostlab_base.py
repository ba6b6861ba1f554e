"""The cached Debian base: where it lives, when it counts as built, and precise errors (no build here)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from hostlab.base import MARKER, base_ready, ensure_base
from hostlab.config import BASE_FORMAT, Config
from hostlab.errors import LabError
from hostlab.proc import file_lock


@pytest.fixture
def cfg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Config:
    monkeypatch.setenv("HOSTLAB_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("HOSTLAB_RUN_DIR", str(tmp_path / "run"))
    monkeypatch.delenv("HOSTLAB_BASE_DIR", raising=False)
    return Config.from_env()


def test_base_lives_outside_the_clone_named_by_suite_and_format(cfg: Config, tmp_path: Path) -> None:
    assert cfg.base_dir == tmp_path / "cache" / f"base-bookworm-v{BASE_FORMAT}"
    assert cfg.apt_cache_dir == tmp_path / "cache" / "aptcache"
    assert cfg.lab_dir("x") == tmp_path / "run" / "labs" / "x"


def test_a_base_counts_as_built_only_with_its_marker(cfg: Config) -> None:
    cfg.base_dir.mkdir(parents=True)
    assert not base_ready(cfg.base_dir)  # e.g. an interrupted build renamed by hand
    (cfg.base_dir / MARKER).write_text(json.dumps({"format": BASE_FORMAT}))
    assert base_ready(cfg.base_dir)
    assert ensure_base(cfg, log=lambda _: None) == cfg.base_dir  # nothing to build


def test_an_override_without_marker_is_refused(cfg: Config, tmp_path: Path) -> None:
    override = dataclasses.replace(cfg, base_override=tmp_path / "somewhere")
    (tmp_path / "somewhere").mkdir()
    with pytest.raises(LabError, match=r"somewhere has no \.hostlab-base\.json: not a complete hostlab base"):
        ensure_base(override, log=lambda _: None)


def test_an_unknown_bootstrap_tool_is_refused(cfg: Config) -> None:
    with pytest.raises(LabError, match="HOSTLAB_BOOTSTRAP must be debootstrap or mmdebstrap, not 'docker'"):
        ensure_base(dataclasses.replace(cfg, bootstrap="docker"), log=lambda _: None)


def test_a_busy_build_lock_is_reported_once_then_times_out_precisely(tmp_path: Path) -> None:
    lock = tmp_path / "base.lock"
    waits: list[str] = []
    # the second holder has another open file description, as another process would: it must wait
    with (
        file_lock(lock, what="base build lock"),
        pytest.raises(LabError, match=r"could not take the base build lock .*base\.lock within 0\.3s"),
        file_lock(lock, timeout=0.3, what="base build lock", on_wait=lambda: waits.append("waiting")),
    ):
        pass
    assert waits == ["waiting"]
    with file_lock(lock, timeout=0.3, on_wait=lambda: waits.append("again")):
        pass  # free again: taken at once, no waiting reported
    assert waits == ["waiting"]
