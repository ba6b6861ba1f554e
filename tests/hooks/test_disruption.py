"""Disruption classes: the table's declarations and ``affectsAvailability`` in the CanUpdate* answers."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from inplace_extension.capabilities_file import CapabilitiesFileError, parse_capabilities
from inplace_extension.inplace.capabilities import (
    CAPABILITIES,
    disruption_of,
    first_disruptive,
    max_disruption,
)
from inplace_extension.inplace.custom import NO_CUSTOM, CustomTable, Disruption

from .conftest import CAN_UPDATE_MACHINE, CAN_UPDATE_MACHINE_SET, load, post

pytestmark = pytest.mark.anyio


def test_builtin_classes() -> None:
    assert {c.name: c.disruption.label for c in CAPABILITIES} == {
        "users": "none",
        "ntp": "none",
        "kubeadm_files": "none",
        "kubelet_args": "restart-kubelet",
        "kubernetes_version": "restart-kubelet",
    }


def test_classes_are_ordered_and_parsed_from_their_labels() -> None:
    assert Disruption.NONE < Disruption.RESTART_KUBELET < Disruption.REBOOT
    assert [Disruption.parse(m.label) for m in Disruption] == list(Disruption)
    with pytest.raises(ValueError, match="unknown disruption class 'drain'"):
        Disruption.parse("drain")


def custom_table(tmp_path: Path, disruption: str | None) -> CustomTable:
    (tmp_path / "roles" / "os_image" / "tasks").mkdir(parents=True, exist_ok=True)
    (tmp_path / "roles" / "os_image" / "tasks" / "main.yml").write_text("---\n[]\n")
    line = f"    disruption: {disruption}\n" if disruption is not None else ""
    return parse_capabilities(
        "capabilities:\n"
        "  - name: os_image\n"
        "    role: os_image\n"
        f"    roles_path: {tmp_path / 'roles'}\n"
        f"{line}"
        "    claims:\n"
        "      - kind: Metal3Machine\n"
        "        pointer: /image/url\n"
    )


@pytest.mark.parametrize(
    ("declared", "expected"),
    [("none", Disruption.NONE), ("restart-kubelet", Disruption.RESTART_KUBELET), (None, Disruption.REBOOT)],
)
def test_user_defined_capabilities_declare_their_class_and_default_to_reboot(
    tmp_path: Path, declared: str | None, expected: Disruption
) -> None:
    custom = custom_table(tmp_path, declared)
    assert disruption_of("os_image", custom) is expected
    assert max_disruption(["users", "os_image"], custom) is max(expected, Disruption.NONE)


def test_an_unknown_class_in_the_file_is_refused_with_its_line(tmp_path: Path) -> None:
    with pytest.raises(CapabilitiesFileError, match=r"line 5: capabilities\[0\]\.disruption"):
        custom_table(tmp_path, "sometimes")


def test_the_first_disruptive_step_in_run_order() -> None:
    assert first_disruptive(["users", "ntp", "kubeadm_files"]) is None
    assert first_disruptive(["users", "kubelet_args", "kubernetes_version"]) == "kubelet_args"
    assert first_disruptive(["kubelet_args"], NO_CUSTOM, Disruption.REBOOT) is None
    with pytest.raises(KeyError):
        disruption_of("no_such_capability")


def users_only(request: dict[str, Any], template: bool) -> dict[str, Any]:
    """``request`` with desired = current except one more user in the bootstrap config (template)."""
    body = copy.deepcopy(request)
    body["desired"] = copy.deepcopy(body["current"])
    key = "bootstrapConfigTemplate" if template else "bootstrapConfig"
    spec = body["desired"][key]["spec"]
    spec = spec["template"]["spec"] if template else spec
    spec.setdefault("users", []).append({"name": "ops-alice", "sshAuthorizedKeys": ["ssh-ed25519 AAAA"]})
    return body


@pytest.mark.parametrize(
    ("fixture", "path", "template"),
    [
        ("can_update_machine/4A.request.json", CAN_UPDATE_MACHINE, False),
        ("can_update_machine_set/5A.request.json", CAN_UPDATE_MACHINE_SET, True),
    ],
)
async def test_users_only_changes_do_not_affect_availability(fixture: str, path: str, template: bool) -> None:
    answer = await post(path, users_only(load(fixture), template))
    assert (answer["status"], answer["message"]) == ("Success", "in place: users")
    assert answer["affectsAvailability"] is False


@pytest.mark.parametrize(
    ("fixture", "path"),
    [
        ("can_update_machine/4A.request.json", CAN_UPDATE_MACHINE),
        ("can_update_machine_set/5A.request.json", CAN_UPDATE_MACHINE_SET),
    ],
)
async def test_a_kubelet_restart_affects_availability(fixture: str, path: str) -> None:
    answer = await post(path, load(fixture))
    assert "kubernetes_version" in answer["message"]
    assert answer["affectsAvailability"] is True


async def test_no_claim_no_field_and_the_setting_turns_it_off() -> None:
    request = load("can_update_machine/4A.request.json")
    unchanged = copy.deepcopy(request)
    unchanged["desired"] = copy.deepcopy(unchanged["current"])
    assert "affectsAvailability" not in await post(CAN_UPDATE_MACHINE, unchanged)
    assert "affectsAvailability" not in await post(CAN_UPDATE_MACHINE, request, affects_availability=False)


async def test_a_user_defined_class_decides_for_its_claims(tmp_path: Path) -> None:
    request = load("can_update_machine/4A.request.json")
    request["desired"] = copy.deepcopy(request["current"])
    for side, url in (("current", "https://i/v1"), ("desired", "https://i/v2")):
        infra = request[side]["infrastructureMachine"]
        infra["kind"], infra["spec"] = "Metal3Machine", {"image": {"url": url}}
    for declared, affects in (("none", False), ("reboot", True)):
        custom = custom_table(tmp_path / declared, declared)
        answer = await post(CAN_UPDATE_MACHINE, request, custom=custom)
        assert (answer["message"], answer["affectsAvailability"]) == ("in place: os_image", affects)
