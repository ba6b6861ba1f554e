"""User-defined capabilities through the app: a capabilities file loaded the way the CLI does, the
CanUpdate* answers that claim its fields, and the RunRequest UpdateMachine hands to the executor."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest

from inplace_extension.capabilities_file import load_capabilities
from inplace_extension.inplace.custom import CustomTable

from .conftest import CAN_UPDATE_MACHINE_SET, TOKEN, UPDATE_MACHINE, FakeRuns, load, post

pytestmark = pytest.mark.anyio

OLD_URL = "https://images.example/os-v1.qcow2"
PAYLOAD = "https://images.example/{{ lookup('pipe','touch /tmp/x') }}.qcow2"


@pytest.fixture
def custom(tmp_path: Path) -> CustomTable:
    (tmp_path / "roles" / "os_image" / "tasks").mkdir(parents=True)
    (tmp_path / "roles" / "os_image" / "tasks" / "main.yml").write_text("---\n[]\n")
    path = tmp_path / "capabilities.yaml"
    path.write_text(
        "capabilities:\n"
        "  - name: os_image\n"
        "    role: os_image\n"
        f"    roles_path: {tmp_path / 'roles'}\n"
        "    claims:\n"
        "      - kind: Metal3Machine\n"
        "        pointer: /image/url\n"
    )
    return load_capabilities(path)


def metal3(obj: dict[str, Any], url: str, template: bool) -> None:
    obj["apiVersion"] = "infrastructure.cluster.x-k8s.io/v1beta1"
    obj["kind"] = "Metal3MachineTemplate" if template else "Metal3Machine"
    spec = obj["spec"]["template"]["spec"] if template else obj["spec"]
    spec.clear()
    spec["image"] = {"url": url}


async def test_can_update_machine_set_claims_the_template_image(custom: CustomTable) -> None:
    request = load("can_update_machine_set/5A.request.json")
    metal3(request["current"]["infrastructureMachineTemplate"], OLD_URL, template=True)
    metal3(request["desired"]["infrastructureMachineTemplate"], PAYLOAD, template=True)
    answer = await post(CAN_UPDATE_MACHINE_SET, request, custom=custom)
    assert answer["status"] == "Success"
    assert answer["message"].endswith(", os_image") and answer["message"].startswith("in place: ")
    assert PAYLOAD not in answer["message"]
    ops = json.loads(base64.b64decode(answer["infrastructureMachineTemplatePatch"]["patch"]))
    assert ops == [{"op": "replace", "path": "/spec/template/spec/image/url", "value": PAYLOAD}]


async def test_without_the_file_the_same_request_is_a_rollout(custom: CustomTable) -> None:
    request = load("can_update_machine_set/5A.request.json")
    metal3(request["current"]["infrastructureMachineTemplate"], OLD_URL, template=True)
    metal3(request["desired"]["infrastructureMachineTemplate"], PAYLOAD, template=True)
    answer = await post(CAN_UPDATE_MACHINE_SET, request, custom=CustomTable())
    assert answer["message"].startswith("rollout needed: Metal3MachineTemplate /image/url")
    assert "infrastructureMachineTemplatePatch" not in answer


async def test_update_machine_runs_the_custom_role_last_with_the_desired_values(custom: CustomTable) -> None:
    request = load("update_machine/6B.request.json")
    metal3(request["desired"]["infrastructureMachine"], PAYLOAD, template=False)
    executor = FakeRuns()
    answer = await post(UPDATE_MACHINE, request, executor, custom=custom)
    assert answer["status"] == "Success"
    [run] = executor.requests
    assert run.capabilities == ("kubeadm_files", "kubelet_args", "kubernetes_version", "os_image")
    assert dict(run.roles) == {"os_image": "os_image"}
    assert run.inputs["os_image"] == {"os_image_values": {"/image/url": PAYLOAD}}
    assert TOKEN not in json.dumps(dict(run.inputs))  # still only claimed fields


async def test_update_machine_fingerprint_follows_the_custom_values(custom: CustomTable) -> None:
    runs = []
    for url in (OLD_URL, PAYLOAD):
        request = load("update_machine/6B.request.json")
        metal3(request["desired"]["infrastructureMachine"], url, template=False)
        executor = FakeRuns()
        await post(UPDATE_MACHINE, request, executor, custom=custom)
        runs.extend(executor.requests)
    assert runs[0].fingerprint != runs[1].fingerprint
    assert runs[0].capabilities == runs[1].capabilities
