"""kubelab's build lock, taken per binary (labs/kubelab/build.py): a process waiting for one binary gets it
as soon as another process has built it, not after that one's whole batch, and never builds it again; and
the order of ``kubelab build --all``. Lab-free: a fake ``go`` whose builds end when the test opens a gate."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from hostlab.proc import wait_until
from kubelab import build
from kubelab.config import Config

# A stand-in for the go command, not Go: `env GOVERSION` answers, `build -o OUT PKG` logs PKG's last part
# and writes OUT once the test has created the gate file of that name.
FAKE_GO = """#!/bin/sh
if [ "$1" = env ]; then echo go0.fake; exit 0; fi
out=""; pkg=""
while [ $# -gt 0 ]; do
  case "$1" in
    -o) out="$2"; shift 2 ;;
    -ldflags|-tags) shift 2 ;;
    build) shift ;;
    *) pkg="$1"; shift ;;
  esac
done
name="${pkg##*/}"
echo "$name" >>"$FAKE_GO_LOG"
while [ ! -e "$FAKE_GO_GATES/$name" ]; do sleep 0.02; done
echo built >"$out"
"""
WAIT = 30.0


@pytest.fixture
def fake_go(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Config, Path, Path]]:
    """A config building with the fake go; the gates directory and the log of the builds it started.
    Every gate opens at the end, so no fake build outlives a failed test."""
    go = tmp_path / "go"
    go.write_text(FAKE_GO)
    go.chmod(0o755)
    gates, log = tmp_path / "gates", tmp_path / "builds.log"
    gates.mkdir()
    monkeypatch.setenv("FAKE_GO_GATES", str(gates))
    monkeypatch.setenv("FAKE_GO_LOG", str(log))
    for name in ("one", "two"):
        monkeypatch.setitem(build.BINARIES, name, build.Binary(name, "etcd", f"fake.invalid/{name}"))
    cfg = Config(cache_dir=tmp_path / "cache", run_dir=tmp_path / "run", go=str(go))
    yield cfg, gates, log
    for name in ("one", "two"):
        (gates / name).touch()


def _started(log: Path) -> list[str]:
    return log.read_text().split() if log.exists() else []


def test_a_waiter_gets_its_binary_when_built_not_after_the_other_process_batch(
    fake_go: tuple[Config, Path, Path],
) -> None:
    cfg, gates, log = fake_go
    results: dict[str, dict[str, Path]] = {}
    lines: list[str] = []

    def run(key: str, names: list[str]) -> threading.Thread:
        # a thread opens the lock file itself: flock(2) keeps it from the other thread as from a process
        thread = threading.Thread(
            target=lambda: results.setdefault(key, build.ensure_built(names, cfg, lines.append)),
            daemon=True,
        )
        thread.start()
        return thread

    batch = run("batch", ["one", "two"])
    assert wait_until(lambda: _started(log) == ["one"], WAIT)  # the batch holds the lock for one
    waiter = run("waiter", ["one"])
    assert wait_until(lambda: any(line.startswith("kubelab build: waiting for one") for line in lines), WAIT)
    (gates / "one").touch()
    # the batch goes on with two (its go build still waits for its gate) while the waiter has one
    waiter.join(WAIT)
    assert not waiter.is_alive(), "the waiter waited for the whole batch"
    assert _started(log) == ["one", "two"] and batch.is_alive()
    assert results["waiter"]["one"].read_text() == "built\n"
    (gates / "two").touch()
    batch.join(WAIT)
    assert not batch.is_alive()
    assert results["batch"]["one"] == results["waiter"]["one"]
    assert _started(log) == ["one", "two"]  # one built once, by the batch, never by the waiter


def test_a_binary_built_by_another_process_is_not_built_again(fake_go: tuple[Config, Path, Path]) -> None:
    cfg, gates, log = fake_go
    (gates / "one").touch()
    first = build.ensure_built(["one"], cfg, progress=lambda _: None)
    assert _started(log) == ["one"]
    assert build.ensure_built(["one"], cfg, progress=pytest.fail) == first  # no build, no wait line
    assert _started(log) == ["one"]


def test_kubelab_build_all_builds_every_binary_once_in_the_build_order() -> None:
    assert sorted(build.BUILD_ORDER) == sorted(build.BINARIES)
    assert len(build.BUILD_ORDER) == len(set(build.BUILD_ORDER))
    order = build.BUILD_ORDER.index
    # what every kube test needs first, what only a few short tests use last
    assert max(order(name) for name in build.CORE_BINARIES) < min(
        order(name) for name in build.BINARIES if name not in build.CORE_BINARIES and name != "kube-scheduler"
    )
    assert build.BUILD_ORDER[-2:] == ("clusterctl", "promtool")
    # the CAPA module is the first CAPI unit handed out: its manager before the nodes' set, which only the
    # node unit and the CAPI modules on real nodes wait for
    assert order("capa-lab-manager") < min(order(name) for name in build.NODE_BINARIES)
    assert order("capa-lab-manager") > max(order(n) for n in ("capi-core", "capi-kcp", "capi-cabpk", "capd"))
