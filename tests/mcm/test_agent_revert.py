"""A revert through MCM (the MachineClass's in-place spec A -> B -> A) with the agent over the real run
service and its ``local`` executor (ansible-runner's start replaced by tests/runs' FakeRunner: no host):
the second A plays again, and the Node is answered successful only after that play."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubefake import FakeControl, FakeTarget
from run_deps import run_service
from runs.fakes import FakeRunner
from runs.test_service import KEY

from inplace_extension.mcm import node_state as ns
from inplace_extension.plays import runner as runner_mod
from inplace_extension.runs.service import RunService
from inplace_extension.settings import Settings

from .test_agent_fake import NEW, pool, result, running, until, waiting_node

pytestmark = pytest.mark.anyio
B_SPEC = {**NEW, "kubeadmConfigSpec": {"ntp": {"enabled": True, "servers": ["ntp-b.test"]}}}


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeRunner:
    fake = FakeRunner()
    monkeypatch.setattr(runner_mod, "start", fake.start)
    return fake


@pytest.fixture
def service(tmp_path: Path, fake: FakeRunner) -> Iterator[RunService]:
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(
        f'hosts:\n  - match: {{name: "n*"}}\n    address: 10.79.9.21\n    known_hosts: "{KEY}"\n'
        "defaults: {user: ansible, private_key_file: /keys/id}\n"
    )
    settings = Settings(
        inventory=inventory, allowed_cidrs=["10.79.9.0/24"], runs_dir=tmp_path / "runs", retry_after_seconds=1
    )
    service = run_service(settings)
    yield service
    service.close()


def in_place_spec(control: FakeControl, spec: dict[str, Any]) -> None:
    """The MachineDeployment's current MachineClass gets ``spec`` as its in-place update."""
    changed = copy.deepcopy(control.objects["MachineClass"]["pool-v2"])
    changed["providerSpec"]["inPlaceUpdate"] = spec
    control.put(changed)


def consumed_and_asked_again(target: FakeTarget) -> None:
    """MCM consumed the Node's result, then (for the next desired state) asks for an update again."""
    node = copy.deepcopy(target.nodes["n1"])
    labels = node["metadata"]["labels"]
    labels.pop(ns.RESULT_LABEL)
    labels[ns.CANDIDATE_LABEL] = "true"
    target.put_node(node)


async def test_a_machine_class_reverted_to_an_earlier_spec_is_applied_again(
    fake: FakeRunner, service: RunService
) -> None:
    target, control = FakeTarget(), FakeControl()
    pool(control)  # A
    target.put_node(waiting_node())
    async for _agent in running(target, control, service):
        await until(lambda: result(target) == ns.SUCCESSFUL, target.activity)
        assert fake.count("n1") == 1
        in_place_spec(control, B_SPEC)
        consumed_and_asked_again(target)
        await until(lambda: result(target) == ns.SUCCESSFUL, target.activity)
        assert fake.count("n1") == 2
        in_place_spec(control, NEW)  # back to A
        consumed_and_asked_again(target)
        await until(lambda: result(target) == ns.SUCCESSFUL, target.activity)
        assert fake.count("n1") == 3, "the revert to A was answered without a play"
    first, second, third = (run.fingerprint for run in fake.started)
    assert first == third != second
    assert target.reasons("n1").count("InPlaceUpdateSucceeded") == 3
