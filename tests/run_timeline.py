"""Where a parallel test run's time goes: each test's span (from its setup's start to its teardown's end)
on its worker, and the summary ``scripts/test`` prints after pytest.

A pytest plugin (tests/conftest.py loads it): with ``INPLACE_TEST_TIMELINE`` naming a file, every
process of the run (each xdist worker, or the one process of a serial run) appends one JSON line per
test: worker, work unit (its ``xdist_group``), test id, start and end (wall-clock seconds). One
``write`` of one line per test on a file opened for appending, so the workers' lines never mix.

``python tests/run_timeline.py FILE`` prints the summary: the run's span; per worker, how long it was
busy and its units in the order it ran them (when each began, how long it took); the longest units.
A unit longer than the others on a worker that ends last is what holds the run: the summary is the
measure ``docs/development.md`` (CI time) speaks from.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

ENV = "INPLACE_TEST_TIMELINE"
LONGEST = 12  # how many of the longest units the summary lists


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    path = os.environ.get(ENV)
    if not path:
        return (yield)
    start = time.time()
    try:
        return (yield)
    finally:
        group = item.get_closest_marker("xdist_group")
        unit = str(group.args[0]) if group is not None and group.args else item.nodeid.split("::")[0]
        line = {
            "worker": os.environ.get("PYTEST_XDIST_WORKER", "main"),
            "unit": unit,
            "test": item.nodeid,
            "start": start,
            "end": time.time(),
        }
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (json.dumps(line) + "\n").encode())
        finally:
            os.close(fd)


@dataclass(frozen=True)
class Span:
    worker: str
    unit: str
    start: float
    end: float
    tests: int


def unit_spans(lines: Sequence[dict[str, object]]) -> list[Span]:
    """Each unit's span on its worker (a unit runs on one worker): first start to last end, in order."""
    spans: dict[tuple[str, str], list[float]] = {}
    for line in lines:
        key = (str(line["worker"]), str(line["unit"]))
        start, end = float(str(line["start"])), float(str(line["end"]))
        got = spans.setdefault(key, [start, end, 0])
        got[0], got[1], got[2] = min(got[0], start), max(got[1], end), got[2] + 1
    return sorted(
        (Span(worker, unit, s, e, int(n)) for (worker, unit), (s, e, n) in spans.items()),
        key=lambda span: (span.worker, span.start),
    )


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:5.1f} min"


def summary(lines: Sequence[dict[str, object]]) -> str:
    if not lines:
        return "test timeline: no test recorded"
    spans = unit_spans(lines)
    first = min(span.start for span in spans)
    last = max(span.end for span in spans)
    whole = _minutes(last - first)
    out = [f"test timeline: {len(lines)} tests, {len(spans)} units, {whole} from the first start"]
    for worker in sorted({span.worker for span in spans}):
        own = [span for span in spans if span.worker == worker]
        busy = sum(
            float(str(line["end"])) - float(str(line["start"])) for line in lines if line["worker"] == worker
        )
        ends = max(span.end for span in own) - first
        out.append(f"  {worker}: busy {_minutes(busy)}, ends at {_minutes(ends)}, {len(own)} units")
        for span in own:
            if span.end - span.start >= 60:  # the short units only as a count, above
                out.append(
                    f"    {_minutes(span.start - first)} +{_minutes(span.end - span.start)}  {span.unit}"
                    f" ({span.tests} tests)"
                )
    out.append(f"  the {LONGEST} longest units:")
    for span in sorted(spans, key=lambda span: span.start - span.end)[:LONGEST]:
        out.append(f"    {_minutes(span.end - span.start)}  {span.unit} on {span.worker}")
    return "\n".join(out)


def read(path: Path) -> list[dict[str, object]]:
    lines = []
    for text in path.read_text(encoding="utf-8").splitlines():
        try:
            lines.append(json.loads(text))
        except ValueError:
            continue  # a line cut by a killed worker: the others still tell
    return lines


if __name__ == "__main__":
    print(summary(read(Path(sys.argv[1]))))
