"""``plan --old FILE --new FILE``: the preview of CAPI templates and of an MCM MachineClass pair (steps,
disruption, drain, hosts, windows), its JSON/YAML shape, and precise errors for bad input (exit 2)."""

from __future__ import annotations

import json
import os
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from inplace_extension.cli import main
from inplace_extension.inplace.custom import NO_CUSTOM
from inplace_extension.preview.inputs import Machine
from inplace_extension.preview.judge import Context, preview_request
from inplace_extension.runs.windows import MaintenanceWindow, Schedule
from inplace_extension.settings import Settings

from .conftest import FIXTURES, ROOT

EXAMPLES = ROOT / "examples" / "plan"
CAPI = ("--old", str(EXAMPLES / "capi-old.yaml"), "--new", str(EXAMPLES / "capi-new.yaml"))
MCM = ("--old", str(EXAMPLES / "mcm-old.yaml"), "--new", str(EXAMPLES / "mcm-new.yaml"))
INVENTORY = ("--inventory", str(EXAMPLES / "inventory.yaml"), "--allowed-cidrs", "10.77.0.0/16")


@pytest.fixture(autouse=True)
def no_settings_from_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in [name for name in os.environ if name.startswith("INPLACE_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))


def plan(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["plan", *args])
    out, err = capsys.readouterr()
    return code, out, err


def document(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    code, out, err = plan(capsys, *args, "-o", "json")
    assert code == 0, err
    loaded: dict[str, Any] = json.loads(out)
    return loaded


def test_the_table_shows_changes_steps_the_drain_point_and_each_machines_host(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, err = plan(capsys, *CAPI, *INVENTORY, "--kube", "--machine", "md-0-a", "--machine", "md-0-b")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == "MachineDeployment default/md-0: in place"
    assert lines[1].startswith("CanUpdateMachineSet answers Success, patches: bootstrapConfigTemplatePatch")
    steps = [line.split()[:5] for line in lines if line[:1].isdigit() or line.startswith("--")]
    assert steps == [
        ["1", "kubeadm_files", "none", "yes", "schedulable"],
        ["--", "drain", "point:", "the", "service"],
        ["2", "kubelet_args", "restart-kubelet", "yes", "drained"],
        ["3", "kubernetes_version", "restart-kubelet", "yes", "drained"],
    ]
    host_a = next(line for line in lines if line.startswith("default/md-0-a "))
    assert host_a.endswith("ansible@10.77.1.11:22 (inventory)")
    host_b = next(line for line in lines if line.startswith("default/md-0-b "))
    assert "none: HostNotFound: no inventory entry matches this Machine" in host_b
    assert "managed by cluster-api" not in out and "updated in place" not in out  # values: never shown


def test_without_kube_aware_mode_nothing_is_drained_and_always_drains_before_the_first_step(
    capsys: pytest.CaptureFixture[str],
) -> None:
    offline = document(capsys, *CAPI)
    assert offline["drain"] == {
        "by": "none",
        "before": None,
        "why": "the service drains only in its Kubernetes-aware mode (--kube)",
    }
    assert not any(step["drained"] for step in offline["steps"])
    always = document(capsys, *CAPI, "--kube", "--drain", "always")
    assert always["drain"]["before"] == "kubeadm_files"
    assert all(step["drained"] for step in always["steps"])


def test_an_unchanged_version_is_no_reason_to_drain(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The kubelet already runs the target: the version step changes nothing (the service asks the Node)."""
    new = tmp_path / "new.yaml"
    new.write_text(
        (EXAMPLES / "capi-new.yaml")
        .read_text()
        .replace('{name: max-pods, value: "120"}', '{name: max-pods, value: "110"}')
        .replace("v1.31.0", "v1.30.0")
    )
    preview = document(capsys, "--old", str(EXAMPLES / "capi-old.yaml"), "--new", str(new), "--kube")
    assert [(s["capability"], s["changed"]) for s in preview["steps"]] == [
        ("kubeadm_files", True),
        ("kubelet_args", False),
        ("kubernetes_version", False),
    ]
    # kubelet_args converges (unchanged) but is still a restart-kubelet step: the service drains before it
    assert preview["drain"]["before"] == "kubelet_args"
    # each step's fingerprint, the one a host's stamp keeps for it (a host that has it skips the step)
    prints = [s["fingerprint"] for s in preview["steps"]]
    assert all(re.fullmatch("[0-9a-f]{64}", p) for p in prints) and len(set(prints)) == 3
    assert "kubernetes_version does not count" in preview["drain"]["why"]


def test_a_change_no_capability_carries_out_is_a_rollout_with_no_steps(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    new = tmp_path / "new.yaml"
    new.write_text(
        (EXAMPLES / "capi-new.yaml").read_text().replace("/var/run/docker.sock}", "/run/docker.sock}")
    )
    preview = document(capsys, *CAPI[:2], "--new", str(new), "--machine", "md-0-a")
    assert preview["outcome"] == "rollout"
    refused = [c for c in preview["changes"] if not c["inPlace"]]
    assert [(c["object"], c["field"]) for c in refused] == [("DockerMachineTemplate", "/extraMounts")]
    assert preview["steps"] == [] and preview["machines"][0]["run"] is None


def test_the_yaml_document_has_the_documented_keys(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = plan(capsys, *CAPI, *INVENTORY, "--machine", "md-0-a", "-o", "yaml")
    assert code == 0
    loaded = yaml.safe_load(out)
    assert list(loaded) == [
        "apiVersion",
        "kind",
        "subject",
        "source",
        "outcome",
        "answer",
        "changes",
        "steps",
        "fingerprint",
        "drain",
        "machines",
        "window",
    ]
    assert loaded["kind"] == "PlanPreview"
    assert loaded["machines"][0]["host"] == {
        "resolved": True,
        "address": "10.77.1.11",
        "port": 22,
        "user": "ansible",
        "source": "inventory",
    }


def test_a_machine_class_pair_previews_what_the_agent_runs_on_a_drained_node(
    capsys: pytest.CaptureFixture[str],
) -> None:
    preview = document(capsys, *MCM, "--machine", "node-1")
    assert preview["source"] == "mcm" and preview["outcome"] == "partial"
    fields = {c["field"]: (c["inPlace"], c["capability"]) for c in preview["changes"]}
    assert fields == {
        "/providerSpec/inPlaceUpdate/kubeadmConfigSpec/files": (True, "kubeadm_files"),
        "/providerSpec/inPlaceUpdate/kubeadmConfigSpec/ntp/servers": (True, "ntp"),
        "/providerSpec/machineType": (False, None),
    }
    assert preview["drain"]["by"] == "mcm" and all(step["drained"] for step in preview["steps"])
    assert preview["machines"][0]["run"].startswith("machines.node-1.")


def test_an_invalid_desired_state_is_the_agents_failure_and_exits_1(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    new = tmp_path / "new.yaml"
    new.write_text(
        (EXAMPLES / "mcm-new.yaml")
        .read_text()
        .replace("kubernetesVersion: v1.31.0", "kubernetesVersion: v1.x")
    )
    code, out, _ = plan(capsys, *MCM[:2], "--new", str(new))
    assert code == 1
    assert "failure: the agent answers update-result failed: InvalidDesiredState: " in out
    assert "providerSpec.inPlaceUpdate.kubernetesVersion" in out


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (
            lambda text: text + "---\nkind: Service\napiVersion: v1\nmetadata: {name: x}\n",
            "{new}: document 4: kind Service (v1): expected MachineDeployment or MachineSet",
        ),
        (
            lambda text: text.replace(
                "bootstrap.cluster.x-k8s.io/v1beta2\nkind", "bootstrap.cluster.x-k8s.io/v1beta1\nkind"
            ),
            "{new}: document 2: apiVersion: bootstrap.cluster.x-k8s.io/v1beta1: "
            "only bootstrap.cluster.x-k8s.io/v1beta2 is understood",
        ),
        (
            lambda text: text.split("---\n", 1)[1],
            "{new}: no MachineDeployment/MachineSet, but {old} has one ({old}: document 1); give both sides",
        ),
        (
            lambda text: text.replace(
                "kind: KubeadmConfigTemplate\nmetadata: {name: md-0-v2, namespace: default}",
                "kind: KubeadmConfigTemplate\nmetadata: {namespace: default}",
            ),
            "{new}: document 2: metadata.name: must be a non-empty string",
        ),
        (
            lambda text: text.replace(
                "  template:\n    spec:\n      files", "  template:\n    spec: [1]\n    x:\n      files"
            ),
            "{new}: document 2: spec.template.spec: must be an object",
        ),
        (lambda text: "a: [1\n", "{new}: not JSON or YAML: line 2: expected ',' or ']'"),
    ],
)
def test_bad_input_names_the_file_and_field_and_exits_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, edit: Any, expected: str
) -> None:
    new = tmp_path / "new.yaml"
    new.write_text(edit((EXAMPLES / "capi-new.yaml").read_text()))
    code, out, err = plan(capsys, *CAPI[:2], "--new", str(new))
    assert code == 2 and out == ""
    assert err.startswith("inplace-extension: " + expected.format(new=new, old=CAPI[1])), err
    assert "Traceback" not in err


def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = plan(capsys, "--old", str(EXAMPLES / "capi-old.yaml"))
    assert code == 2 and "--new FILE is missing" in err
    code, _, err = plan(capsys, *CAPI[:2], "--new", str(tmp_path / "nope.yaml"))
    assert code == 2 and f"{tmp_path / 'nope.yaml'}: cannot read: No such file or directory" in err
    request = str(FIXTURES / "can_update_machine_set" / "5A.request.json")
    code, _, err = plan(capsys, *CAPI[:2], "--new", request)
    assert code == 2 and f"{request}: a hook request; preview it with: plan FILE" in err
    code, _, err = plan(capsys, *MCM[:2], *CAPI[2:])
    assert code == 2 and "mcm-old.yaml: no MachineDeployment/MachineSet, but" in err


def test_machines_of_names_the_owner_that_fits_the_files(capsys: pytest.CaptureFixture[str]) -> None:
    """An MCM MachineDeployment (``mcd/NAME``) has Nodes, previewed with MachineClass files; a CAPI
    owner has Machines, previewed with CAPI templates: the other pairing is refused before any cluster
    is read."""
    code, _, err = plan(capsys, *CAPI, "--machines-of", "mcd/pool-a")
    assert code == 2 and "mcd/pool-a is an MCM MachineDeployment" in err, err
    code, _, err = plan(capsys, *MCM, "--machines-of", "md/md-0")
    assert code == 2 and "MachineClass files preview MCM Nodes: give mcd/NAME" in err, err


# -- maintenance windows (the preview of a saved UpdateMachine request, in process) ------------------

NIGHTS = MaintenanceWindow(
    "nights", "0 22 * * *", 3600, labels=(("cluster.x-k8s.io/cluster-name", "my-cluster"),)
)
ELSEWHERE = MaintenanceWindow(
    "elsewhere", "0 22 * * *", 3600, labels=(("cluster.x-k8s.io/cluster-name", "x"),)
)
REQUEST = json.loads((FIXTURES / "update_machine" / "6A.request.json").read_text())


def window_at(windows: Schedule, when: str) -> Any:
    now = datetime.fromisoformat(when).replace(tzinfo=UTC).timestamp()
    context = Context(Settings(), NO_CUSTOM, windows, None, now)
    return preview_request(REQUEST, (), context).machines[0].window


def test_plan_shows_a_closed_window_and_when_it_opens() -> None:
    window = window_at(Schedule((NIGHTS,)), "2026-12-01T12:00:00")
    assert (window.open, window.name, window.opens) == (False, "nights", "2026-12-01T22:00Z")


def test_plan_shows_an_open_window() -> None:
    assert window_at(Schedule((NIGHTS,)), "2026-12-01T22:30:00").open


def test_plan_says_nothing_when_no_window_applies_to_the_machine() -> None:
    assert window_at(Schedule((ELSEWHERE,)), "2026-12-01T12:00:00") is None


def test_machine_names_are_refused_for_a_request_that_names_its_own(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, _, err = plan(capsys, str(FIXTURES / "update_machine" / "6A.request.json"), "--machine", "m")
    assert code == 2 and "--machine: a UpdateMachineRequest names its Machine itself" in err
    assert Machine("m").labels == {}


def test_kubectl_json_lists_are_read_as_they_are(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    files = []
    for name in ("capi-old", "capi-new"):
        items = list(yaml.safe_load_all((EXAMPLES / f"{name}.yaml").read_text()))
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": items, "metadata": {}}))
        files.append(str(path))
    from_json = document(capsys, "--old", files[0], "--new", files[1])
    assert from_json == document(capsys, *CAPI)


def test_a_nodes_status_address_is_its_host_and_each_failure_has_the_services_reason(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """MCM: Node objects in a file are the machines; their addresses come last, as the agent reads them."""
    nodes = [
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "labels": {"pool": "a"}},
            "status": {
                "addresses": [{"type": "Hostname", "address": name}, {"type": "InternalIP", "address": ip}]
            },
        }
        for name, ip in (("node-in", "10.77.2.5"), ("node-out", "192.0.2.9"))
    ]
    new = tmp_path / "new.yaml"
    new.write_text((EXAMPLES / "mcm-new.yaml").read_text() + "---\n" + yaml.safe_dump_all(nodes))
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text("defaults: {insecure_skip_host_key_check: true, user: ops}\n")
    flags = ("--inventory", str(inventory), "--allowed-cidrs", "10.77.0.0/16")
    preview = document(capsys, *MCM[:2], "--new", str(new), *flags)
    hosts = {m["name"]: m["host"] for m in preview["machines"]}
    assert hosts["machines/node-in"] == {
        "resolved": True,
        "address": "10.77.2.5",
        "port": 22,
        "user": "ops",
        "source": "machine status",
    }
    assert hosts["machines/node-out"] == {
        "resolved": False,
        "reason": "HostNotAllowed",
        "message": "the address from the machine status is outside --allowed-cidrs",
    }
    inventory.write_text("hosts: []\n")
    strict = document(capsys, *MCM[:2], "--new", str(new), *flags)
    assert strict["machines"][0]["host"]["reason"] == "NoHostKey"


def test_a_control_plane_pair_previews_can_update_machine_and_the_upgrade_of_each_machine(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    kcp = ("--old", str(EXAMPLES / "kcp-old.yaml"), "--new", str(EXAMPLES / "kcp-new.yaml"))
    preview = document(capsys, *kcp, "--kube", "--machine", "cp-1", "--machine", "cp-2")
    assert preview["subject"] == "KubeadmControlPlane default/my-cluster-cp"
    assert preview["answer"]["hook"] == "CanUpdateMachine" and preview["outcome"] == "in-place"
    assert {(c["object"], c["field"]) for c in preview["changes"]} == {
        ("Machine", "/version"),
        ("KubeadmConfig", "/clusterConfiguration/etcd/local/imageTag"),
    }
    steps = [(s["capability"], s["changed"], s["drained"]) for s in preview["steps"]]
    assert steps == [("kubelet_args", False, True), ("kubernetes_version", True, True)]
    assert [m["name"] for m in preview["machines"]] == ["default/cp-1", "default/cp-2"]
    beside = tmp_path / "beside.yaml"
    beside.write_text(
        (EXAMPLES / "kcp-new.yaml").read_text() + "---\n" + (EXAMPLES / "capi-new.yaml").read_text()
    )
    code, _, err = plan(capsys, "--old", str(beside), "--new", str(beside))
    assert code == 2
    assert f"{beside}: document 2: a MachineDeployment/MachineSet beside a KubeadmControlPlane" in err


def test_a_hand_written_yaml_request_with_an_unquoted_timestamp_is_read(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    request = json.loads((FIXTURES / "update_machine" / "6B.request.json").read_text())
    request["desired"]["machine"]["metadata"]["creationTimestamp"] = "STAMP"
    path = tmp_path / "request.yaml"
    path.write_text(yaml.safe_dump(request).replace("STAMP", "2026-11-25T22:00:00Z"))
    stamp = yaml.safe_load(path.read_text())["desired"]["machine"]["metadata"]["creationTimestamp"]
    assert isinstance(stamp, datetime)  # YAML made it a datetime, which JSON has not
    preview = document(capsys, str(path))
    assert preview["fingerprint"] == "7815a54716b00d858e3f19ea0c599afb6d53147fbd383545d7bf691fffba1eea"


@pytest.mark.parametrize(
    ("setting", "outcome", "status"),
    [("requireInPlace", "refused", "Failure"), ("disableInPlaceUpdates", "disabled", "Success")],
)
def test_the_extension_config_settings_of_a_saved_request_are_honoured(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, setting: str, outcome: str, status: str
) -> None:
    request = json.loads((FIXTURES / "can_update_machine_set" / "5B.request.json").read_text())
    request["settings"] = {setting: "true"}
    path = tmp_path / "request.json"
    path.write_text(json.dumps(request))
    preview = document(capsys, str(path), "--machine", "m1")
    assert (preview["outcome"], preview["answer"]["status"]) == (outcome, status)
    assert preview["steps"] == [] and preview["machines"][0]["run"] is None


def aws_pool(tmp_path: Path, name: str, tags: dict[str, str]) -> str:
    """capi-old.yaml with an AWSMachineTemplate ``name`` holding ``tags`` (not the DockerMachineTemplate)."""
    deployment, config, _ = yaml.safe_load_all((EXAMPLES / "capi-old.yaml").read_text())
    deployment["spec"]["template"]["spec"]["infrastructureRef"].update(kind="AWSMachineTemplate", name=name)
    infra = {
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta2",
        "kind": "AWSMachineTemplate",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"template": {"spec": {"instanceType": "m5.large", "additionalTags": tags}}},
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump_all([deployment, config, infra]))
    return str(path)


def test_a_tags_only_change_is_infrastructure_work_with_no_host_step(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    old = aws_pool(tmp_path, "md-0-v1", {"team": "blue"})
    new = aws_pool(tmp_path, "md-0-v2", {"team": "green", "cost": "42"})
    code, out, err = plan(capsys, "--old", old, "--new", new, "--kube")
    assert code == 0, err
    assert "MachineDeployment default/md-0: in place" in out
    assert "affectsAvailability: false" in out
    assert (
        "infrastructure: tags, no host work (CAPA applies AWSMachine /additionalTags; UpdateMachine waits "
        "for its annotation sigs.k8s.io/cluster-api-provider-aws-last-applied-tags)"
    ) in out.splitlines()
    # without cluster access the same change rolls out, and says why
    code, out, err = plan(capsys, "--old", old, "--new", new)
    assert code == 0, err
    assert "only the Kubernetes-aware mode (--kube) can see when it has" in out
    assert "infrastructure:" not in out
