"""A small stand-in for the CAPI controllers in the end-to-end tests: builds hook requests the way the
MachineDeployment and Machine controllers do (docs/capi-hooks.md §5-§7) and polls UpdateMachine honouring
``retryAfterSeconds``. Request skeletons come from the real CAPI bodies in tests/fixtures/capi/.
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from capi_emulator import emulate_can_update_machine_set

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "capi"
HOOKS = "/hooks.runtime.cluster.x-k8s.io/v1alpha1"
# the bootstrap token CABPK keeps in the KubeadmConfig; it must never show up in a log or message
BOOTSTRAP_TOKEN = "e2e0ab.e2e0123456789abc"


def _fixture(path: str) -> dict[str, Any]:
    data = json.loads((FIXTURES / path).read_text())
    assert isinstance(data, dict)
    return data


def _handler(hook: str) -> str:
    """CAPI's call path: ``/hooks.runtime.cluster.x-k8s.io/v1alpha1/<hook, lower case>/<handler name>``."""
    names = {"CanUpdateMachineSet": "can-update-machineset", "UpdateMachine": "update-machine"}
    return f"{HOOKS}/{hook.lower()}/{names[hook]}"


@dataclass(frozen=True)
class NodeSpec:
    """What a MachineDeployment says a node should be: version plus KubeadmConfig(Template) fields."""

    version: str
    kubeadm: Mapping[str, Any] = field(default_factory=dict)  # files, users, ntp, joinConfiguration
    # when given: {"kind": machine-level infrastructure kind, "spec": its spec} (user-defined capabilities)
    infrastructure: Mapping[str, Any] = field(default_factory=dict)

    def bootstrap_spec(self) -> dict[str, Any]:
        spec = copy.deepcopy(dict(self.kubeadm))
        spec.setdefault("joinConfiguration", {}).setdefault("nodeRegistration", {})
        return spec


def machine_set_request(current: NodeSpec, desired: NodeSpec) -> dict[str, Any]:
    body = _fixture("can_update_machine_set/5A.request.json")
    for key, node in (("current", current), ("desired", desired)):
        objs = body[key]
        objs["machineSet"]["spec"]["template"]["spec"]["version"] = node.version
        objs["bootstrapConfigTemplate"]["spec"]["template"]["spec"] = node.bootstrap_spec()
        if node.infrastructure:
            template = objs["infrastructureMachineTemplate"]
            template["kind"] = node.infrastructure["kind"] + "Template"
            template["spec"]["template"]["spec"] = copy.deepcopy(dict(node.infrastructure["spec"]))
    return body


def update_machine_request(
    name: str, desired: NodeSpec, annotations: Mapping[str, str] = {}
) -> dict[str, Any]:
    body = _fixture("update_machine/6B.request.json")
    objs = body["desired"]
    for obj in (objs["machine"], objs["infrastructureMachine"], objs["bootstrapConfig"]):
        obj["metadata"]["name"] = name
        obj["metadata"]["namespace"] = "e2e"
    objs["machine"]["metadata"]["annotations"].update(annotations)
    objs["machine"]["spec"]["version"] = desired.version
    spec = desired.bootstrap_spec()
    # as stored by CABPK: the join discovery (with its token) is part of the live KubeadmConfig (§6.4)
    spec["joinConfiguration"]["discovery"] = {
        "bootstrapToken": {"apiServerEndpoint": "10.0.0.1:6443", "token": BOOTSTRAP_TOKEN, "caCertHashes": []}
    }
    objs["bootstrapConfig"]["spec"] = spec
    if desired.infrastructure:
        objs["infrastructureMachine"]["kind"] = desired.infrastructure["kind"]
        objs["infrastructureMachine"]["spec"] = copy.deepcopy(dict(desired.infrastructure["spec"]))
    return body


def can_update_machine_set(client: httpx.Client, current: NodeSpec, desired: NodeSpec) -> None:
    """Ask CanUpdateMachineSet and insist, as the MD controller would decide, on an in-place update."""
    request = machine_set_request(current, desired)
    response = client.post(_handler("CanUpdateMachineSet"), json=request)
    assert response.status_code == 200, response.text
    result = emulate_can_update_machine_set(request, response.json())
    assert result.in_place, f"CAPI would roll out instead: {[str(d) for d in result.diff]}"


@dataclass
class Polled:
    status: str
    message: str
    calls: int
    messages: list[str]
    answered: float = 0.0  # wall-clock time (time.time()) when the last answer arrived


def poll_update_machine(
    client: httpx.Client,
    name: str,
    desired: NodeSpec,
    annotations: Mapping[str, str] = {},
    *,
    within: float = 300.0,
    stop_on_failure: bool = True,
    max_calls: int | None = None,
    until: Callable[[str], bool] | None = None,
) -> Polled:
    """Call UpdateMachine like the Machine controller: again after ``retryAfterSeconds`` while > 0.

    Returns at ``Success`` with 0 (done), at the first ``Failure`` (CAPI would back off and call again;
    the test decides), after ``max_calls``, or at the first message ``until`` accepts.
    """
    request = update_machine_request(name, desired, annotations)
    deadline = time.monotonic() + within
    messages: list[str] = []
    calls = 0
    while True:
        response = client.post(_handler("UpdateMachine"), json=request)
        answered = time.time()
        calls += 1
        assert response.status_code == 200, response.text
        body = response.json()
        status, message, retry = body["status"], body.get("message", ""), body.get("retryAfterSeconds")
        assert isinstance(retry, int) and retry >= 0, body
        if not messages or messages[-1] != message:
            messages.append(message)
        if status == "Failure" and stop_on_failure:
            return Polled(status, message, calls, messages, answered)
        if status == "Success" and retry == 0:
            return Polled(status, message, calls, messages, answered)
        if max_calls is not None and calls >= max_calls:
            return Polled(status, message, calls, messages, answered)
        if until is not None and until(message):
            return Polled(status, message, calls, messages, answered)
        assert time.monotonic() < deadline, f"{name}: no result within {within}s; messages: {messages}"
        # the protocol: CAPI does not call again before retryAfterSeconds (docs/capi-hooks.md §7.5)
        time.sleep(retry if status == "Success" else 1)
