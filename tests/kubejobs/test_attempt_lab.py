"""``inplace-extension attempt`` for real, as a Job's container runs it (a process of its own, the spec
from a file, the outcome to a termination-log file), against a lab host over SSH with the shipped
playbook: the update applied, the outcome written, and a second attempt of the same desired state
finding the host's stamp. No Job and no API server here: that is the node lab's."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from hostlab.lab import Host, Lab
from hostlab.pytest_plugin import WriteInventory

from inplace_extension.kubejobs.spec import AttemptSpec, outcome_of
from inplace_extension.runs.attempts import OutcomeKind
from inplace_extension.runs.inventory import InventorySource
from inplace_extension.runs.model import RunRequest
from inplace_extension.runs.resolve import parse_cidrs, resolve_host

pytestmark = pytest.mark.lab
FP = "7e" * 32
PLAYBOOKS = Path(__file__).resolve().parents[2] / "playbooks"


def attempt(spec: AttemptSpec, work: Path, number: int) -> tuple[int, str, str]:
    spec_file = work / f"attempt-{number}.json"
    spec_file.write_text(spec.encode())
    log = work / f"termination-log-{number}"
    env = {**os.environ, "INPLACE_RUNS_DIR": str(work / f"scratch-{number}")}
    env.pop("POD_NAME", None)  # not in a Pod: no phase to publish
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "inplace_extension",
            "attempt",
            "--spec",
            str(spec_file),
            "--termination-log",
            str(log),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    return done.returncode, log.read_text() if log.exists() else "", done.stderr


def test_the_attempt_command_updates_a_lab_host_and_answers_with_its_outcome(
    lab: Lab, lab_hosts: list[Host], lab_inventory: WriteInventory, tmp_path: Path
) -> None:
    inventory = InventorySource(lab_inventory(["job"])).current()
    files = [
        {
            "path": "/etc/attempt-lab.conf",
            "content": "y\n",
            "owner": "root:root",
            "permissions": "0644",
            "append": False,
        }
    ]
    request = RunRequest(
        "lab", "job", FP, ("kubeadm_files",), {"kubeadm_files": {"kubeadm_files_files": files}}
    )
    target = resolve_host("lab", "job", {}, {}, inventory, parse_cidrs([str(lab.network)]))
    spec = AttemptSpec(
        request=request,
        target=target,
        number=1,
        token="",
        lock_token="lock-of-attempt-1",
        takeover_tokens=(),
        host_checks=(),
        role_vars={},
        roles_paths=(),
        settings={"playbooks_dir": str(PLAYBOOKS)},
    )
    status, message, stderr = attempt(spec, tmp_path, 1)
    assert status == 0, stderr
    outcome = outcome_of(message)
    assert outcome is not None and outcome.kind is OutcomeKind.SUCCESSFUL, message
    assert lab.read_file(lab_hosts[0], "/etc/attempt-lab.conf") == "y\n"
    # a new attempt (a fresh Job: an empty scratch dir) of the same desired state finds the stamp
    status, message, stderr = attempt(replace(spec, number=2, lock_token="lock-of-attempt-2"), tmp_path, 2)
    assert status == 0, stderr
    again = outcome_of(message)
    assert again is not None and again.kind is OutcomeKind.SUCCESSFUL, message
