"""kubelab's own lifecycle: a separate lab comes up and goes down leaving nothing behind; builds are
cached by content and a failing build names its step and log.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import socket
from pathlib import Path

import pytest
from hostlab.errors import LabError
from hostlab.proc import alive
from kubelab import build, cli
from kubelab.config import Config
from kubelab.lab import Lab
from kubelab.pytest_plugin import unavailable

pytestmark = pytest.mark.kube


def _port_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def test_down_leaves_no_process_port_or_file(kubelab: Lab) -> None:
    # kubelab (the session lab) proves the binaries are built; this lab is a second, private one
    lab = Lab(f"clean-{os.getpid()}", kubelab.cfg)
    try:
        lab.up(owner_pid=os.getpid(), progress=lambda _: None)
        state = lab.state()
        pids = [c.pid for c in state.components]
        ports = list(state.ports.values())
        assert len(pids) == 4 and all(alive(pid) for pid in pids)
        assert not any(_port_free(p) for p in (state.ports["etcd"], state.ports["apiserver"]))
    finally:
        lab.down()
    assert not any(alive(pid) for pid in pids)
    assert all(_port_free(p) for p in ports)
    assert not lab.dir.exists()
    assert (kubelab.cfg.cache_dir / "lab-logs" / lab.name / "kube-apiserver.log").is_file()


def test_built_binaries_are_reused_and_keyed_by_content(
    kubelab: Lab, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = kubelab.cfg
    first = build.ensure_built(["kubectl"], cfg, progress=pytest.fail)  # already built: no build line
    assert first["kubectl"].is_file()
    go_version = build._go_version(cfg)
    before = build.module_hash("etcd", go_version)
    copy = tmp_path / "go"
    shutil.copytree(build.module_dir("etcd"), copy / "etcd")
    monkeypatch.setattr(build, "GO_MODULES_DIR", copy)
    assert build.module_hash("etcd", go_version) == before
    (copy / "etcd" / "go.sum").write_text((copy / "etcd" / "go.sum").read_text() + "\n")
    assert build.module_hash("etcd", go_version) != before


def test_a_failing_build_names_the_binary_and_its_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if shutil.which("go") is None:
        unavailable("no Go toolchain to run a build")
    broken = build.Binary("broken", "etcd", "inplace-extension.invalid/no/such/package")
    monkeypatch.setitem(build.BINARIES, "broken", broken)
    cfg = Config(cache_dir=tmp_path / "cache", run_dir=tmp_path / "run", go="go")
    lines: list[str] = []
    with pytest.raises(LabError) as raised:
        build.ensure_built(["broken"], cfg, progress=lines.append)
    message = str(raised.value)
    log = cfg.cache_dir / "logs" / "broken.log"
    assert "go build of broken failed" in message and str(log) in message
    assert "no/such/package" in log.read_text()
    assert lines == ["kubelab build: broken (inplace-extension.invalid/no/such/package) ..."]
    assert not list((cfg.cache_dir / "bin").rglob("broken"))


def test_build_tags_are_in_the_recipe_hash_and_on_the_build_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if shutil.which("go") is None:
        unavailable("no Go toolchain to run a build")
    plain = build.Binary("broken", "etcd", "inplace-extension.invalid/no/such/package")
    monkeypatch.setitem(build.BINARIES, "broken", plain)
    without_tags = build.module_hash("etcd", "go0")
    monkeypatch.setitem(build.BINARIES, "broken", dataclasses.replace(plain, tags=("remove_all_sd",)))
    assert build.module_hash("etcd", "go0") != without_tags  # a new tag is a new recipe: rebuilt
    cfg = Config(cache_dir=tmp_path / "cache", run_dir=tmp_path / "run", go="go")
    with pytest.raises(LabError, match="go build of broken failed"):
        build.ensure_built(["broken"], cfg, progress=lambda _: None)
    command = (cfg.cache_dir / "logs" / "broken.log").read_text().splitlines()[0]
    assert " -tags remove_all_sd -o " in command


def test_not_built_names_what_a_build_would_build_and_builds_nothing(
    kubelab: Lab, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # scripts/test asks this to choose between the warm run (nothing to build) and the build beside the tests
    assert build.not_built(["kubectl", "etcd"], kubelab.cfg) == []  # the session lab's, built
    empty = Config(cache_dir=tmp_path / "cache", run_dir=tmp_path / "run", go=kubelab.cfg.go)
    assert build.not_built(["kubectl", "etcd", "kubectl"], empty) == ["kubectl", "etcd"]
    assert not empty.cache_dir.exists()
    with pytest.raises(LabError, match="unknown binaries"):
        build.not_built(["no-such-binary"], empty)
    monkeypatch.setenv("KUBELAB_CACHE_DIR", str(empty.cache_dir))
    assert cli.main(["build", "--all", "--not-built"]) == 0
    assert capsys.readouterr().out.split() == list(build.BUILD_ORDER)  # --all: every binary, in build order
    assert not empty.cache_dir.exists()
