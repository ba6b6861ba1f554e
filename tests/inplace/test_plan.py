"""UpdateMachine plans: steps in run order, role inputs read from desired, fingerprint, PlanError."""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
from typing import Any

import pytest

from inplace_extension.inplace.plan import Plan, PlanError, fingerprint, plan_update, step_fingerprints

from .support import load

WORKER_ALL = "requests/update_machine.worker_all_capabilities.request.json"
TOKEN = "abcdef.0123456789abcdef"


def _desired(path: str) -> dict[str, Any]:
    desired: dict[str, Any] = load(path)["desired"]
    return desired


def _bootstrap(desired: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = desired["bootstrapConfig"]["spec"]
    return spec


def _reversed_keys(value: Any) -> Any:
    """The same JSON with every object's keys in reverse order."""
    if isinstance(value, dict):
        return {key: _reversed_keys(value[key]) for key in reversed(list(value))}
    if isinstance(value, list):
        return [_reversed_keys(item) for item in value]
    return value


def test_plan_for_control_plane_fixture_6a() -> None:
    plan = plan_update(_desired("capi/update_machine/6A.request.json"))
    assert (plan.namespace, plan.name) == ("default", "my-cluster-cp-7xk2p")
    assert plan.capabilities == ("kubelet_args", "kubernetes_version")
    assert plan.inputs["kubernetes_version"] == {
        "kubernetes_version_target": "v1.31.0",
        "kubernetes_version_control_plane": True,
    }
    assert plan.inputs["kubelet_args"] == {
        "kubelet_args_extra_args": [
            {
                "name": "eviction-hard",
                "value": "nodefs.available<0%,nodefs.inodesFree<0%,imagefs.available<0%",
            }
        ]
    }


def test_plan_for_worker_fixture_6b() -> None:
    plan = plan_update(_desired("capi/update_machine/6B.request.json"))
    assert plan.capabilities == ("kubeadm_files", "kubelet_args", "kubernetes_version")
    assert plan.inputs["kubernetes_version"]["kubernetes_version_control_plane"] is False
    assert plan.inputs["kubeadm_files"] == {
        "kubeadm_files_files": [
            {
                "path": "/etc/motd.d/10-capi",
                "content": "managed by cluster-api\n",
                "owner": "root:root",
                "permissions": "0644",
                "append": False,
            }
        ]
    }


def test_plan_runs_every_capability_in_table_order_and_skips_secret_backed_entries() -> None:
    plan = plan_update(_desired(WORKER_ALL))
    assert plan.capabilities == ("users", "ntp", "kubeadm_files", "kubelet_args", "kubernetes_version")
    files = plan.inputs["kubeadm_files"]["kubeadm_files_files"]
    assert [f["path"] for f in files] == [
        "/etc/motd.d/10-capi",
        "/etc/inplace/b64.conf",
    ]  # contentFrom skipped
    assert files[1]["content"] == "key=value\n"  # base64 decoded for the role
    users = plan.inputs["users"]["users_users"]
    assert [u["name"] for u in users] == ["ops"]  # the passwdFrom user is skipped
    assert users[0]["passwd"].startswith("$6$")
    assert plan.inputs["ntp"] == {"ntp_enabled": True, "ntp_servers": ["time.example.org"]}


def test_plan_never_reads_discovery_secrets() -> None:
    desired = _desired(WORKER_ALL)
    plan = plan_update(desired)
    assert TOKEN not in json.dumps(plan.inputs)
    assert "discovery" not in json.dumps(plan.inputs)
    _bootstrap(desired)["joinConfiguration"]["discovery"]["bootstrapToken"]["token"] = (
        "zyxwvu.9876543210zyxwvu"
    )
    assert plan_update(desired).fingerprint == plan.fingerprint


def test_plan_decodes_gzip_base64_content() -> None:
    desired = _desired("capi/update_machine/6B.request.json")
    content = base64.b64encode(gzip.compress("ünïcode text\n".encode())).decode()
    _bootstrap(desired)["files"] = [{"path": "/etc/x", "encoding": "gzip+base64", "content": content}]
    files = plan_update(desired).inputs["kubeadm_files"]["kubeadm_files_files"]
    assert files == [
        {
            "path": "/etc/x",
            "content": "ünïcode text\n",
            "owner": "root:root",
            "permissions": "0644",
            "append": False,
        }
    ]


def test_plan_reads_init_configuration_when_join_sets_no_kubelet_args() -> None:
    desired = _desired("capi/update_machine/6A.request.json")
    spec = _bootstrap(desired)
    del spec["joinConfiguration"]
    spec["initConfiguration"] = {"nodeRegistration": {"kubeletExtraArgs": [{"name": "v", "value": "4"}]}}
    assert plan_update(desired).inputs["kubelet_args"] == {
        "kubelet_args_extra_args": [{"name": "v", "value": "4"}]
    }


def test_plan_splits_user_groups_into_a_list() -> None:
    desired = _desired("capi/update_machine/6B.request.json")
    _bootstrap(desired)["users"] = [{"name": "ops", "groups": "adm, docker,,wheel"}]
    users = plan_update(desired).inputs["users"]["users_users"]
    assert users == [{"name": "ops", "groups": ["adm", "docker", "wheel"], "ssh_authorized_keys": []}]


@pytest.mark.parametrize(
    "bootstrap", [None, {"apiVersion": "bootstrap.example/v1", "kind": "TalosConfig", "spec": {"files": "x"}}]
)
def test_plan_only_upgrades_kubernetes_without_a_kubeadm_config(bootstrap: dict[str, Any] | None) -> None:
    desired = _desired("capi/update_machine/6B.request.json")
    if bootstrap is None:
        del desired["bootstrapConfig"]
    else:
        desired["bootstrapConfig"] = bootstrap
    assert plan_update(desired).capabilities == ("kubernetes_version",)


def test_plan_fingerprint_is_sha256_of_canonical_inputs() -> None:
    plan = plan_update(_desired(WORKER_ALL))
    canonical = json.dumps(plan.inputs, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    assert plan.fingerprint == hashlib.sha256(canonical.encode()).hexdigest()
    assert plan.fingerprint == fingerprint(plan.inputs)


def test_plan_fingerprint_ignores_key_order() -> None:
    desired = _desired(WORKER_ALL)
    first = plan_update(desired)
    second = plan_update(_reversed_keys(desired))
    assert first == second
    assert isinstance(first, Plan)


def test_plan_fingerprint_changes_when_a_file_content_changes() -> None:
    desired = _desired(WORKER_ALL)
    before = plan_update(desired).fingerprint
    _bootstrap(desired)["files"][0]["content"] = "managed by cluster-api, edited\n"
    assert plan_update(desired).fingerprint != before


def test_plan_fingerprint_changes_with_control_plane_label() -> None:
    desired = _desired("capi/update_machine/6B.request.json")
    before = plan_update(desired).fingerprint
    desired["machine"]["metadata"]["labels"]["cluster.x-k8s.io/control-plane"] = ""
    assert plan_update(desired).fingerprint != before


def test_step_fingerprints_change_only_for_the_step_whose_inputs_change() -> None:
    """The host's stamp keeps one fingerprint per step: a new file content is a new kubeadm_files
    fingerprint and leaves every other step's (the unchanged Kubernetes version's) as it was."""
    desired = _desired(WORKER_ALL)
    before = plan_update(desired)
    assert list(before.step_fingerprints) == list(before.capabilities)
    assert before.step_fingerprints == {c: fingerprint({c: v}) for c, v in before.inputs.items()}
    _bootstrap(desired)["files"][0]["content"] = "managed by cluster-api, edited\n"
    after = plan_update(desired).step_fingerprints
    changed = [c for c in before.capabilities if after[c] != before.step_fingerprints[c]]
    assert changed == ["kubeadm_files"]


def test_step_fingerprints_name_the_capability() -> None:
    """Two capabilities with equal inputs have different step fingerprints (the name is hashed too)."""
    same = {"flag": True}
    prints = step_fingerprints({"a": same, "b": same})
    assert prints["a"] != prints["b"]


def test_plan_does_not_modify_the_request() -> None:
    desired = _desired(WORKER_ALL)
    snapshot = json.dumps(desired, sort_keys=True)
    plan_update(desired)
    assert json.dumps(desired, sort_keys=True) == snapshot


def _set(desired: dict[str, Any], path: tuple[Any, ...], value: Any) -> None:
    node: Any = desired
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value


@pytest.mark.parametrize(
    ("path", "value", "field_path", "reason"),
    [
        (
            ("bootstrapConfig", "spec", "files", 0, "path"),
            "etc/motd",
            "desired.bootstrapConfig.spec.files[0].path",
            "absolute",
        ),
        (
            ("bootstrapConfig", "spec", "files", 0, "path"),
            "/etc/../shadow",
            "desired.bootstrapConfig.spec.files[0].path",
            "..",
        ),
        (
            ("bootstrapConfig", "spec", "files", 0, "content"),
            42,
            "desired.bootstrapConfig.spec.files[0].content",
            "string",
        ),
        (
            ("bootstrapConfig", "spec", "files", 0, "encoding"),
            "rot13",
            "desired.bootstrapConfig.spec.files[0].encoding",
            "one of",
        ),
        (("bootstrapConfig", "spec", "files"), {"path": "/x"}, "desired.bootstrapConfig.spec.files", "list"),
        (
            ("machine", "spec", "version"),
            "one-point-thirty",
            "desired.machine.spec.version",
            "Kubernetes version",
        ),
        (("machine", "metadata", "name"), "", "desired.machine.metadata.name", "non-empty"),
        (("machine", "spec"), [], "desired.machine.spec", "object"),
        (("bootstrapConfig", "spec"), "x", "desired.bootstrapConfig.spec", "object"),
        (
            ("bootstrapConfig", "spec", "users"),
            [{"name": "Root Admin"}],
            "desired.bootstrapConfig.spec.users[0].name",
            "POSIX",
        ),
        (
            ("bootstrapConfig", "spec", "users"),
            [{"name": "ops", "sudo": "ALL\nevil ALL"}],
            "desired.bootstrapConfig.spec.users[0].sudo",
            "line breaks",
        ),
        (
            ("bootstrapConfig", "spec", "ntp"),
            {"enabled": "yes"},
            "desired.bootstrapConfig.spec.ntp.enabled",
            "boolean",
        ),
        (
            ("bootstrapConfig", "spec", "ntp"),
            {"servers": ["a b"]},
            "desired.bootstrapConfig.spec.ntp.servers",
            "host names",
        ),
        (
            ("bootstrapConfig", "spec", "users"),
            [{"name": "ops"}, {"name": "ops"}],
            "desired.bootstrapConfig.spec.users[1].name",
            "repeats",
        ),
        (
            ("bootstrapConfig", "spec", "users"),
            [{"name": "ops", "homeDir": "home/ops"}],
            "desired.bootstrapConfig.spec.users[0].homeDir",
            "absolute",
        ),
        (
            ("bootstrapConfig", "spec", "users"),
            [{"name": "ops", "groups": "adm,Bad Group"}],
            "desired.bootstrapConfig.spec.users[0].groups",
            "group names",
        ),
        (
            ("bootstrapConfig", "spec", "users"),
            [{"name": "ops", "gecos": "a:b"}],
            "desired.bootstrapConfig.spec.users[0].gecos",
            "':'",
        ),
        (
            ("bootstrapConfig", "spec", "files", 0, "path"),
            "/etc/dir/",
            "desired.bootstrapConfig.spec.files[0].path",
            "directory",
        ),
        (
            ("bootstrapConfig", "spec", "joinConfiguration", "nodeRegistration", "kubeletExtraArgs"),
            [{"name": "node-labels", "value": "a=b c=d"}],
            "desired.bootstrapConfig.spec.joinConfiguration.nodeRegistration.kubeletExtraArgs[0].value",
            "whitespace",
        ),
        (
            ("bootstrapConfig", "spec", "joinConfiguration", "nodeRegistration", "kubeletExtraArgs"),
            [{"name": "Node_Labels", "value": "x"}],
            "desired.bootstrapConfig.spec.joinConfiguration.nodeRegistration.kubeletExtraArgs[0].name",
            "flag name",
        ),
        (
            ("bootstrapConfig", "spec", "joinConfiguration", "nodeRegistration", "kubeletExtraArgs"),
            [{"name": "node-labels", "value": "a=b\nX=1"}],
            "desired.bootstrapConfig.spec.joinConfiguration.nodeRegistration.kubeletExtraArgs[0].value",
            "line breaks",
        ),
    ],
)
def test_plan_error_names_the_field_and_never_the_value(
    path: tuple[Any, ...], value: Any, field_path: str, reason: str
) -> None:
    desired = _desired("capi/update_machine/6B.request.json")
    _set(desired, path, value)
    with pytest.raises(PlanError) as caught:
        plan_update(desired)
    assert caught.value.where == field_path
    assert reason in caught.value.problem
    if isinstance(value, str) and value:
        assert value not in str(caught.value)
    assert str(caught.value).startswith(field_path + ": ")


def test_plan_error_names_the_missing_machine() -> None:
    with pytest.raises(PlanError, match=r"^desired\.machine: must be an object$"):
        plan_update({})
