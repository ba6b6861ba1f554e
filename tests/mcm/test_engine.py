"""``mcm-agent`` builds its engine as ``serve`` does: the capabilities file's command checks run in the
play of every update it starts (they are the health gate "in every mode"), and a Node no annotation or
inventory entry places is reached at the first ``--address-types`` address of its status.

No lab: the command starts for real from the CLI entry point, with a fake ansible-runner and the
HTTP server's ``serve`` replaced by a coroutine that polls one update through the engine the agent
was built with (the Node watch gets no API server, and is cancelled when that coroutine returns).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import uvicorn

from inplace_extension import cli
from inplace_extension.plays import runner
from inplace_extension.runs.model import CommandCheck, RunRequest
from inplace_extension.runs.service import RunService

PLAYBOOKS = Path(__file__).resolve().parents[2] / "playbooks"
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIJAm"
# no entry for Node n1: its address comes from its status.addresses, its host key from the defaults
INVENTORY = f"""\
hosts: [{{match: {{name: m1}}, address: 10.79.9.11, known_hosts: "{KEY}"}}]
defaults: {{user: ansible, private_key_file: /keys/id, known_hosts: "{KEY}"}}
"""

CAPABILITIES = """\
health_checks:
  - name: app
    command: [/usr/local/bin/app-check, --quick]
    timeout_seconds: 7
"""
KUBECONFIG = """\
apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:9"}}]
users: [{name: u, user: {token: not-a-secret}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
"""


def test_mcm_agent_runs_the_command_checks_of_the_capabilities_file_and_finds_hosts_by_address_types(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "capabilities.yaml").write_text(CAPABILITIES)
    (tmp_path / "inventory.yaml").write_text(INVENTORY)
    (tmp_path / "kubeconfig").write_text(KUBECONFIG)
    started: list[runner.BatchSpec] = []

    def start(spec: runner.BatchSpec, on_task: runner.TaskListener) -> runner.RunHandle:
        started.append(spec)  # what the play would get; it never runs here
        raise runner.RunStartError("not started: a test")

    monkeypatch.setattr(runner, "start", start)
    engines: list[RunService] = []
    built = RunService.__init__

    def record(self: RunService, *args: Any, **kwargs: Any) -> None:
        built(self, *args, **kwargs)
        engines.append(self)

    monkeypatch.setattr(RunService, "__init__", record)
    addresses = (("InternalIP", "10.79.9.21"), ("ExternalIP", "10.79.9.22"))
    request = RunRequest(
        "default", "n1", "ab" * 32, ("ntp",), {"ntp": {"ntp_servers": ["a"]}}, addresses=addresses
    )

    async def update_one(server: uvicorn.Server, sockets: object = None) -> None:
        (engine,) = engines
        while not started:  # CAPI-like polling until the play started
            await engine.poll(request)
            await asyncio.sleep(0.05)

    monkeypatch.setattr(uvicorn.Server, "serve", update_one)
    code = cli.main(
        [
            "mcm-agent",
            "--namespace",
            "machine-controller-manager",
            "--target-kubeconfig",
            str(tmp_path / "kubeconfig"),
            "--capabilities-file",
            str(tmp_path / "capabilities.yaml"),
            "--inventory",
            str(tmp_path / "inventory.yaml"),
            "--allowed-cidrs",
            "10.79.9.0/24",
            "--address-types",
            "ExternalIP,InternalIP",
            "--runs-dir",
            str(tmp_path / "runs"),
            "--playbooks-dir",
            str(PLAYBOOKS),
            "--listen",
            "127.0.0.1:0",
        ]
    )
    assert code == 0
    (batch,) = started
    assert batch.host_checks == (CommandCheck("app", ("/usr/local/bin/app-check", "--quick"), 7),)
    (host,) = batch.hosts
    assert (host.target.address, host.target.source) == ("10.79.9.22", "machine status"), "--address-types"
    assert host.target.host_keys == (KEY,), "pinned by the inventory's defaults"
