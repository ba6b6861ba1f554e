"""``inplace_service_file`` (playbooks/library), run locally as Ansible runs it (no lab needed).

The module behind the ntp and kubelet_args roles: one file, the restart it needs only when the file
changed, a health wait, and a marker that keeps a failed restart pending for the next run. The restart
command here appends to a log file, so the tests count restarts; the health URL is a local server.
"""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .test_modules import HOST_STATE, PLAYBOOKS, lock_args, lock_log, run

SERVICE_FILE = PLAYBOOKS / "library" / "inplace_service_file.py"


@pytest.fixture
def healthz() -> Iterator[str]:
    class Ok(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200 if self.path == "/healthz" else 404)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Ok)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/healthz"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def args(tmp: Path, content: str | None = "A=1\n", **extra: Any) -> dict[str, Any]:
    log = tmp / "restarts.log"
    return {
        "path": str(tmp / "etc" / "svc" / "flags"),
        "content": content,
        "mode": "0640",
        "restart": ["/bin/sh", "-c", f"echo restart >> {log}"],
        "restart_marker": str(tmp / "state" / "svc.restart-pending"),
        **extra,
    }


def restarts(tmp: Path) -> int:
    log = tmp / "restarts.log"
    return len(log.read_text().splitlines()) if log.exists() else 0


def test_writes_restarts_and_waits_only_when_the_file_changes(tmp_path: Path, healthz: str) -> None:
    first = run(SERVICE_FILE, tmp_path, args(tmp_path, healthz_url=healthz))
    assert (first["changed"], first["written"], first["restarted"]) == (True, True, True), first
    path = tmp_path / "etc" / "svc" / "flags"
    assert path.read_text() == "A=1\n"
    assert path.stat().st_mode & 0o7777 == 0o640
    assert restarts(tmp_path) == 1
    assert not (tmp_path / "state" / "svc.restart-pending").exists()

    again = run(SERVICE_FILE, tmp_path, args(tmp_path, healthz_url=healthz))
    assert (again["changed"], again["restarted"]) == (False, False), again
    assert restarts(tmp_path) == 1

    path.chmod(0o644)  # a mode change alone is a change too
    assert run(SERVICE_FILE, tmp_path, args(tmp_path))["changed"] is True
    assert restarts(tmp_path) == 2

    gone = run(SERVICE_FILE, tmp_path, args(tmp_path, state="absent"))
    assert (gone["changed"], gone["restarted"]) == (True, True), gone
    assert not path.exists()
    assert run(SERVICE_FILE, tmp_path, args(tmp_path, state="absent"))["changed"] is False
    assert restarts(tmp_path) == 3


def test_a_failed_restart_stays_pending_until_it_succeeds(tmp_path: Path) -> None:
    failing = run(SERVICE_FILE, tmp_path, args(tmp_path, restart=["/bin/sh", "-c", "echo nope >&2; exit 3"]))
    assert failing.get("failed") is True
    assert "failed (rc 3): nope" in failing["msg"]
    assert (tmp_path / "etc" / "svc" / "flags").read_text() == "A=1\n"
    # the file is in place now, but the restart it needs has not happened: the next run does it
    retried = run(SERVICE_FILE, tmp_path, args(tmp_path))
    assert (retried["written"], retried["restarted"]) == (False, True), retried
    assert restarts(tmp_path) == 1
    assert run(SERVICE_FILE, tmp_path, args(tmp_path))["changed"] is False


def test_an_unhealthy_service_fails_and_stays_pending(tmp_path: Path, healthz: str) -> None:
    missing = healthz.replace("/healthz", "/nothing-here")
    failing = run(
        SERVICE_FILE,
        tmp_path,
        args(tmp_path, healthz_url=missing, health_timeout_seconds=0.3, health_poll_seconds=0.05),
    )
    assert failing.get("failed") is True
    assert "did not answer 200 within 0.3s after the restart" in failing["msg"]
    assert (tmp_path / "state" / "svc.restart-pending").exists()
    healthy = run(SERVICE_FILE, tmp_path, args(tmp_path, healthz_url=healthz))
    assert healthy["restarted"] is True
    assert not (tmp_path / "state" / "svc.restart-pending").exists()


def test_check_mode_reports_and_touches_nothing(tmp_path: Path) -> None:
    looked = run(SERVICE_FILE, tmp_path, {**args(tmp_path), "_ansible_check_mode": True})
    assert (looked["changed"], looked["written"], looked["restarted"]) == (True, True, False), looked
    assert not (tmp_path / "etc").exists()
    assert restarts(tmp_path) == 0


def test_the_first_installed_alternative_is_configured_instead(tmp_path: Path) -> None:
    chrony: dict[str, Any] = {
        "if_exists": str(tmp_path / "chronyd"),
        "path": str(tmp_path / "etc" / "chrony" / "ours.sources"),
        "content": "server a iburst\n",
        "restart": ["/bin/sh", "-c", f"echo chrony >> {tmp_path / 'restarts.log'}"],
    }
    plain = run(SERVICE_FILE, tmp_path, args(tmp_path, alternatives=[chrony]))
    assert plain["path"] == str(tmp_path / "etc" / "svc" / "flags")  # chronyd absent: the default
    (tmp_path / "chronyd").touch()
    chosen = run(SERVICE_FILE, tmp_path, args(tmp_path, alternatives=[chrony]))
    assert (chosen["path"], chosen["restarted"]) == (chrony["path"], True), chosen
    assert Path(chrony["path"]).read_text() == "server a iburst\n"
    assert (tmp_path / "restarts.log").read_text().splitlines() == ["restart", "chrony"]


def test_the_play_stamp_rides_on_the_step_and_releases_the_lock(tmp_path: Path) -> None:
    """host_stamp: the last step's module writes the stamp and gives the lock back after its own work,
    in the same execution (the play's stamp task is then skipped)."""
    sd = tmp_path / "host-state"
    steps = {"kubelet_args": "k1"}
    lock = run(HOST_STATE, tmp_path, lock_args(sd, "locked", "a", fingerprint="fp1", steps=steps))
    rider = {"ident": "a", "fingerprint": "fp1", "steps": steps, "token": lock["token"], "state_dir": str(sd)}
    got = run(SERVICE_FILE, tmp_path, args(tmp_path, host_stamp=rider))
    assert (got["written"], got["restarted"]) == (True, True), got
    assert (got["host_stamp"]["fingerprint"], got["host_stamp"]["released"]) == ("fp1", True)
    stamp = json.loads((sd / "stamp.json").read_text())
    assert (stamp["fingerprint"], stamp["steps"]) == ("fp1", steps)
    assert not (sd / "lock").exists()
    assert lock_log(sd) == [("acquired", "a"), ("released", "a")]


def test_a_step_that_lost_the_lock_does_its_work_but_writes_no_stamp(tmp_path: Path) -> None:
    """Its lock was taken over as stale meanwhile: the file is in place, the stamp is not written, and
    the failure says the lock was lost (the service counts that as a busy host, not a failed update)."""
    sd = tmp_path / "host-state"
    run(HOST_STATE, tmp_path, lock_args(sd, "locked", "other", fingerprint="fp0"))
    rider = {"ident": "a", "fingerprint": "fp1", "token": "f" * 32, "state_dir": str(sd)}
    got = run(SERVICE_FILE, tmp_path, args(tmp_path, host_stamp=rider))
    assert (got["failed"], got["lost_lock"], got["written"]) == (True, True, True), got
    assert "no longer holds the host lock (now held by other)" in got["msg"]
    assert not (sd / "stamp.json").exists()
    assert (tmp_path / "etc" / "svc" / "flags").read_text() == "A=1\n"
