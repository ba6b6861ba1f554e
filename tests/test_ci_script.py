"""scripts/test's cold run: with kubelab binaries missing, the build runs in the background while the
static checks, scripts/test-lowest and the tests that need none of its binaries run (pytest's first part,
``--kube-tests=deselect``); the tests marked kube run after it (``--kube-tests=only``). The order is read
from the script; its exit-status rule and the stopping of the build are run in bash."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from hostlab.proc import alive, wait_until

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "test"


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


def test_the_build_starts_in_the_background_before_the_checks_and_the_kube_tests_wait_for_it() -> None:
    started = _at('setsid kubelab build --all >"$build_log" 2>&1 &')
    assert started < _at('step "ruff"'), "the build starts before the static checks, beside them"
    cold = _at('if "$cold"; then', started)
    lowest = _at("scripts/test-lowest", cold)
    first = _at("run_pytest --kube-tests=deselect", cold)
    waited = _at('wait "$build_pid"', cold)
    vet = _at("go_checks", waited)
    second = _at("run_pytest --kube-tests=only", waited)
    warm = _at("else", second)
    assert cold < lowest < first < waited < vet < second < warm, "cold: beside the build, then the kube part"
    assert _at('run_pytest "$@"', warm) > warm, "warm: one pytest run of everything, as before"
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


def test_stopping_the_build_kills_its_whole_process_group(tmp_path: Path) -> None:
    """As scripts/test starts it (setsid, in the background) and stops it on exit: the build's children,
    go build and its compilers, go too, not only kubelab's process."""
    pids = tmp_path / "pids"
    script = f"""
{_function("stop_build")}
build_log={tmp_path / "log"}
touch "$build_log"
setsid bash -c 'sleep 300 & echo $$ $! >{pids}; wait' >/dev/null 2>&1 &
build_pid=$!
for _ in $(seq 100); do [ -s {pids} ] && break; sleep 0.1; done
stop_build
echo stopped
"""
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "stopped", out.stderr
    leader, child = (int(p) for p in pids.read_text().split())
    assert wait_until(lambda: not alive(leader) and not alive(child), 10, 0.05), "the build's group lives on"
    assert not (tmp_path / "log").exists(), "the build's log file is removed"
