"""The ``inplace_health_commands`` module (playbooks/library), run locally as Ansible runs it (no lab).

Judged by its JSON result: the stable messages, the retries until the checks pass or time runs out, a
try's own timeout killing what the command started, and no command output anywhere in the result.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from .test_modules import PLAYBOOKS, run

MODULE = PLAYBOOKS / "library" / "inplace_health_commands.py"


def check(name: str, *argv: str, timeout: float = 5) -> dict[str, Any]:
    return {"name": name, "argv": list(argv), "timeout_seconds": timeout}


def test_passing_checks_and_the_first_failing_one_by_its_exit_status(tmp_path: Path) -> None:
    ok = check("ok", "test", "-d", str(tmp_path))
    out = run(MODULE, tmp_path, {"checks": [ok], "timeout_seconds": 5})
    assert (out.get("failed"), out["msg"], out["tries"]) == (None, "health gate: the command checks pass", 1)

    secret = tmp_path / "secret"
    secret.write_text("s3cret-value\n")
    noisy = check("noisy", "sh", "-c", f"cat {secret}; cat {secret} >&2; exit 3")
    later = check("later", "false")
    out = run(MODULE, tmp_path, {"checks": [ok, noisy, later], "timeout_seconds": 0.5, "interval_seconds": 1})
    assert (out["failed"], out["msg"], out["tries"]) == (True, "health gate: check noisy: exit status 3", 1)
    assert "s3cret" not in json.dumps(out)  # the output is never kept

    missing = check("missing", "/nonexistent/program")
    out = run(MODULE, tmp_path, {"checks": [missing], "timeout_seconds": 0.5})
    assert out["msg"] == "health gate: check missing: cannot start (FileNotFoundError)"


def test_checks_are_tried_again_until_they_pass(tmp_path: Path) -> None:
    counter = tmp_path / "tries"
    # passes on its third try: the module must come back to it, not give up at the first failure
    third = check(
        "third",
        "sh",
        "-c",
        f'n=$(cat {counter} 2>/dev/null || echo 0); echo $((n+1)) > {counter}; [ "$n" -ge 2 ]',
    )
    out = run(MODULE, tmp_path, {"checks": [third], "timeout_seconds": 30, "interval_seconds": 0.1})
    assert (out.get("failed"), out["tries"], counter.read_text().strip()) == (None, 3, "3")


def test_a_try_that_outlives_its_timeout_is_killed_with_what_it_started(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    # the shell starts a grandchild that would hold on: the whole process group must go
    slow = check("slow", "sh", "-c", f"sleep 60 & echo $! > {pid_file}; wait", timeout=0.5)
    started = time.monotonic()
    out = run(MODULE, tmp_path, {"checks": [slow], "timeout_seconds": 0.1})
    assert time.monotonic() - started < 30
    assert (out["failed"], out["msg"]) == (True, "health gate: check slow: timed out")
    grandchild = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while _alive(grandchild):  # killed, then reaped by init: poll until it is gone
        assert time.monotonic() < deadline, "the timed-out check's child still runs"
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    status = Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0]
    return status != "Z"
