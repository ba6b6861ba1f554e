"""scripts/test's cold run: with kubelab binaries missing, the build runs in the background while the
static checks, scripts/test-lowest and the tests that need none of its binaries run (pytest's first part,
``--kube-tests=deselect``); the tests marked kube (``--kube-tests=only``) start after that while the build
goes on, each lab waiting for its own binaries; the run waits for the build at the end. A warm run (every
binary built) runs the static checks, go vet + go test and scripts/test-lowest in the background beside its
one pytest run. The order is read from the script; its exit-status rule, its end of the build (failed or
not), the checks beside pytest and the stopping of either are run in bash, with fakes for what they call."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from hostlab.proc import alive, wait_until
from kubelab.build import GOFLAGS

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "test"
START = "setsid sh -c 'kubelab build --all"


def _text() -> str:
    return SCRIPT.read_text()


def _function(name: str) -> str:
    """The bash function ``name`` as scripts/test defines it (from ``name() {`` to its closing ``}``)."""
    found = re.search(rf"^{name}\(\) {{.*?^}}$", _text(), re.M | re.S)
    assert found is not None, f"scripts/test defines no function {name}"
    return found.group(0)


def _at(needle: str, after: int = 0) -> int:
    at = _text().find(needle, after)
    assert at >= 0, f"scripts/test no longer has {needle!r} (after offset {after})"
    return at


def test_the_build_starts_in_the_background_before_the_checks_and_the_kube_tests_run_beside_it() -> None:
    started = _at(START)
    assert started < _at('step "ruff"'), "the build starts before the static checks, beside them"
    cold = _at('if "$cold"; then', started)
    lowest = _at("scripts/test-lowest", cold)
    first = _at("run_pytest --kube-tests=deselect", cold)
    failed_early = _at("if build_failed; then", first)
    second = _at("run_pytest --kube-tests=only", first)
    waited = _at("build_ended", second)
    vet = _at("go_checks", waited)
    warm = _at("else", vet)
    assert cold < lowest < first < failed_early < second < waited < vet < warm, (
        "cold: beside the build, the kube part too, then the build's end"
    )
    assert _at("static_checks", cold) < lowest, "cold: the static checks beside the build, first"
    beside = _at("checks_start", warm)
    assert beside < _at('run_pytest "$@"', warm) < _at("checks_ended", beside), (
        "warm: the checks start in the background, then one pytest run of everything, then their end"
    )
    assert _at('not_built="$(kubelab build --all --not-built)"') < started, (
        "cold only when a binary is missing"
    )


@pytest.mark.parametrize(
    ("parts", "whole"),
    [
        (("0", "0"), "0"),
        (("0", "5"), "0"),  # one part kept no test (scripts/test -k ...): the whole run did
        (("5", "0"), "0"),
        (("5", "5"), "5"),  # no test at all: scripts/test makes it a failure
        (("1", "0"), "1"),
        (("5", "1"), "1"),
        (("0", "2"), "2"),
        (("5",), "5"),
        (("0",), "0"),
    ],
)
def test_the_whole_exit_status_fails_on_any_failed_part_and_on_no_test_in_either(
    parts: tuple[str, ...], whole: str
) -> None:
    out = subprocess.run(
        ["bash", "-c", f'{_function("whole_rc")}\nwhole_rc "$@"', "bash", *parts],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    assert out.stdout.strip() == whole


@pytest.mark.parametrize("part", ["build", "checks"])
def test_stopping_a_background_part_kills_its_whole_process_group(tmp_path: Path, part: str) -> None:
    """As scripts/test starts them (setsid, in the background) and stops them on exit (a failed step,
    Ctrl-C): the build's children (go build and its compilers) or the checks' (mypy, test-lowest's pytest)
    go too, not only the process the script started."""
    pids = tmp_path / "pids"
    script = f"""
{_function(f"stop_{part}")}
{part}_log={tmp_path / "log"}
touch "${part}_log"
setsid bash -c 'sleep 300 & echo $$ $! >{pids}; wait' >/dev/null 2>&1 &
{part}_pid=$!
for _ in $(seq 100); do [ -s {pids} ] && break; sleep 0.1; done
stop_{part}
echo stopped
"""
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "stopped", out.stderr
    leader, child = (int(p) for p in pids.read_text().split())
    assert wait_until(lambda: not alive(leader) and not alive(child), 10, 0.05), f"the {part} group lives on"
    assert not (tmp_path / "log").exists(), f"the {part} log file is removed"


def _start_lines() -> str:
    """The lines of scripts/test that start the background build (from ``setsid`` to ``build_pid=$!``)."""
    text = _text()
    begin = text.rfind("\n", 0, _at(START)) + 1
    return text[begin : _at("build_pid=$!", begin) + len("build_pid=$!")]


def _run_build(tmp_path: Path, build_exit: int) -> subprocess.CompletedProcess[str]:
    """scripts/test's start of the build and its end, the build a fake kubelab exiting ``build_exit``;
    the script prints whether build_failed saw the end before build_ended waited for it."""
    fake = tmp_path / "bin" / "kubelab"
    fake.parent.mkdir()
    fake.write_text(f'#!/bin/sh\necho "fake kubelab $*: exit {build_exit}" >&2\nexit {build_exit}\n')
    fake.chmod(0o755)
    script = f"""
set -euo pipefail
export PATH={fake.parent}:$PATH
{_function("stop_build")}
{_function("build_failed")}
{_function("build_ended")}
trap stop_build EXIT
build_log={tmp_path / "build.log"}
build_status="$build_log.status"
{_start_lines()}
for _ in $(seq 300); do [ -s "$build_status" ] && break; sleep 0.1; done
if build_failed; then echo "failed early"; fi
build_ended
echo "after the build"
"""
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60, check=False)


def test_a_failed_build_fails_the_run_with_its_exit_status_and_log(tmp_path: Path) -> None:
    out = _run_build(tmp_path, 3)
    assert out.returncode == 1
    assert out.stdout.split("\n")[0] == "failed early"  # seen before the kube part would start
    assert "after the build" not in out.stdout
    assert "fake kubelab build --all: exit 3" in out.stderr  # the build's log, printed
    assert "kubelab build --all failed (exit 3)" in out.stderr
    assert not (tmp_path / "build.log").exists(), "the build's log file is removed"


def test_a_build_that_succeeded_prints_its_log_and_the_run_goes_on(tmp_path: Path) -> None:
    out = _run_build(tmp_path, 0)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "after the build"
    assert "fake kubelab build --all: exit 0" in out.stderr


def test_go_vet_and_go_test_use_kubelabs_own_go_flags() -> None:
    """go vet + go test of our mcm module run with the flags of kubelab's builds, so a cold run's go test
    finds the packages the build compiled (other flags are other cache keys: every package compiled again,
    about 2.5 minutes of CPU at the end of a fresh run)."""
    found = re.search(r'local goflags="([^"]*)"', _function("go_checks"))
    assert found is not None, "go_checks sets no goflags"
    assert found.group(1) == GOFLAGS
    assert _function("go_checks").count('GOFLAGS="$goflags"') == 2, "both go vet and go test"


def _run_checks(tmp_path: Path, failing: str) -> subprocess.CompletedProcess[str]:
    """scripts/test's checks beside pytest, started and ended, in a checkout of fakes: static_checks and
    go_checks say their name, scripts/test-lowest too; the one named ``failing`` exits 3 instead."""
    lowest = tmp_path / "scripts" / "test-lowest"
    lowest.parent.mkdir()
    lowest.write_text(f'#!/bin/sh\necho test-lowest\n[ "{failing}" != test-lowest ] || exit 3\n')
    lowest.chmod(0o755)
    fakes = "\n".join(
        f'{name}() {{ echo {name}; [ "{failing}" != {name} ] || return 3; }}'
        for name in ("static_checks", "go_checks")
    )
    script = f"""
set -euo pipefail
cd {tmp_path}
export TMPDIR={tmp_path}
step() {{ echo "== $*"; }}
go=go
have_go=true
{fakes}
{_function("stop_checks")}
{_function("checks_start")}
{_function("checks_ended")}
trap stop_checks EXIT
checks_start
echo "pytest runs meanwhile"
checks_ended
echo "checks_rc=$checks_rc"
"""
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60, check=False)


def test_the_checks_beside_pytest_run_in_order_and_print_their_output_after_it(tmp_path: Path) -> None:
    out = _run_checks(tmp_path, failing="none")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == ["pytest runs meanwhile", "checks_rc=0"]
    assert (
        "static_checks\ngo_checks\n== lowest dependency versions (scripts/test-lowest)\ntest-lowest"
        in out.stderr
    )
    assert not list(tmp_path.glob("test-checks.*")) and "a check beside pytest failed" not in out.stderr


@pytest.mark.parametrize(("failing", "ran"), [("static_checks", 1), ("go_checks", 2), ("test-lowest", 3)])
def test_a_failed_check_beside_pytest_stops_the_checks_and_is_said(
    tmp_path: Path, failing: str, ran: int
) -> None:
    out = _run_checks(tmp_path, failing=failing)
    assert out.returncode == 0, "the script goes on to its end; the run's status takes checks_rc"
    assert out.stdout.split("\n")[1] == "checks_rc=3"
    said = [line for line in out.stderr.split("\n") if line in ("static_checks", "go_checks", "test-lowest")]
    assert len(said) == ran, f"set -e stops at the failed check: {said}"
    assert "a check beside pytest failed (exit 3" in out.stderr


def test_a_failed_ruff_check_stops_the_static_checks(tmp_path: Path) -> None:
    """Each check is a command of its own: in ``ruff check . && ruff format --check .`` a failed
    ``ruff check`` would not stop a ``set -e`` script (a failure left of ``&&`` never does), and a run
    whose other steps passed would have passed with it."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in (("ruff", '[ "$1" != check ] || exit 1'), ("mypy", ""), ("lint-imports", "")):
        (bin_dir / name).write_text(f'#!/bin/sh\necho "{name} $*"\n{body}\n')
        (bin_dir / name).chmod(0o755)
    script = f"""
set -euo pipefail
cd {tmp_path}
export PATH={bin_dir}:$PATH
step() {{ :; }}
{_function("static_checks")}
static_checks
echo "went on"
"""
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30, check=False)
    assert out.returncode == 1
    assert out.stdout.split("\n") == ["ruff check .", ""], "nothing after the failed ruff check"
