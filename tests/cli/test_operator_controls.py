"""The operator's controls through the real service: ``serve`` with a capabilities file, over a socket."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import httpx

from .conftest import FIXTURES, Server, clean_env, run_cli

StartServer = Callable[..., Server]
UPDATE_MACHINE = "/hooks.runtime.cluster.x-k8s.io/v1alpha1/updatemachine/update-machine"
NEW_YEAR = "maintenance_windows:\n  - {name: new-year, cron: '0 0 1 1 *', duration: 1m}\n"


def test_outside_its_window_update_machine_waits_and_starts_nothing(
    start_server: StartServer, tmp_path: Path
) -> None:
    caps = tmp_path / "caps.yaml"
    caps.write_text(NEW_YEAR)
    runs = tmp_path / "runs"
    server = start_server(
        "--listen", "127.0.0.1:0", "--plain-http", "--capabilities-file", str(caps), "--runs-dir", str(runs)
    )
    body = (FIXTURES / "update_machine" / "6A.request.json").read_bytes()
    for _ in range(2):
        reply = httpx.post(f"{server.url}{UPDATE_MACHINE}?timeout=10s", content=body)
        assert reply.status_code == 200
        answer = reply.json()
        opens = datetime(datetime.now(UTC).year + 1, 1, 1, tzinfo=UTC)
        assert answer["status"] == "Success"
        assert (
            answer["message"] == f'waiting for maintenance window "new-year" (opens {opens:%Y-%m-%d}T00:00Z)'
        )
        assert answer["retryAfterSeconds"] == 300  # capped: CAPI asks again within 5 minutes
    assert [p.name for p in runs.iterdir() if not p.name.startswith(".")] == [], "no attempt was started"


def test_a_bad_window_stops_the_start_with_line_and_field(tmp_path: Path) -> None:
    caps = tmp_path / "caps.yaml"
    caps.write_text("maintenance_windows:\n  - name: nights\n    cron: '0 22 * *'\n    duration: 4h\n")
    flags = ("--plain-http", "--listen", "127.0.0.1:0", "--capabilities-file", str(caps))
    served = run_cli("serve", *flags, env=clean_env(tmp_path / "state"))
    assert served.returncode == 2
    assert "line 3: maintenance_windows[0].cron: not a 5-field cron expression" in served.stderr
    assert json.dumps(str(caps))[1:-1] in served.stderr


def test_plan_says_when_the_machines_window_opens(tmp_path: Path) -> None:
    caps = tmp_path / "caps.yaml"
    caps.write_text(
        NEW_YEAR + "  - {name: other-cluster, cron: '* * * * *', duration: 1h,"
        " labels: {cluster.x-k8s.io/cluster-name: x}}\n"
    )
    request = (FIXTURES / "update_machine" / "6A.request.json").read_text()
    planned = run_cli("plan", "-", "--capabilities-file", str(caps), env=clean_env(tmp_path), stdin=request)
    assert planned.returncode == 0, planned.stderr
    opens = datetime(datetime.now(UTC).year + 1, 1, 1, tzinfo=UTC)
    assert f'closed; "new-year" opens {opens:%Y-%m-%d}T00:00Z' in planned.stdout
    unscoped = run_cli("plan", "-", env=clean_env(tmp_path), stdin=request)
    assert "none applies (may start any time)" in unscoped.stdout
