"""Reading the host side of an update in the end-to-end tests: stamp writes and host lock events."""

from __future__ import annotations

import json
from typing import Any

from hostlab.lab import Host, Lab

STATE_DIR = "/var/lib/inplace-extension"


def _json_lines(lab: Lab, host: Host, name: str) -> list[dict[str, Any]]:
    result = lab.exec_in(host, ["cat", f"{STATE_DIR}/{name}"])
    if result.returncode != 0:
        return []
    return [json.loads(line) for line in result.stdout.splitlines() if line.strip()]


def stamp_writes(lab: Lab, host: Host) -> list[str]:
    """The fingerprint of every stamp write on the host (stamp.log: one line per write)."""
    return [entry["fingerprint"] for entry in _json_lines(lab, host, "stamp.log")]


def lock_events(lab: Lab, host: Host) -> list[str]:
    """The host lock's history (lock.log): acquired / released / took-over, in order."""
    return [entry["event"] for entry in _json_lines(lab, host, "lock.log")]


def lock_log(lab: Lab, host: Host) -> list[dict[str, Any]]:
    """The host lock's history with every field (time, ident, previous, reason)."""
    return _json_lines(lab, host, "lock.log")


def overlapping_holders(events: list[str]) -> bool:
    """True when the lock was ever acquired (or taken over) while someone else held it."""
    held = False
    for event in events:
        if event in ("acquired", "took-over"):
            if held or event == "took-over":
                return True
            held = True
        elif event == "released":
            held = False
    return False


def run_on(lab: Lab, host: Host, argv: list[str]) -> str:
    result = lab.exec_in(host, argv)
    assert result.returncode == 0, f"{argv} on {host.name}: {result.stderr}"
    return result.stdout
