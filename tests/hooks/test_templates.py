"""Metal3 templated values: cloud-init data-source templates in claimed KubeadmConfig fields.

Metal3 KubeadmConfigTemplates carry ``node-labels: metal3.io/uuid={{ ds.meta_data.uuid }}`` and
``provider-id: metal3://{{ ds.meta_data.providerid }}``; cloud-init renders them once, at bootstrap.
An unchanged templated entry does not stop a change beside it from being claimed, and is left out of the
role inputs (kubelet keeps what kubeadm rendered at join); a templated entry that itself changes (or a
new one) is declined with that reason. The same holds for files, users and ntp.
"""

from __future__ import annotations

import base64
import copy
import json
from typing import Any

import pytest

from inplace_extension.inplace.custom import CustomCapability, CustomClaim, CustomTable
from inplace_extension.inplace.decide import decide_can_update_machine
from inplace_extension.inplace.plan import plan_update

from .conftest import CAN_UPDATE_MACHINE, UPDATE_MACHINE, FakeRuns, load, post

pytestmark = pytest.mark.anyio

UUID_LABEL = {"name": "node-labels", "value": "metal3.io/uuid={{ ds.meta_data.uuid }}"}
PROVIDER_ID = {"name": "provider-id", "value": "metal3://{{ ds.meta_data.providerid }}"}
TEMPLATED_FILE = {"path": "/etc/metal3-host", "content": "host={{ ds.meta_data.name }}\n"}
TEMPLATE_REASON = "holds a cloud-init template, which is rendered only at bootstrap"


def args(*extra: dict[str, str]) -> list[dict[str, str]]:
    return [dict(entry) for entry in extra]


def request(current: dict[str, Any], desired: dict[str, Any]) -> dict[str, Any]:
    """CanUpdateMachine for a worker whose KubeadmConfig spec goes from ``current`` to ``desired``."""
    body = load("can_update_machine/4A.request.json")
    body["desired"]["machine"]["spec"]["version"] = body["current"]["machine"]["spec"]["version"]
    for side, spec in (("current", current), ("desired", desired)):
        bootstrap = body[side]["bootstrapConfig"]
        bootstrap["spec"] = copy.deepcopy(spec)
    return body


def join(*entries: dict[str, str]) -> dict[str, Any]:
    return {"joinConfiguration": {"nodeRegistration": {"kubeletExtraArgs": args(*entries)}}}


def patch_ops(answer: dict[str, Any]) -> list[dict[str, Any]]:
    patch = answer.get("bootstrapConfigPatch")
    return json.loads(base64.b64decode(patch["patch"])) if patch else []


async def test_max_pods_change_beside_unchanged_templates_is_claimed_and_templates_left_out() -> None:
    current = join(UUID_LABEL, PROVIDER_ID, {"name": "max-pods", "value": "110"})
    desired = join(UUID_LABEL, PROVIDER_ID, {"name": "max-pods", "value": "120"})
    answer = await post(CAN_UPDATE_MACHINE, request(current, desired))
    assert (answer["status"], answer["message"]) == ("Success", "in place: kubelet_args")
    [op] = patch_ops(answer)
    assert op["path"] == "/spec/joinConfiguration/nodeRegistration/kubeletExtraArgs"
    assert op["value"] == desired["joinConfiguration"]["nodeRegistration"]["kubeletExtraArgs"]
    # UpdateMachine: the role writes only the plain argument; the templated ones stay as rendered at join
    update = load("update_machine/6B.request.json")
    update["desired"]["bootstrapConfig"]["spec"] = desired
    executor = FakeRuns()
    assert (await post(UPDATE_MACHINE, update, executor))["status"] == "Success"
    [run] = executor.requests
    assert run.inputs["kubelet_args"] == {"kubelet_args_extra_args": [{"name": "max-pods", "value": "120"}]}


@pytest.mark.parametrize(
    ("current", "desired", "entry"),
    [
        # the template itself changes
        (
            join(UUID_LABEL),
            join({"name": "node-labels", "value": "metal3.io/uuid={{ ds.meta_data.name }}"}),
            0,
        ),
        # a templated entry becomes a plain one (its rendered value is unknown here)
        (join(UUID_LABEL), join({"name": "node-labels", "value": "metal3.io/uuid=abc"}), 0),
        # a new templated entry: nothing would render it
        (
            join({"name": "max-pods", "value": "110"}),
            join({"name": "max-pods", "value": "110"}, PROVIDER_ID),
            1,
        ),
    ],
    ids=["template-changes", "template-to-plain", "new-template"],
)
async def test_a_changed_templated_kubelet_argument_is_declined_with_that_reason(
    current: dict[str, Any], desired: dict[str, Any], entry: int
) -> None:
    answer = await post(CAN_UPDATE_MACHINE, request(current, desired))
    assert answer["status"] == "Success"
    assert patch_ops(answer) == []
    assert f"kubelet_args does not change it in place: entry {entry} {TEMPLATE_REASON}" in answer["message"]
    assert "ds.meta_data" not in answer["message"]


async def test_a_removed_templated_argument_is_declined_as_any_removal() -> None:
    answer = await post(CAN_UPDATE_MACHINE, request(join(UUID_LABEL, PROVIDER_ID), join(UUID_LABEL)))
    assert "entry 1 of the current list is removed" in answer["message"]


async def test_files_unchanged_templated_file_stays_out_and_a_changed_one_is_declined() -> None:
    plain = {"path": "/etc/plain.conf", "content": "a=1\n"}
    current = {"files": [TEMPLATED_FILE]}
    desired = {"files": [TEMPLATED_FILE, plain]}
    answer = await post(CAN_UPDATE_MACHINE, request(current, desired))
    assert answer["message"] == "in place: kubeadm_files"
    plan = plan_update(request(current, desired)["desired"])
    [step] = [step for step in plan.steps if step.capability == "kubeadm_files"]
    assert [entry["path"] for entry in step.inputs["kubeadm_files_files"]] == ["/etc/plain.conf"]
    changed = {"files": [{**TEMPLATED_FILE, "content": "host={{ ds.meta_data.hostname }}\n"}]}
    answer = await post(CAN_UPDATE_MACHINE, request(current, changed))
    assert (
        f"/files: kubeadm_files does not change it in place: entry 0 {TEMPLATE_REASON}" in answer["message"]
    )
    # encoded content is not templated by cloud-init (it renders the text it decodes from)
    encoded = base64.b64encode(b"{{ not a template }}").decode()
    answer = await post(
        CAN_UPDATE_MACHINE,
        request(current, {"files": [TEMPLATED_FILE, {**plain, "content": encoded, "encoding": "base64"}]}),
    )
    assert answer["message"] == "in place: kubeadm_files"


async def test_users_and_ntp_with_changed_templates_are_declined() -> None:
    user = {"name": "ops", "sshAuthorizedKeys": ["ssh-ed25519 AAAA {{ ds.meta_data.name }}"]}
    answer = await post(CAN_UPDATE_MACHINE, request({}, {"users": [user]}))
    assert f"/users: users does not change it in place: entry 0 {TEMPLATE_REASON}" in answer["message"]
    ntp = {"servers": ["{{ ds.meta_data.ntp }}"], "enabled": True}
    answer = await post(CAN_UPDATE_MACHINE, request({}, {"ntp": ntp}))
    assert f"/ntp: ntp does not change it in place: the desired value {TEMPLATE_REASON}" in answer["message"]
    steps = plan_update(request({}, {"ntp": ntp})["desired"]).steps
    assert "ntp" not in [step.capability for step in steps]


def test_a_user_defined_kubeadm_config_claim_declines_a_template_but_passes_others_as_text() -> None:
    custom = CustomTable(
        (
            CustomCapability(
                "pre_commands",
                "pre_commands",
                "/roles",
                (CustomClaim("KubeadmConfig", "/preKubeadmCommands"),),
            ),
        )
    )
    body = request(
        {"preKubeadmCommands": ["echo a"]}, {"preKubeadmCommands": ["echo {{ ds.meta_data.name }}"]}
    )
    decision = decide_can_update_machine(body["current"], body["desired"], custom)
    [verdict] = decision.verdicts
    assert not verdict.in_place
    assert TEMPLATE_REASON in verdict.reason
    plain = request({"preKubeadmCommands": ["echo a"]}, {"preKubeadmCommands": ["echo b"]})
    assert decide_can_update_machine(plain["current"], plain["desired"], custom).fully_claimed
