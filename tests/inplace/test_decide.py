"""CanUpdateMachine / CanUpdateMachineSet decisions, judged through the CAPI emulator.

Every scenario goes through the real core and then through ``capi_emulator``: a claim is only right when
CAPI, applying our patches, reaches the expected outcome.
"""

from __future__ import annotations

import base64
import copy
import gzip
from collections.abc import Iterator
from typing import Any

import pytest

from inplace_extension.inplace.decide import (
    Decision,
    FieldVerdict,
    decide_can_update_machine,
    decide_can_update_machine_set,
)

from .support import bootstrap_spec, decide_and_emulate, load, machine_spec, unchanged

CUM_4A = "capi/can_update_machine/4A.request.json"
CUMS_5A = "capi/can_update_machine_set/5A.request.json"


def _verdict(decision: Decision, pointer: str) -> FieldVerdict:
    matches = [v for v in decision.verdicts if v.pointer == pointer]
    assert len(matches) == 1, decision.verdicts
    return matches[0]


def _ops(decision: Decision) -> Iterator[dict[str, Any]]:
    for ops in decision.patches.values():
        yield from ops


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def _assert_no_values_leak(request: dict[str, Any], decision: Decision) -> None:
    """No string from a bootstrap or infrastructure spec (contents, paths, tokens) shows in any message.

    Machine specs are left out: their object references hold kind names, which messages do name.
    """
    texts = [decision.message(), *(v.reason for v in decision.verdicts)]
    for side in ("current", "desired"):
        for key, obj in request[side].items():
            if key in ("machine", "machineSet"):
                continue
            for value in _strings(obj.get("spec", {})):
                if len(value) >= 8:
                    assert all(value not in text for text in texts), "a spec value leaked into a message"


# --- the documented fixtures ------------------------------------------------------------------------------


def test_can_update_machine_claims_version_and_etcd_tag_when_fixture_4a() -> None:
    request = load(CUM_4A)
    decision, result = decide_and_emulate(request)
    assert result.in_place
    assert decision.fully_claimed
    assert decision.message() == "in place: kubernetes_version"
    assert decision.patches == {
        "machinePatch": [{"op": "replace", "path": "/spec/version", "value": "v1.31.0"}],
        "bootstrapConfigPatch": [
            {"op": "replace", "path": "/spec/clusterConfiguration/etcd/local/imageTag", "value": "3.5.15-0"}
        ],
    }
    etcd = _verdict(decision, "/clusterConfiguration/etcd/local/imageTag")
    assert (etcd.target, etcd.kind, etcd.capability, etcd.in_place) == (
        "bootstrapConfigPatch",
        "KubeadmConfig",
        "kubernetes_version",
        True,
    )


def test_can_update_machine_set_claims_version_and_new_files_when_fixture_5a() -> None:
    decision, result = decide_and_emulate(load(CUMS_5A))
    assert result.in_place
    assert decision.message() == "in place: kubeadm_files, kubernetes_version"
    files_op = decision.patches["bootstrapConfigTemplatePatch"]
    assert [(op["op"], op["path"]) for op in files_op] == [("add", "/spec/template/spec/files")]


@pytest.mark.parametrize(
    ("path", "kind", "target"),
    [
        ("capi/can_update_machine/4B.request.json", "DockerMachine", "infrastructureMachinePatch"),
        (
            "capi/can_update_machine_set/5B.request.json",
            "DockerMachineTemplate",
            "infrastructureMachineTemplatePatch",
        ),
    ],
)
def test_can_update_declines_custom_image_when_fixture_b(path: str, kind: str, target: str) -> None:
    decision, result = decide_and_emulate(load(path))
    assert result.outcome == "rollout"
    assert [d.pointer for d in result.diff] == ["/customImage"]
    assert not decision.fully_claimed
    assert [(v.kind, v.pointer, v.target, v.capability) for v in decision.unclaimed] == [
        (kind, "/customImage", target, None)
    ]
    assert target not in decision.patches
    assert decision.message() == (
        f"rollout needed: {kind} /customImage: no capability changes it in place;"
        " in place alone: kubernetes_version"
    )


@pytest.mark.parametrize("path", [CUM_4A, CUMS_5A])
def test_can_update_answers_no_changes_when_current_equals_desired(path: str) -> None:
    decision, result = decide_and_emulate(unchanged(load(path)))
    assert result.in_place
    assert (decision.patches, decision.verdicts, decision.message()) == ({}, (), "no changes")


# --- kubernetes_version guard -----------------------------------------------------------------------------


def test_version_not_claimed_when_a_minor_is_skipped() -> None:
    request = load("requests/can_update_machine.minor_skip.request.json")
    decision, result = decide_and_emulate(request)
    assert result.outcome == "rollout"
    assert {d.pointer for d in result.diff} == {"/version", "/clusterConfiguration/etcd/local/imageTag"}
    assert decision.patches == {}
    version = _verdict(decision, "/version")
    assert not version.in_place
    assert version.capability == "kubernetes_version"
    assert "one at a time" in version.reason
    assert (
        "only together with an in-place Kubernetes version upgrade"
        in _verdict(decision, "/clusterConfiguration/etcd/local/imageTag").reason
    )
    _assert_no_values_leak(request, decision)


@pytest.mark.parametrize(
    ("old", "new", "claimed", "why"),
    [
        ("v1.30.0", "v1.30.4", True, ""),
        ("v1.30.9", "v1.31.0", True, ""),
        ("v1.31.0-rc.1", "v1.31.0", True, ""),
        ("v1.30.2", "v1.30.1", False, "downgrades"),
        ("v1.30.0", "v1.29.5", False, "downgrades"),
        ("v1.30.0", "v1.32.0", False, "one at a time"),
        ("v1.30.0", "v2.0.0", False, "major"),
        ("v1.30.0", "latest", False, "desired version is not"),
        ("1.30", "v1.30.1", False, "current version is not"),
        ("v1.30.0+a", "v1.30.0+b", False, "build metadata"),
    ],
)
def test_version_guard_when_machine_set_version_changes(old: str, new: str, claimed: bool, why: str) -> None:
    request = unchanged(load(CUMS_5A))
    machine_spec(request, "current")["version"] = old
    machine_spec(request, "desired")["version"] = new
    decision, result = decide_and_emulate(request)
    verdict = _verdict(decision, "/version")
    assert verdict.in_place is claimed
    assert result.in_place is claimed
    assert why in verdict.reason
    assert new not in decision.message() and old not in decision.message()


def test_cluster_configuration_not_claimed_when_version_unchanged() -> None:
    request = unchanged(load(CUM_4A))
    bootstrap_spec(request, "desired")["clusterConfiguration"]["featureGates"] = {"SomeGate": True}
    decision, result = decide_and_emulate(request)
    assert result.outcome == "rollout"
    verdict = _verdict(decision, "/clusterConfiguration/featureGates")
    assert (verdict.in_place, verdict.capability) == (False, "kubernetes_version")


def test_cluster_configuration_added_under_missing_parents_with_version_upgrade() -> None:
    request = load(CUMS_5A)
    bootstrap_spec(request, "desired")["clusterConfiguration"] = {
        "featureGates": {"SomeGate": True},
        "imageRepository": "registry.example/k8s",
        "etcd": {"local": {"imageTag": "3.5.15-0"}},
    }
    decision, result = decide_and_emulate(request)
    assert result.in_place, result.diff
    ops = decision.patches["bootstrapConfigTemplatePatch"]
    # The first claim creates /clusterConfiguration, the later ones add beside it: each op applies in turn.
    assert [(op["op"], op["path"]) for op in ops] == [
        ("add", "/spec/template/spec/files"),
        ("add", "/spec/template/spec/clusterConfiguration"),
        ("add", "/spec/template/spec/clusterConfiguration/featureGates"),
        ("add", "/spec/template/spec/clusterConfiguration/imageRepository"),
    ]


def test_cluster_configuration_removal_also_removes_emptied_parents() -> None:
    request = load(CUM_4A)
    del bootstrap_spec(request, "desired")["clusterConfiguration"]["etcd"]
    decision, result = decide_and_emulate(request)
    assert result.in_place, result.diff
    assert decision.patches["bootstrapConfigPatch"] == [
        {"op": "remove", "path": "/spec/clusterConfiguration/etcd"}
    ]


def test_cluster_configuration_field_outside_claims_stays_unclaimed() -> None:
    request = load(CUM_4A)
    bootstrap_spec(request, "desired")["clusterConfiguration"]["apiServer"]["certSANs"].append(
        "extra.example"
    )
    decision, result = decide_and_emulate(request)
    assert [d.pointer for d in result.diff] == ["/clusterConfiguration/apiServer/certSANs"]
    assert _verdict(decision, "/version").in_place


# --- kubeadm_files guard ----------------------------------------------------------------------------------


def test_files_not_claimed_when_a_new_entry_uses_content_from() -> None:
    request = load("requests/can_update_machine_set.content_from.request.json")
    decision, result = decide_and_emulate(request)
    assert [d.pointer for d in result.diff] == ["/files"]
    verdict = _verdict(decision, "/files")
    assert (verdict.in_place, verdict.capability) == (False, "kubeadm_files")
    assert "entry 1 uses contentFrom" in verdict.reason
    assert "bootstrapConfigTemplatePatch" not in decision.patches
    _assert_no_values_leak(request, decision)


def test_files_claimed_when_unchanged_entry_uses_content_from() -> None:
    request = load("requests/can_update_machine_set.content_from.request.json")
    secret_entry = bootstrap_spec(request, "desired")["files"][1]
    bootstrap_spec(request, "current")["files"] = [copy.deepcopy(secret_entry)]
    decision, result = decide_and_emulate(request)
    assert result.in_place, result.diff
    assert _verdict(decision, "/files").in_place


@pytest.mark.parametrize(
    ("path", "why"),
    [
        ("etc/relative", "entry 0 path must be an absolute path"),
        ("/etc/../root/.ssh/x", "entry 0 path must not contain"),
    ],
)
def test_files_not_claimed_when_path_is_unsafe(path: str, why: str) -> None:
    request = load(CUMS_5A)
    bootstrap_spec(request, "desired")["files"][0]["path"] = path
    decision, result = decide_and_emulate(request)
    assert result.outcome == "rollout"
    verdict = _verdict(decision, "/files")
    assert not verdict.in_place
    assert why in verdict.reason
    assert path not in decision.message()


def test_files_claimed_with_every_encoding_when_all_decode_to_text() -> None:
    request = load("requests/can_update_machine_set.all_capabilities.request.json")
    decision, result = decide_and_emulate(request)
    assert result.in_place, result.diff
    assert decision.message() == "in place: users, ntp, kubeadm_files, kubelet_args, kubernetes_version"
    _assert_no_values_leak(request, decision)


@pytest.mark.parametrize(
    ("entry", "why"),
    [
        (
            {"encoding": "base64", "content": base64.b64encode(b"\xff\xfe\x00binary").decode()},
            "not UTF-8 text",
        ),
        (
            {"encoding": "gzip+base64", "content": base64.b64encode(gzip.compress(b"\x80\x81")).decode()},
            "not UTF-8",
        ),
        ({"encoding": "gzip+base64", "content": base64.b64encode(b"not gzip").decode()}, "not valid gzip"),
        ({"encoding": "base64", "content": "%%%"}, "not valid base64"),
        ({"encoding": "gzip", "content": "text"}, "does not survive JSON"),
        ({"encoding": "rot13", "content": "text"}, "encoding must be one of"),
        ({"content": "x", "permissions": "rwxr-xr-x"}, "permissions must be an octal mode"),
    ],
)
def test_files_not_claimed_when_content_cannot_be_written_as_text(entry: dict[str, Any], why: str) -> None:
    request = load(CUMS_5A)
    bootstrap_spec(request, "desired")["files"].append({"path": "/etc/inplace/x", **entry})
    decision, result = decide_and_emulate(request)
    assert result.outcome == "rollout"
    verdict = _verdict(decision, "/files")
    assert not verdict.in_place
    assert why in verdict.reason


def test_files_removal_claimed_when_current_list_is_empty() -> None:
    request = unchanged(load(CUMS_5A))
    bootstrap_spec(request, "current")["files"] = []
    decision, result = decide_and_emulate(request)
    assert result.in_place, result.diff
    assert decision.patches == {
        "bootstrapConfigTemplatePatch": [{"op": "remove", "path": "/spec/template/spec/files"}]
    }


def test_files_removal_not_claimed_when_it_would_delete_an_entry() -> None:
    request = unchanged(load(CUMS_5A))
    bootstrap_spec(request, "current")["files"] = [{"path": "/etc/old", "content": "x"}]
    decision, result = decide_and_emulate(request)
    assert result.outcome == "rollout"
    assert "entry 0 of the current list is removed" in _verdict(decision, "/files").reason


def test_empty_files_list_added_when_current_lacks_files() -> None:
    request = unchanged(load(CUMS_5A))
    bootstrap_spec(request, "desired")["files"] = []
    decision, result = decide_and_emulate(request)
    assert result.in_place, result.diff
    assert decision.patches == {
        "bootstrapConfigTemplatePatch": [{"op": "add", "path": "/spec/template/spec/files", "value": []}]
    }


def test_files_claim_has_the_same_verdict_for_machine_and_machine_set_shapes() -> None:
    new_files = [{"path": "/etc/motd.d/20-extra", "content": "hi\n"}]
    machine = unchanged(load(CUM_4A))
    machine_set = unchanged(load(CUMS_5A))
    for request in (machine, machine_set):
        bootstrap_spec(request, "desired")["files"] = copy.deepcopy(new_files)
    for request, root in ((machine, "/spec"), (machine_set, "/spec/template/spec")):
        decision, result = decide_and_emulate(request)
        assert result.in_place
        verdict = _verdict(decision, "/files")
        assert (verdict.capability, verdict.in_place) == ("kubeadm_files", True)
        assert [op["path"] for op in _ops(decision)] == [root + "/files"]


# --- users, ntp, kubelet_args -----------------------------------------------------------------------------


def test_users_not_claimed_when_a_new_user_uses_passwd_from() -> None:
    request = unchanged(load(CUMS_5A))
    bootstrap_spec(request, "desired")["users"] = [
        {"name": "vault", "passwdFrom": {"secret": {"name": "s", "key": "k"}}}
    ]
    decision, _ = decide_and_emulate(request)
    assert "entry 0 uses passwdFrom" in _verdict(decision, "/users").reason


def test_users_not_claimed_when_a_user_is_removed() -> None:
    request = unchanged(load(CUMS_5A))
    bootstrap_spec(request, "current")["users"] = [{"name": "ops"}, {"name": "dev"}]
    bootstrap_spec(request, "desired")["users"] = [{"name": "ops"}]
    decision, _ = decide_and_emulate(request)
    assert (
        "entry 1 of the current list is removed, and users are not deleted"
        in _verdict(decision, "/users").reason
    )


def test_users_claimed_when_a_key_changes() -> None:
    request = unchanged(load(CUMS_5A))
    bootstrap_spec(request, "current")["users"] = [
        {"name": "ops", "sshAuthorizedKeys": ["ssh-ed25519 AAAAold"]}
    ]
    bootstrap_spec(request, "desired")["users"] = [
        {"name": "ops", "sshAuthorizedKeys": ["ssh-ed25519 AAAAnew"]}
    ]
    decision, result = decide_and_emulate(request)
    assert result.in_place
    assert decision.patches["bootstrapConfigTemplatePatch"][0]["op"] == "replace"


def test_ntp_removal_not_claimed() -> None:
    request = unchanged(load(CUMS_5A))
    bootstrap_spec(request, "current")["ntp"] = {"servers": ["time.example.org"]}
    decision, result = decide_and_emulate(request)
    assert result.outcome == "rollout"
    assert "removing the ntp settings" in _verdict(decision, "/ntp").reason


def test_kubelet_args_not_claimed_when_an_argument_is_dropped() -> None:
    request = unchanged(load(CUM_4A))
    bootstrap_spec(request, "desired")["joinConfiguration"]["nodeRegistration"]["kubeletExtraArgs"] = []
    decision, result = decide_and_emulate(request)
    assert result.outcome == "rollout"
    verdict = _verdict(decision, "/joinConfiguration/nodeRegistration/kubeletExtraArgs")
    assert "entry 0 of the current list is removed" in verdict.reason


def test_kubelet_args_not_claimed_when_value_has_a_line_break() -> None:
    request = unchanged(load(CUM_4A))
    args = bootstrap_spec(request, "desired")["joinConfiguration"]["nodeRegistration"]["kubeletExtraArgs"]
    args.append({"name": "node-labels", "value": "a=b\nEVIL=1"})
    decision, _ = decide_and_emulate(request)
    verdict = _verdict(decision, "/joinConfiguration/nodeRegistration/kubeletExtraArgs")
    assert not verdict.in_place
    assert "entry 1 value must not contain whitespace, line breaks" in verdict.reason


def test_kubelet_args_claimed_when_init_configuration_supplies_them() -> None:
    request = unchanged(load(CUMS_5A))
    for side, args in (
        ("current", [{"name": "v", "value": "2"}]),
        ("desired", [{"name": "v", "value": "4"}]),
    ):
        spec = bootstrap_spec(request, side)
        del spec["joinConfiguration"]
        spec["initConfiguration"] = {"nodeRegistration": {"kubeletExtraArgs": args}}
    decision, result = decide_and_emulate(request)
    assert result.in_place
    assert (
        _verdict(decision, "/initConfiguration/nodeRegistration/kubeletExtraArgs").capability
        == "kubelet_args"
    )


# --- what is never claimed --------------------------------------------------------------------------------


def test_unclaimed_kubeadm_config_field_is_named_in_the_reason() -> None:
    request = load(CUM_4A)
    bootstrap_spec(request, "desired")["preKubeadmCommands"] = ["echo secret-ish-command"]
    decision, result = decide_and_emulate(request)
    assert [d.pointer for d in result.diff] == ["/preKubeadmCommands"]
    verdict = _verdict(decision, "/preKubeadmCommands")
    assert (verdict.in_place, verdict.capability, verdict.target) == (False, None, "bootstrapConfigPatch")
    assert verdict.reason == "/preKubeadmCommands: no capability changes it in place"
    _assert_no_values_leak(request, decision)


def test_failure_domain_is_never_claimed() -> None:
    request = load(CUM_4A)
    machine_spec(request, "desired")["failureDomain"] = "fd2"
    decision, result = decide_and_emulate(request)
    assert [d.pointer for d in result.diff] == ["/failureDomain"]
    assert not _verdict(decision, "/failureDomain").in_place


def test_ignored_machine_fields_need_no_claim() -> None:
    request = unchanged(load(CUM_4A))
    spec = machine_spec(request, "desired")
    spec.update(
        providerID="docker:////other", readinessGates=[], taints=[{"key": "k", "effect": "NoSchedule"}]
    )
    spec["deletion"] = {"nodeDeletionTimeoutSeconds": 30, "nodeDrainTimeoutSeconds": 60}
    decision, result = decide_and_emulate(request)
    assert result.in_place
    assert decision.verdicts == ()


def test_infrastructure_changes_are_never_claimed_even_under_a_claimed_pointer_name() -> None:
    request = unchanged(load(CUM_4A))
    request["current"]["infrastructureMachine"]["spec"]["version"] = "v1.30.0"
    request["desired"]["infrastructureMachine"]["spec"]["version"] = "v1.30.1"
    request["desired"]["infrastructureMachine"]["spec"]["files"] = []
    decision, result = decide_and_emulate(request)
    assert {d.pointer for d in result.diff} == {"/version", "/files"}
    assert all(v.capability is None and v.kind == "DockerMachine" for v in decision.verdicts)


def test_bootstrap_config_of_unknown_version_is_not_claimed() -> None:
    request = load(CUMS_5A)
    for side in ("current", "desired"):
        request[side]["bootstrapConfigTemplate"]["apiVersion"] = "bootstrap.cluster.x-k8s.io/v1beta1"
    decision, result = decide_and_emulate(request)
    assert [d.pointer for d in result.diff] == ["/files"]
    assert _verdict(decision, "/files").capability is None


def test_bootstrap_config_present_on_one_side_only_is_unclaimed() -> None:
    request = load(CUMS_5A)
    del request["current"]["bootstrapConfigTemplate"]
    decision = decide_can_update_machine_set(request["current"], request["desired"])
    verdict = _verdict(decision, "")
    assert (verdict.kind, verdict.in_place) == ("KubeadmConfigTemplate", False)
    assert "bootstrapConfigTemplatePatch" not in decision.patches


def test_discovery_change_is_unclaimed_and_its_token_never_shown() -> None:
    request = unchanged(load(CUM_4A))
    token = "abcdef.0123456789abcdef"
    join = bootstrap_spec(request, "desired")["joinConfiguration"]
    join["discovery"] = {"bootstrapToken": {"token": token, "apiServerEndpoint": "172.18.0.3:6443"}}
    decision, result = decide_and_emulate(request)
    assert result.outcome == "rollout"
    assert not decision.fully_claimed
    assert all(token not in text for text in [decision.message(), *(v.reason for v in decision.verdicts)])


def test_decisions_only_emit_add_remove_replace_ops() -> None:
    for path in (CUM_4A, CUMS_5A, "requests/can_update_machine_set.all_capabilities.request.json"):
        decision = decide_and_emulate(load(path))[0]
        assert {op["op"] for op in _ops(decision)} <= {"add", "remove", "replace"}


def test_decide_can_update_machine_accepts_missing_bootstrap_config() -> None:
    request = load(CUM_4A)
    del request["current"]["bootstrapConfig"], request["desired"]["bootstrapConfig"]
    decision = decide_can_update_machine(request["current"], request["desired"])
    assert decision.message() == "in place: kubernetes_version"
    assert list(decision.patches) == ["machinePatch"]


@pytest.mark.parametrize("broken", [["not", "an", "object"], "text", 5])
def test_malformed_object_is_unclaimed_not_a_crash(broken: Any) -> None:
    request = load(CUM_4A)
    request["desired"]["infrastructureMachine"] = broken
    decision = decide_can_update_machine(request["current"], request["desired"])
    verdict = _verdict(decision, "")
    assert (verdict.target, verdict.kind, verdict.in_place) == (
        "infrastructureMachinePatch",
        "DockerMachine",
        False,
    )
    assert _verdict(decision, "/version").in_place


def test_malformed_spec_is_unclaimed_not_a_crash() -> None:
    request = load(CUM_4A)
    request["desired"]["bootstrapConfig"]["spec"] = ["x"]
    decision = decide_can_update_machine(request["current"], request["desired"])
    assert _verdict(decision, "").reason == "bootstrapConfig.spec is not an object on both sides"
    assert "bootstrapConfigPatch" not in decision.patches


@pytest.mark.parametrize(
    ("before", "after", "why"),
    [
        ({"name": "ops", "shell": "/bin/bash"}, {"name": "ops"}, "entry 0 drops field 'shell'"),
        ({"name": "ops", "passwd": "$6$x"}, {"name": "ops"}, "drops field 'passwd'"),
        ({"name": "ops", "groups": "adm,docker"}, {"name": "ops", "groups": "adm"}, "leaves a group"),
        ({"name": "ops", "sudo": "ALL=(ALL) ALL"}, {"name": "ops", "sudo": "ALL=(ALL) /bin/ls"}, "sudo rule"),
    ],
)
def test_users_not_claimed_when_an_existing_user_would_lose_something(
    before: dict[str, Any], after: dict[str, Any], why: str
) -> None:
    request = unchanged(load(CUMS_5A))
    bootstrap_spec(request, "current")["users"] = [before]
    bootstrap_spec(request, "desired")["users"] = [after]
    decision, result = decide_and_emulate(request)
    assert result.outcome == "rollout"
    assert why in _verdict(decision, "/users").reason


def test_users_claimed_when_an_existing_user_only_gains() -> None:
    request = unchanged(load(CUMS_5A))
    bootstrap_spec(request, "current")["users"] = [{"name": "ops", "groups": "adm"}]
    bootstrap_spec(request, "desired")["users"] = [
        {"name": "ops", "groups": "adm,docker", "sudo": "ALL=(ALL) NOPASSWD:ALL", "shell": "/bin/zsh"},
        {"name": "dev"},
    ]
    decision, result = decide_and_emulate(request)
    assert result.in_place, result.diff
    assert decision.message() == "in place: users"


@pytest.mark.parametrize(
    ("before", "after", "claimed"),
    [
        ({"append": True, "content": "a\n"}, {"append": True, "content": "b\n"}, False),
        ({"content": "a\n"}, {"append": True, "content": "a\n"}, False),
        ({"append": True, "content": "a\n"}, {"content": "a\n"}, False),
        ({"content": "a\n"}, {"content": "b\n", "permissions": "0600"}, True),
    ],
)
def test_files_append_entries_of_existing_files_are_not_rewritten(
    before: dict[str, Any], after: dict[str, Any], claimed: bool
) -> None:
    request = unchanged(load(CUMS_5A))
    bootstrap_spec(request, "current")["files"] = [{"path": "/etc/hosts", **before}]
    bootstrap_spec(request, "desired")["files"] = [
        {"path": "/etc/hosts", **after},
        {"path": "/new", "append": True},
    ]
    decision, result = decide_and_emulate(request)
    assert result.in_place is claimed
    assert _verdict(decision, "/files").in_place is claimed


def test_users_not_claimed_when_a_name_repeats() -> None:
    request = unchanged(load(CUMS_5A))
    bootstrap_spec(request, "desired")["users"] = [{"name": "ops"}, {"name": "ops", "shell": "/bin/sh"}]
    decision, _ = decide_and_emulate(request)
    assert "entry 1 repeats an earlier user" in _verdict(decision, "/users").reason


@pytest.mark.parametrize(
    ("servers", "claimed"), [(["ntp1.example.org", "10.0.0.1", "fd00::1"], True), (["a b"], False)]
)
def test_ntp_servers_must_be_host_names_or_addresses(servers: list[str], claimed: bool) -> None:
    request = unchanged(load(CUMS_5A))
    bootstrap_spec(request, "desired")["ntp"] = {"servers": servers}
    decision, result = decide_and_emulate(request)
    assert result.in_place is claimed
    assert _verdict(decision, "/ntp").in_place is claimed


@pytest.mark.parametrize(
    ("name", "before", "after", "claimed"),
    [
        ("max-pods", "110", "150", True),  # a plain flag: the later value wins
        (
            "eviction-hard",
            "memory.available<100Mi,nodefs.available<10%",
            "memory.available<200Mi,nodefs.available<5%",
            True,
        ),
        ("eviction-hard", "memory.available<100Mi,nodefs.available<10%", "memory.available<100Mi", False),
        ("node-labels", "a=1", "a=1,b=2", True),
        ("node-labels", "a=1,b=2", "b=2", False),
        ("cluster-dns", "10.96.0.10", "10.96.0.11", False),
    ],
)
def test_kubelet_arg_value_changes_only_claimed_when_kubelet_would_not_keep_old_parts(
    name: str, before: str, after: str, claimed: bool
) -> None:
    request = unchanged(load(CUMS_5A))
    for side, value in (("current", before), ("desired", after)):
        bootstrap_spec(request, side)["joinConfiguration"]["nodeRegistration"]["kubeletExtraArgs"] = [
            {"name": name, "value": value}
        ]
    decision, result = decide_and_emulate(request)
    assert result.in_place is claimed
    verdict = _verdict(decision, "/joinConfiguration/nodeRegistration/kubeletExtraArgs")
    assert verdict.in_place is claimed
    assert after not in verdict.reason


def test_kubelet_args_guard_survives_malformed_current_entries() -> None:
    request = unchanged(load(CUMS_5A))
    node = bootstrap_spec(request, "current")["joinConfiguration"]["nodeRegistration"]
    node["kubeletExtraArgs"] = ["junk", {"value": "no name"}]
    decision, _ = decide_and_emulate(request)
    assert not _verdict(decision, "/joinConfiguration/nodeRegistration/kubeletExtraArgs").in_place
