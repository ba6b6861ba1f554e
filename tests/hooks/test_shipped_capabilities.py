"""Shipped capabilities configured in the capabilities file: os_update and kubelet_credentials.

os_update claims the mapped field (here Metal3Machine /image/url) when the new value holds an OS
version, and its plan turns the value into whole argv items; kubelet_credentials reads a Machine
annotation (RFC 3339 timestamp) in the UpdateMachine plan only. No lab: the lab tests are
tests/playbooks/test_os_update.py and test_kubelet_credentials.py.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from inplace_extension.capabilities_file import CapabilitiesFileError, parse_capabilities
from inplace_extension.inplace.custom import Disruption
from inplace_extension.inplace.decide import decide_can_update_machine_set
from inplace_extension.inplace.plan import PlanError, plan_update

from .conftest import load

FILE = """
os_update:
  claim: {kind: Metal3Machine, pointer: /image/url}
  command: /usr/bin/bootc
  args: [switch, "{target}", --label, "v={version}", "{version}"]
  version_pattern: "os-(?P<version>[0-9.]+)[.]qcow2$"
  version_command: [/usr/bin/cat, /etc/os-version]
  retriable_patterns: [busy, "pull.*timed out"]
  reboot_exit_code: 100
kubelet_credentials:
  annotation: example.com/rotate-kubelet-credentials
capabilities: []
"""
OLD, NEW = "https://img.example/os-1.0.0.qcow2", "https://img.example/os-1.1.0.qcow2"
PAYLOAD = "https://img.example/{{ lookup('pipe','touch /tmp/x') }}/$(touch /tmp/y)/os-1.1.0.qcow2"
ANNOTATION = "example.com/rotate-kubelet-credentials"


def metal3(obj: dict[str, Any], url: str) -> None:
    obj["apiVersion"], obj["kind"] = "infrastructure.cluster.x-k8s.io/v1beta1", "Metal3MachineTemplate"
    obj["spec"]["template"]["spec"] = {"image": {"url": url}}


def machine_set_request(old: str, new: str) -> dict[str, Any]:
    request = load("can_update_machine_set/5A.request.json")
    for side, url in (("current", old), ("desired", new)):
        metal3(request[side]["infrastructureMachineTemplate"], url)
        request[side]["bootstrapConfigTemplate"] = json.loads(
            json.dumps(request["current"]["bootstrapConfigTemplate"])
        )
        request[side]["machineSet"]["spec"]["template"]["spec"]["version"] = "v1.30.0"
    return request


def update_objects(url: str | None, annotation: str | None = None) -> dict[str, Any]:
    objects: dict[str, Any] = load("update_machine/6B.request.json")["desired"]
    objects["bootstrapConfig"]["spec"] = {}
    objects["machine"]["spec"].pop("version")
    infra = objects["infrastructureMachine"]
    infra["apiVersion"], infra["kind"] = "infrastructure.cluster.x-k8s.io/v1beta1", "Metal3Machine"
    infra["spec"] = {} if url is None else {"image": {"url": url}}
    if annotation is not None:
        objects["machine"]["metadata"].setdefault("annotations", {})[ANNOTATION] = annotation
    return objects


def test_the_file_configures_both_shipped_capabilities_first_with_their_disruption() -> None:
    table = parse_capabilities(FILE)
    assert table.names == ("os_update", "kubelet_credentials")
    assert table.disruption_of("os_update") is Disruption.REBOOT
    assert table.disruption_of("kubelet_credentials") is Disruption.RESTART_KUBELET
    assert table.roles_paths == ()  # their roles ship in playbooks/roles


def test_os_update_claims_a_new_image_holding_a_version() -> None:
    request = machine_set_request(OLD, NEW)
    decision = decide_can_update_machine_set(request["current"], request["desired"], parse_capabilities(FILE))
    assert decision.fully_claimed, decision.message()
    assert decision.capabilities == ("os_update",)
    ops = decision.patches["infrastructureMachineTemplatePatch"]
    assert ops == [{"op": "replace", "path": "/spec/template/spec/image/url", "value": NEW}]


def test_os_update_declines_a_value_without_a_version() -> None:
    request = machine_set_request(OLD, "https://img.example/latest.qcow2")
    decision = decide_can_update_machine_set(request["current"], request["desired"], parse_capabilities(FILE))
    assert not decision.fully_claimed
    assert "holds no OS version" in decision.message()
    assert "latest" not in decision.message()


def test_os_update_plan_puts_the_value_into_whole_argv_items_only() -> None:
    plan = plan_update(update_objects(PAYLOAD), parse_capabilities(FILE))
    [step] = plan.steps
    assert (step.capability, step.role) == ("os_update", "os_update")
    assert step.inputs["os_update_values"] == {"/image/url": PAYLOAD}
    settings = step.inputs["os_update_settings"]
    assert settings["argv"] == ["/usr/bin/bootc", "switch", PAYLOAD, "--label", "v={version}", "1.1.0"]
    assert settings["version"] == "1.1.0"
    assert settings["done_exit_codes"] == [0, 100]
    assert settings["retriable_regex"] == "(?:busy)|(?:pull.*timed out)"
    assert settings["terminal_regex"] == "(?!)"


def test_os_update_plan_refuses_a_value_without_a_version_before_any_host() -> None:
    with pytest.raises(PlanError) as caught:
        plan_update(update_objects("https://img.example/latest.qcow2"), parse_capabilities(FILE))
    assert caught.value.where == "Metal3Machine /image/url"
    assert "holds no OS version" in caught.value.problem


def test_kubelet_credentials_come_from_the_annotation_in_the_plan() -> None:
    plan = plan_update(update_objects(None, "2026-11-25T07:00:00Z"), parse_capabilities(FILE))
    [step] = plan.steps
    key = "/metadata/annotations/example.com~1rotate-kubelet-credentials"
    assert step.inputs["kubelet_credentials_values"] == {key: "2026-11-25T07:00:00Z"}
    assert step.inputs["kubelet_credentials_settings"]["rotation"] == "2026-11-25T07:00:00Z"
    assert plan_update(update_objects(None), parse_capabilities(FILE)).steps == ()
    with pytest.raises(PlanError, match="RFC 3339"):
        plan_update(update_objects(None, "$(touch /tmp/x)"), parse_capabilities(FILE))


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (FILE.replace("/usr/bin/bootc", "bootc"), "os_update.command"),
        (FILE.replace("[/usr/bin/cat, /etc/os-version]", "[cat, /etc/os-version]"), "version_command"),
        (FILE.replace("[busy,", "['(unclosed',"), "not a regular expression"),
        (
            FILE.replace(
                "capabilities: []",
                "capabilities: [{name: os_update, role: r, roles_path: /r,"
                " claims: [{kind: A, pointer: /a}]}]",
            ),
            "built-in",
        ),
        (
            FILE.replace(
                "capabilities: []",
                "capabilities: [{name: img, role: r, roles_path: /r,"
                " claims: [{kind: Metal3Machine, pointer: /image}]}]",
            ),
            "overlaps /image/url",
        ),
        (FILE.replace("example.com/rotate", "Bad Annotation!"), "kubelet_credentials.annotation"),
    ],
)
def test_bad_shipped_settings_stop_the_service_at_start_up(text: str, problem: str) -> None:
    with pytest.raises(CapabilitiesFileError, match="capabilities file") as caught:
        parse_capabilities(text)
    assert problem in str(caught.value)
