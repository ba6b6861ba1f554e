"""The ansible-runner adapter against real lab hosts: host keys are verified, pinned to the address."""

from __future__ import annotations

import json
import time
from pathlib import Path

import anyio
import pytest
import yaml
from hostlab.lab import Host, Lab
from hostlab.pytest_plugin import WriteInventory
from run_deps import run_service

from inplace_extension.runs.model import Progress, ProgressState, RunRequest
from inplace_extension.runs.service import RunService
from inplace_extension.settings import Settings

pytestmark = [pytest.mark.lab, pytest.mark.anyio]
FP = "9f" * 32
OTHER_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIJAm/+qD5i6Qm8kDm+Qr9ygOJL1jDRtSlh6jlxmhLn0T"


def request(name: str) -> RunRequest:
    files = [
        {
            "path": "/etc/runs-lab.conf",
            "content": "x\n",
            "owner": "root:root",
            "permissions": "0644",
            "append": False,
        }
    ]
    return RunRequest("lab", name, FP, ("kubeadm_files",), {"kubeadm_files": {"kubeadm_files_files": files}})


async def settle(service: RunService, req: RunRequest, within: float = 120) -> Progress:
    deadline = time.monotonic() + within
    # settled: done, failed, or waiting out a retry; every other in-progress answer (queued, running,
    # the health gate's phase) is still on its way
    while (progress := await service.poll(req)).state is ProgressState.IN_PROGRESS and not progress.retrying:
        assert time.monotonic() < deadline, progress
        await anyio.sleep(0.2)
    return progress


async def test_host_key_is_verified_unless_opted_out(
    lab: Lab, lab_hosts: list[Host], lab_inventory: WriteInventory, tmp_path: Path
) -> None:
    path = lab_inventory(["good", "spoofed", "unchecked"])
    inventory = yaml.safe_load(path.read_text())
    inventory["hosts"][1]["known_hosts"] = OTHER_KEY  # a key the host does not have
    del inventory["hosts"][2]["known_hosts"]
    inventory["hosts"][2]["insecure_skip_host_key_check"] = True
    path.write_text(yaml.safe_dump(inventory))
    settings = Settings(
        inventory=path, allowed_cidrs=[str(lab.network)], runs_dir=tmp_path / "runs", retry_after_seconds=1
    )
    service = run_service(settings)
    try:
        assert (await settle(service, request("good"))).state is ProgressState.DONE
        spoofed = await settle(service, request("spoofed"))
        assert (spoofed.state, spoofed.message) == (
            ProgressState.IN_PROGRESS,
            "host unreachable, retrying (attempt 2)",
        )
        meta = json.loads(next((tmp_path / "runs").glob("lab.spoofed.*/attempt-0001/meta.json")).read_text())
        stdout = (Path(meta["batch_dir"]) / "artifacts" / meta["batch_ident"] / "stdout").read_text()
        assert "Host key verification failed" in stdout
        assert (await settle(service, request("unchecked"))).state is ProgressState.DONE
        assert lab.read_file(lab_hosts[0], "/etc/runs-lab.conf") == "x\n"
        assert lab.exec_in(lab_hosts[1], ["test", "-e", "/etc/runs-lab.conf"]).returncode == 1
    finally:
        service.close()
