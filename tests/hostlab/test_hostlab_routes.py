"""Routing between two labs (hostlab.routes): a host of one lab reaches the SSH of another lab's hosts
only while :func:`routed` holds, and the machine's masquerading rule goes with the block, or with the
routed lab's ``down`` when the block never ended (a killed session)."""

from __future__ import annotations

import os
import subprocess

import pytest
from hostlab.lab import Host, Lab
from hostlab.routes import COMMENT_PREFIX, routed

pytestmark = pytest.mark.lab

# the SSH banner of ``address``, read from inside the other lab's host (python3 is on every lab host)
BANNER = (
    "import socket,sys; s=socket.create_connection((sys.argv[1],22),timeout=3); print(s.recv(4).decode())"
)


def _rules(lab: Lab) -> list[str]:
    listed = subprocess.run(
        ["iptables", "-w", "-t", "nat", "-S", "POSTROUTING"], capture_output=True, text=True
    )
    return [line for line in listed.stdout.splitlines() if f"{COMMENT_PREFIX}{lab.name}->" in line]


def _banner(source: Lab, host: Host, address: str) -> str:
    result = source.exec_in(host, ["python3", "-c", BANNER, address], timeout=20)
    return result.stdout.strip() if result.returncode == 0 else f"failed: {result.stderr.strip()[-200:]}"


def test_a_routed_lab_reaches_the_other_labs_hosts_and_leaves_no_rule(lab: Lab) -> None:
    other = Lab(f"pytest-{os.getpid()}-routes")
    try:
        [source] = other.up(1, owner_pid=os.getpid())
        target = lab.hosts()[0].address
        assert _banner(other, source, target).startswith("failed"), "reached before any route"
        with routed(other, lab):
            assert _banner(other, source, target) == "SSH-"
            assert len(_rules(other)) == 1
        assert _rules(other) == []
        assert _banner(other, source, target).startswith("failed")
        # a block that never ends (the session killed in it): the lab's down removes the rule
        block = routed(other, lab)
        block.__enter__()
        assert len(_rules(other)) == 1
    finally:
        other.down()
    assert _rules(other) == []
