"""The health gate's command checks on a real lab host, through the real service (plain mode).

The capabilities file's ``health_checks`` with ``command`` reach the play as a file (RunService ->
runner -> lookup|from_json) and run on the host after the last role, before the stamp: a passing check
lets the update finish, a failing one fails it with the stable ``health gate: ...`` message and no
stamp, and argv items carrying shell or Jinja payloads reach the program literally.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from hostlab.lab import Host, Lab
from hostlab.pytest_plugin import WriteInventory

from inplace_extension.capabilities_file import parse_capabilities, parse_file
from inplace_extension.engine import build_engine, host_checks
from inplace_extension.metrics import Metrics
from inplace_extension.runs.model import (
    NO_CLUSTER_SIDE,
    NO_OBJECT_HEALTH,
    Progress,
    ProgressState,
    RunRequest,
)
from inplace_extension.runs.service import RunService
from inplace_extension.settings import Settings

pytestmark = [pytest.mark.lab, pytest.mark.anyio]
STAMP = "/var/lib/inplace-extension/stamp.json"
ARGV_FILE = "/tmp/health-check-argv.json"
# writes its arguments as JSON: what the program really received
RECORD_ARGV = [
    "/usr/bin/python3",
    "-c",
    f"import json, sys; open('{ARGV_FILE}', 'w').write(json.dumps(sys.argv[1:]))",
]


@pytest.fixture
def sentinel() -> Iterator[str]:
    path = f"/tmp/inplace-pwned-{uuid.uuid4().hex[:12]}"
    yield path
    Path(path).unlink(missing_ok=True)
    Path(path + "-jinja").unlink(missing_ok=True)


def request(fingerprint: str) -> RunRequest:
    file: dict[str, Any] = {"path": "/etc/health.conf", "content": "x\n", "owner": "root:root"}
    inputs = {"kubeadm_files": {"kubeadm_files_files": [{**file, "permissions": "0644", "append": False}]}}
    return RunRequest("lab", "m1", fingerprint, ("kubeadm_files",), inputs)


async def settle(service: RunService, req: RunRequest, within: float = 180) -> Progress:
    deadline = time.monotonic() + within
    while (progress := await service.poll(req)).state is ProgressState.IN_PROGRESS:
        assert time.monotonic() < deadline, progress
        await anyio.sleep(0.2)
    return progress


def service(lab: Lab, inventory: Path, tmp_path: Path, capabilities_yaml: str, gate: int) -> RunService:
    """The engine exactly as ``serve`` and ``mcm-agent`` build it from the capabilities file."""
    settings = Settings(
        inventory=inventory,
        allowed_cidrs=[str(lab.network)],
        runs_dir=tmp_path / f"runs-{uuid.uuid4().hex[:6]}",
        retry_after_seconds=1,
        health_gate_timeout_seconds=gate,
    )
    return build_engine(
        settings,
        parse_file(capabilities_yaml),
        Metrics(),
        NO_CLUSTER_SIDE,
        NO_OBJECT_HEALTH,
        records=None,
        jobs_kubeconfig=None,
    )


def stamped(lab: Lab, host: Host) -> str | None:
    if lab.exec_in(host, ["test", "-e", STAMP]).returncode != 0:
        return None
    return str(json.loads(lab.read_file(host, STAMP))["fingerprint"])


async def test_a_passing_check_gets_its_arguments_literally_and_lets_the_update_finish(
    lab: Lab, lab_hosts: list[Host], lab_inventory: WriteInventory, tmp_path: Path, sentinel: str
) -> None:
    host = lab_hosts[0]
    payloads = [
        f"$(touch {sentinel})",
        f"`touch {sentinel}`",
        f"{{{{ lookup('pipe', 'touch {sentinel}-jinja') }}}}",
        f"; touch {sentinel}",
    ]
    checks = (
        "health_checks:\n"
        f"  - name: literal\n    command: {json.dumps(RECORD_ARGV + payloads)}\n"
        "  - name: present\n    command: [test, -e, /etc/health.conf]\n"
    )
    runs = service(lab, lab_inventory(["m1"]), tmp_path, checks, gate=30)
    try:
        req = request("a1" * 32)
        assert await settle(runs, req) == Progress(ProgressState.DONE, "update applied")
    finally:
        runs.close()
    assert json.loads(lab.read_file(host, ARGV_FILE)) == payloads
    assert stamped(lab, host) == req.fingerprint
    assert_not_run(lab, host, (sentinel, sentinel + "-jinja"))


def assert_not_run(lab: Lab, host: Host, sentinels: tuple[str, ...]) -> None:
    for path in sentinels:
        assert not Path(path).exists(), "a payload ran on the controller"
        assert lab.exec_in(host, ["test", "-e", path]).returncode == 1, "a payload ran on the host"


async def test_a_failing_check_fails_the_update_with_a_stable_message_and_no_stamp(
    lab: Lab, lab_hosts: list[Host], lab_inventory: WriteInventory, tmp_path: Path
) -> None:
    host = lab_hosts[0]
    checks = (
        "health_checks:\n"
        "  - name: present\n    command: [test, -e, /etc/health.conf]\n"
        "  - name: absent\n    command: [test, -e, /nonexistent]\n"
        "  - name: app\n    url: http://{address}:1/never-run-in-plain-mode\n"
    )
    assert [c.name for c in host_checks(parse_capabilities(checks))] == ["present", "absent"]
    runs = service(lab, lab_inventory(["m1"]), tmp_path, checks, gate=3)
    try:
        req = request("b2" * 32)
        started = time.monotonic()
        failed = await settle(runs, req)
        assert failed == Progress(ProgressState.FAILED, "health gate: check absent: exit status 1")
        assert time.monotonic() - started >= 3  # tried again until the gate's timeout
        assert await runs.poll(req) == failed  # remembered: the same answer until the retry annotation
    finally:
        runs.close()
    assert stamped(lab, host) is None
    # the roles did run: only the gate kept the stamp (and so "done") from the host
    assert lab.read_file(host, "/etc/health.conf") == "x\n"
    assert lab.exec_in(host, ["test", "-e", "/var/lib/inplace-extension/lock"]).returncode == 1
