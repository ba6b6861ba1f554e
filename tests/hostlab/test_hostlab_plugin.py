"""The pytest plugin's contract when no lab can start: skip with the reason, but error under CI=true.

Runs a tiny test session in a subprocess whose PATH lacks the lab's tools (or that is not root), so the
lab genuinely cannot start there.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

TESTS = """
import pytest

@pytest.mark.lab
def test_marked(lab):
    assert lab is None, "must not run: the lab cannot start"

def test_unmarked(lab_hosts):
    pass
"""


def _session(tmp_path: Path, *, ci: bool) -> subprocess.CompletedProcess[str]:
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    lab: needs the host lab\n")
    (tmp_path / "test_sample.py").write_text(TESTS)
    (tmp_path / "bin").mkdir(exist_ok=True)
    env = {"PATH": str(tmp_path / "bin"), "HOME": str(tmp_path), "HOSTLAB_RUN_DIR": str(tmp_path / "run")}
    if ci:
        env["CI"] = "true"
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "hostlab.pytest_plugin",
            "-q",
            "-rA",
            "-p",
            "no:cacheprovider",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _reason() -> str:
    return "needs root" if os.geteuid() != 0 else "missing command ip (apt-get install iproute2)"


def test_outside_ci_lab_tests_skip_with_the_reason(tmp_path: Path) -> None:
    result = _session(tmp_path, ci=False)
    out = result.stdout
    assert "SKIPPED" in out
    assert f"hostlab: {_reason()}" in out
    assert "must not run" not in out
    # a test using the lab fixtures without the marker is an error, not a silent skip
    assert "test_unmarked" in out
    assert "uses lab, lab_hosts but is not marked @pytest.mark.lab" in out
    assert result.returncode == 1


def test_under_ci_a_lab_that_cannot_start_is_an_error(tmp_path: Path) -> None:
    result = _session(tmp_path, ci=True)
    out = result.stdout
    assert "ERROR test_sample.py::test_marked" in out
    assert f"required here (CI=true) but cannot run: {_reason()}" in out
    assert "SKIPPED" not in out
    assert result.returncode == 1
