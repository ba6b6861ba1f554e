"""User-defined capabilities in the pure core: claims for the Machine-level and template shapes (judged by
the CAPI emulator), declined removals and shapes, run order, plan steps and their fingerprint."""

from __future__ import annotations

import copy
from typing import Any

from capi_emulator import emulate_can_update_machine, emulate_can_update_machine_set

from inplace_extension.inplace.custom import CustomCapability, CustomClaim, CustomTable, template_kind
from inplace_extension.inplace.decide import decide_can_update_machine, decide_can_update_machine_set
from inplace_extension.inplace.plan import plan_update

from .support import load, response_for, unchanged

OS_IMAGE = CustomCapability(
    name="os_image",
    role="os_image",
    roles_path="/srv/roles",
    claims=(CustomClaim("Metal3Machine", "/image/url"), CustomClaim("Metal3Machine", "/image/checksum")),
)
MOTD = CustomCapability(
    "motd", "motd_role", "/srv/other", (CustomClaim("KubeadmConfig", "/preKubeadmCommands"),)
)
TABLE = CustomTable((OS_IMAGE, MOTD))
OLD_URL = "https://images.example/ubuntu-24.04-v1.qcow2"
NEW_URL = "https://images.example/ubuntu-24.04-v2.qcow2"


def metal3(obj: dict[str, Any], url: str, template: bool) -> None:
    """Turn a fixture's DockerMachine[Template] into a Metal3Machine[Template] with an image."""
    obj["apiVersion"] = "infrastructure.cluster.x-k8s.io/v1beta1"  # Metal3 is still v1beta1: kind is enough
    obj["kind"] = "Metal3MachineTemplate" if template else "Metal3Machine"
    spec = obj["spec"]["template"]["spec"] if template else obj["spec"]
    spec.clear()
    spec["image"] = {"url": url, "checksum": url + ".sha256sum"}


def machine_request(new_url: str = NEW_URL) -> dict[str, Any]:
    request = unchanged(load("capi/can_update_machine/4A.request.json"))
    metal3(request["current"]["infrastructureMachine"], OLD_URL, template=False)
    metal3(request["desired"]["infrastructureMachine"], new_url, template=False)
    return request


def machine_set_request(new_url: str = NEW_URL) -> dict[str, Any]:
    request = unchanged(load("capi/can_update_machine_set/5A.request.json"))
    metal3(request["current"]["infrastructureMachineTemplate"], OLD_URL, template=True)
    metal3(request["desired"]["infrastructureMachineTemplate"], new_url, template=True)
    return request


def test_template_kind_of_machine_level_kinds() -> None:
    assert template_kind("Metal3Machine") == "Metal3MachineTemplate"
    assert template_kind("KubeadmConfig") == "KubeadmConfigTemplate"
    assert template_kind("Machine") == "MachineSet"


def test_machine_shape_change_is_claimed_and_capi_updates_in_place() -> None:
    request = machine_request()
    before = copy.deepcopy(request)
    decision = decide_can_update_machine(request["current"], request["desired"], TABLE)
    assert request == before
    assert [(v.pointer, v.in_place, v.capability) for v in decision.verdicts] == [
        ("/image/checksum", True, "os_image"),
        ("/image/url", True, "os_image"),
    ]
    assert decision.capabilities == ("os_image",)
    assert decision.message() == "in place: os_image"
    assert set(decision.patches) == {"infrastructureMachinePatch"}
    result = emulate_can_update_machine(request, response_for(decision))
    assert result.in_place, result.diff


def test_without_the_custom_table_the_same_change_is_a_rollout() -> None:
    request = machine_request()
    decision = decide_can_update_machine(request["current"], request["desired"])
    assert not decision.fully_claimed
    assert emulate_can_update_machine(request, response_for(decision)).outcome == "rollout"


def test_template_shape_is_claimed_by_the_same_declaration() -> None:
    request = machine_set_request()
    decision = decide_can_update_machine_set(request["current"], request["desired"], TABLE)
    assert decision.fully_claimed and decision.capabilities == ("os_image",)
    assert [v.kind for v in decision.verdicts] == ["Metal3MachineTemplate"] * 2
    assert set(decision.patches) == {"infrastructureMachineTemplatePatch"}
    result = emulate_can_update_machine_set(request, response_for(decision))
    assert result.in_place, result.diff


def test_an_object_in_the_wrong_shape_is_not_claimed() -> None:
    # a Metal3Machine where CAPI sends a template: the claim must not read /spec as if it were the template
    request = machine_set_request()
    for side in ("current", "desired"):
        obj = request[side]["infrastructureMachineTemplate"]
        obj["kind"] = "Metal3Machine"
    decision = decide_can_update_machine_set(request["current"], request["desired"], TABLE)
    assert not decision.fully_claimed
    assert all(v.capability is None for v in decision.verdicts)


def test_unclaimed_fields_beside_a_custom_claim_still_force_a_rollout() -> None:
    request = machine_request()
    request["desired"]["infrastructureMachine"]["spec"]["online"] = True
    decision = decide_can_update_machine(request["current"], request["desired"], TABLE)
    assert [(v.pointer, v.in_place) for v in decision.verdicts] == [
        ("/image/checksum", True),
        ("/image/url", True),
        ("/online", False),
    ]
    assert decision.message().startswith("rollout needed: Metal3Machine /online")
    result = emulate_can_update_machine(request, response_for(decision))
    assert result.outcome == "rollout"
    assert [d.pointer for d in result.diff] == ["/online"]


def test_removing_a_claimed_field_is_declined() -> None:
    request = machine_request()
    del request["desired"]["infrastructureMachine"]["spec"]["image"]["checksum"]
    decision = decide_can_update_machine(request["current"], request["desired"], TABLE)
    verdict = {v.pointer: v for v in decision.verdicts}["/image/checksum"]
    assert not verdict.in_place and "removed" in verdict.reason
    assert NEW_URL not in decision.message() and OLD_URL not in decision.message()  # reasons carry no values
    assert emulate_can_update_machine(request, response_for(decision)).outcome == "rollout"


def test_custom_capabilities_run_after_the_built_ins_in_file_order() -> None:
    request = load("capi/can_update_machine_set/5A.request.json")  # a built-in change (version bump)
    for side, url in (("current", OLD_URL), ("desired", NEW_URL)):
        metal3(request[side]["infrastructureMachineTemplate"], url, template=True)
        request[side]["bootstrapConfigTemplate"]["spec"]["template"]["spec"]["preKubeadmCommands"] = [url]
    reversed_table = CustomTable((MOTD, OS_IMAGE))
    decision = decide_can_update_machine_set(request["current"], request["desired"], TABLE)
    assert decision.fully_claimed, decision.message()
    builtins = [c for c in decision.capabilities if c not in ("os_image", "motd")]
    assert builtins and decision.capabilities == (*builtins, "os_image", "motd")
    again = decide_can_update_machine_set(request["current"], request["desired"], reversed_table)
    assert again.capabilities == (*builtins, "motd", "os_image")
    assert emulate_can_update_machine_set(request, response_for(decision)).in_place


def update_request(url: str | None) -> dict[str, Any]:
    request = load("capi/update_machine/6A.request.json")
    infra = request["desired"]["infrastructureMachine"]
    metal3(infra, url or OLD_URL, template=False)
    if url is None:
        del infra["spec"]["image"]
    return request


def test_plan_adds_custom_steps_after_the_built_ins_with_values_by_pointer() -> None:
    desired = update_request(NEW_URL)["desired"]
    plain = plan_update(desired)
    plan = plan_update(desired, TABLE)
    assert plan.capabilities == (*plain.capabilities, "os_image")
    step = plan.steps[-1]
    assert step.role == "os_image"
    assert step.inputs == {
        "os_image_values": {"/image/url": NEW_URL, "/image/checksum": NEW_URL + ".sha256sum"}
    }
    assert all(s.role is None for s in plan.steps[:-1])
    # the fingerprint covers the custom inputs: another image is another run
    assert plan.fingerprint != plain.fingerprint
    assert plan_update(update_request(OLD_URL)["desired"], TABLE).fingerprint != plan.fingerprint
    assert plan_update(update_request(NEW_URL)["desired"], TABLE).fingerprint == plan.fingerprint


def test_plan_leaves_out_a_custom_capability_with_nothing_present() -> None:
    desired = update_request(None)["desired"]
    plan = plan_update(desired, TABLE)
    assert "os_image" not in plan.capabilities
    assert plan.fingerprint == plan_update(desired).fingerprint
