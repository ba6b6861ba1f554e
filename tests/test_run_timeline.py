"""The run timeline (tests/run_timeline.py): what each worker of a parallel run records per test, and the
summary scripts/test prints from it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from run_timeline import read, summary, unit_spans

TESTS_DIR = Path(__file__).resolve().parent


def _line(worker: str, unit: str, start: float, end: float) -> dict[str, object]:
    return {"worker": worker, "unit": unit, "test": f"{unit}::t{start}", "start": start, "end": end}


def test_each_units_span_is_its_first_start_to_its_last_end_on_its_worker() -> None:
    lines = [
        _line("gw0", "node-lab", 1000, 1300),
        _line("gw0", "node-lab", 1300, 2200),
        _line("gw1", "mcm-lab", 1000, 1900),
        _line("gw0", "tests/a.py", 2200, 2210),
        _line("gw1", "capi-lab:tests/capi_lab/test_x.py", 1900, 4600),
    ]
    spans = {(s.worker, s.unit): (s.start, s.end, s.tests) for s in unit_spans(lines)}
    assert spans == {
        ("gw0", "node-lab"): (1000, 2200, 2),
        ("gw0", "tests/a.py"): (2200, 2210, 1),
        ("gw1", "mcm-lab"): (1000, 1900, 1),
        ("gw1", "capi-lab:tests/capi_lab/test_x.py"): (1900, 4600, 1),
    }
    text = summary(lines)
    assert "5 tests, 4 units,  60.0 min from the first start" in text
    assert "gw0: busy  20.2 min, ends at  20.2 min, 2 units" in text
    assert "gw1: busy  60.0 min, ends at  60.0 min, 2 units" in text
    # the units of a minute or more in the order the worker ran them, from the run's first start
    assert "  0.0 min + 15.0 min  mcm-lab (1 tests)\n     15.0 min + 45.0 min  capi-lab" in text
    longest = text.split("longest units:\n")[1].splitlines()
    assert [row.split()[2] for row in longest] == [
        "capi-lab:tests/capi_lab/test_x.py",
        "node-lab",
        "mcm-lab",
        "tests/a.py",
    ]


def test_every_worker_of_a_parallel_run_records_each_of_its_tests_once(tmp_path: Path) -> None:
    suite, timeline = tmp_path / "suite", tmp_path / "timeline.jsonl"
    suite.mkdir()
    (suite / "conftest.py").write_text('pytest_plugins = ["run_timeline"]\n')
    for name in ("a", "b", "c"):
        (suite / f"test_{name}.py").write_text(
            "import pytest\n\n"
            f'@pytest.mark.xdist_group("unit-{name}")\n'
            "@pytest.mark.parametrize('n', range(3))\n"
            "def test_n(n):\n    assert n >= 0\n"
        )
    pytest = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    result = subprocess.run(
        [*pytest, "-p", "xdist", "-n", "2", "--dist", "loadgroup"],
        cwd=suite,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(TESTS_DIR), "INPLACE_TEST_TIMELINE": str(timeline)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    lines = read(timeline)
    assert sorted(str(line["test"]).split("@")[0] for line in lines) == sorted(
        f"test_{name}.py::test_n[{n}]" for name in "abc" for n in range(3)
    )
    assert {line["worker"] for line in lines} <= {"gw0", "gw1"}
    assert {line["unit"] for line in lines} == {"unit-a", "unit-b", "unit-c"}
    for line in lines:
        assert float(str(line["start"])) <= float(str(line["end"])), json.dumps(line)
    # a unit stays on one worker
    assert len({(line["unit"], line["worker"]) for line in lines}) == 3
