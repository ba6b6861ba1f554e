"""``plan --hosts``, lab-free: how a check play's job events become each step's verdict
(``plays.dry_run.read_check``), the table and the JSON/YAML document (golden files in
tests/fixtures/plan_hosts/; ``UPDATE_GOLDEN=1`` rewrites them), and the exit codes of
``terraform plan -detailed-exitcode``. The play itself is replaced by job events written here; the real
play on lab hosts is tests/playbooks/test_dry_run.py.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from inplace_extension.cli import main
from inplace_extension.plays import dry_run
from inplace_extension.plays.dry_run import DryRun, HostCheck, read_check
from inplace_extension.runs.model import RunRequest
from inplace_extension.runs.resolve import HostTarget

from .conftest import ROOT

EXAMPLES = ROOT / "examples" / "plan"
GOLDEN = ROOT / "tests" / "fixtures" / "plan_hosts"
CAPI = ("--old", str(EXAMPLES / "capi-old.yaml"), "--new", str(EXAMPLES / "capi-new.yaml"))
LOCK = dry_run.LOCK_TASK
MOTD_BEFORE = "managed by cluster-api\n"
MOTD_AFTER = "updated in place\n"


@pytest.fixture(autouse=True)
def no_settings_from_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in [name for name in os.environ if name.startswith("INPLACE_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))


def ok(
    task: str, res: Mapping[str, Any], role: str | None = None, event: str = "runner_on_ok"
) -> dict[str, Any]:
    return {"event": event, "event_data": {"task": task, "role": role, "res": dict(res)}}


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


MOTD_DIFF = {
    "path": "/etc/motd",
    "before_meta": "0:0 0644",
    "after_meta": "0:0 0644",
    "before_b64": b64(MOTD_BEFORE),
    "after_b64": b64(MOTD_AFTER),
}
FLAGS_DIFF = {
    "path": "/etc/default/kubelet",
    "before": 'KUBELET_EXTRA_ARGS="--max-pods=110"\n',
    "after": 'KUBELET_EXTRA_ARGS="--max-pods=120"\n',
    "before_meta": "0:0 0644",
    "after_meta": "0:0 0644",
}
# the job events of one host's check play, per scenario (host names are filled in by ``events_for``)
WOULD_CHANGE = [
    ok(LOCK, {"changed": False, "unchanged": [], "up_to_date": False}),
    ok(
        "Apply kubeadm_files and kubelet_args in one module execution",
        {
            "changed": True,
            "steps": {
                "kubeadm_files": {"changed": True, "inplace_diff": [MOTD_DIFF]},
                "kubelet_args": {"changed": True, "inplace_diff": [FLAGS_DIFF]},
            },
        },
    ),
    ok("Read the installed kubelet version", {"changed": False}, "kubernetes_version"),
    ok(
        "Say which version the upgrade would install (check mode)",
        {"ansible_facts": {"kubernetes_version_would_change": "Kubernetes v1.30.0 -> v1.31.0"}},
        "kubernetes_version",
    ),
]
STAMPED = [ok(LOCK, {"changed": False, "unchanged": [], "up_to_date": True})]
UNREACHABLE = [
    ok(
        "Gathering",
        {"msg": "Failed to connect to the host via ssh: Connection refused"},
        event="runner_on_unreachable",
    )
]


def events_for(scenarios: Mapping[str, list[dict[str, Any]]]) -> Any:
    """A stand-in for ``check_hosts``: each Machine's check read from its scenario's events."""

    def check_hosts(runs: Sequence[DryRun], *_: Any, **kwargs: Any) -> list[HostCheck]:
        checks = []
        for run in runs:
            host = run.request.ident
            events = [
                {**e, "event_data": {**e["event_data"], "host": host}} for e in scenarios[run.request.name]
            ]
            checks.append(read_check(run, host, events, "successful"))
            kwargs["on_host"](checks[-1])
        return checks

    return check_hosts


def inventory(tmp_path: Path, names: Sequence[str]) -> Path:
    hosts = [
        {
            "match": {"name": name},
            "address": f"10.77.1.{11 + i}",
            "user": "ansible",
            "insecure_skip_host_key_check": True,
        }
        for i, name in enumerate(names)
    ]
    path = tmp_path / "inventory.yaml"
    path.write_text(yaml.safe_dump({"hosts": hosts}))
    return path


def run_plan(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    scenarios: Mapping[str, list[dict[str, Any]]],
    *args: str,
    resolved: Sequence[str] | None = None,
) -> tuple[int, str, str]:
    monkeypatch.setattr("inplace_extension.preview.hosts.check_hosts", events_for(scenarios))
    names = list(resolved if resolved is not None else scenarios)
    machines = [f"--machine={name}" for name in [*scenarios, *[n for n in names if n not in scenarios]]]
    code = main(
        [
            "plan",
            *CAPI,
            *machines,
            "--hosts",
            "--inventory",
            str(inventory(tmp_path, names)),
            "--allowed-cidrs",
            "10.77.0.0/16",
            *args,
        ]
    )
    out, err = capsys.readouterr()
    return code, out, err


def golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("UPDATE_GOLDEN"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert text == path.read_text(), f"{name} differs from the golden file (UPDATE_GOLDEN=1 rewrites it)"


@pytest.mark.parametrize("output", ["table", "json", "yaml"])
def test_three_machines_one_each_way_golden_and_exit_1(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path, output: str
) -> None:
    scenarios = {"md-0-a": WOULD_CHANGE, "md-0-b": STAMPED, "md-0-c": UNREACHABLE}
    code, out, err = run_plan(capsys, monkeypatch, tmp_path, scenarios, "-o", output)
    assert code == 1, err
    golden(f"three.{output}", out)


def test_changes_exit_2_nothing_to_do_exit_0(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    code, out, err = run_plan(capsys, monkeypatch, tmp_path, {"md-0-a": WOULD_CHANGE})
    assert code == 2, err
    code, out, err = run_plan(capsys, monkeypatch, tmp_path, {"md-0-a": STAMPED})
    assert code == 0, err
    assert "kubeadm_files: unchanged" in out


def test_a_machine_whose_host_does_not_resolve_is_an_error_of_its_own(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    code, out, err = run_plan(
        capsys, monkeypatch, tmp_path, {"md-0-a": STAMPED, "md-0-z": []}, "-o", "yaml", resolved=["md-0-a"]
    )
    assert code == 1, err
    checks = {m["name"]: m["check"] for m in yaml.safe_load(out)["machines"]}
    assert checks["default/md-0-a"]["result"] == "unchanged"
    assert checks["default/md-0-z"]["result"] == "error"
    assert checks["default/md-0-z"]["error"].startswith("host not resolved: HostNotFound")


def test_input_errors_exit_1_with_hosts(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--hosts", "/nonexistent.json"]) == 1
    assert "cannot read" in capsys.readouterr().err
    assert main(["plan", *CAPI, "--machine=md-0-a", "--hosts"]) == 1
    assert "--inventory" in capsys.readouterr().err
    assert main(["plan", *CAPI, "--hosts"]) == 1  # no Machine named
    assert "--machine" in capsys.readouterr().err
    # through the kubernetes executor: its image is needed (plan runs in no Pod of the service to read it)
    assert main(["plan", *CAPI, "--machine=md-0-a", "--hosts", "--executor", "kubernetes"]) == 1
    assert "--executor kubernetes needs --job-image" in capsys.readouterr().err


def run(capabilities: tuple[str, ...] = ("kubeadm_files", "kubelet_args", "kubernetes_version")) -> DryRun:
    request = RunRequest("default", "m", "f" * 64, capabilities, {cap: {} for cap in capabilities})
    target = HostTarget("10.0.0.1", 22, None, None, True, (), True, None, "inventory")
    return DryRun(request, target)


def hosted(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{**e, "event_data": {**e["event_data"], "host": "h"}} for e in events]


def test_a_step_check_mode_cannot_predict_is_cannot_tell_never_unchanged() -> None:
    events = [
        ok(LOCK, {"changed": False, "unchanged": [], "up_to_date": False}),
        ok(
            "Create or update the users",
            {"skipped": True, "msg": "remote module (inplace_users) does not support check mode"},
            "users",
            "runner_on_skipped",
        ),
        ok(
            "Run the OS update command",
            {"skipped": True, "msg": "Command would have run if not in check mode"},
            "os_image",
            "runner_on_skipped",
        ),
        ok(
            "Skipped by its when",
            {"skipped": True, "skip_reason": "Conditional result was False"},
            "ntp",
            "runner_on_skipped",
        ),
    ]
    check = read_check(run(("users", "ntp", "os_image")), "h", hosted(events), "successful")
    steps = {step.capability: step for step in check.steps}
    assert steps["users"].result == dry_run.CANNOT_TELL
    assert steps["os_image"].result == dry_run.CANNOT_TELL
    assert steps["ntp"].result == dry_run.UNCHANGED  # its tasks ran, found nothing to do
    assert check.result == dry_run.CANNOT_TELL


def test_a_step_the_stamp_holds_is_unchanged_and_a_failed_step_is_the_machines_error() -> None:
    events = [
        ok(LOCK, {"changed": False, "unchanged": ["kubeadm_files"], "up_to_date": False}),
        ok(
            "Write the kubelet extra flags", {"msg": "mode must be octal"}, "kubelet_args", "runner_on_failed"
        ),
    ]
    check = read_check(run(), "h", hosted(events), "failed")
    steps = {step.capability: step for step in check.steps}
    assert steps["kubeadm_files"].result == dry_run.UNCHANGED
    assert steps["kubelet_args"].result == dry_run.FAILED
    assert steps["kubernetes_version"].result == dry_run.CANNOT_TELL  # nothing reported: not unchanged
    assert (
        check.result == dry_run.ERROR
        and check.error == "kubelet_args: task 'Write the kubelet extra flags' failed: mode must be octal"
    )


def test_a_redacted_file_shows_no_content() -> None:
    redacted = {
        "path": "/etc/secret",
        "before_meta": None,
        "after_meta": "0:0 0600",
        "redacted": "content not shown",
    }
    events = [
        ok(LOCK, {"changed": False, "unchanged": [], "up_to_date": False}),
        ok("Write the files", {"changed": True, "inplace_diff": [redacted]}, "kubeadm_files"),
    ]
    check = read_check(run(("kubeadm_files",)), "h", hosted(events), "successful")
    assert check.steps[0].diffs == ("/etc/secret: new file (0:0 0600)\n/etc/secret: content not shown\n",)


class ClusterReader:
    """Stands in for kube/rollout.py's reader (read-only: get and list): MachineDeployment default/md-0
    and its Machines as the API server returns them."""

    def __init__(self, machines: Sequence[dict[str, Any]]) -> None:
        self.machines = tuple(machines)
        self.closed = False

    async def owner_exists(self, owner: Any) -> bool:
        return (owner.kind, owner.namespace, owner.name) == ("MachineDeployment", "default", "md-0")

    async def snapshot(self, owner: Any) -> Any:
        return type("Snapshot", (), {"machines": self.machines, "events": ()})()

    async def close(self) -> None:
        self.closed = True


def live_machine(name: str, address: str) -> dict[str, Any]:
    return {
        "apiVersion": "cluster.x-k8s.io/v1beta2",
        "kind": "Machine",
        "metadata": {
            "name": name,
            "namespace": "default",
            "labels": {"cluster.x-k8s.io/deployment-name": "md-0"},
        },
        "status": {"addresses": [{"type": "InternalIP", "address": address}]},
    }


def test_the_machines_of_a_machine_deployment_are_read_from_the_cluster_and_checked(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """--machines-of md/md-0: the Machines come from the cluster, each host resolved from the live
    Machine's status.addresses as the Kubernetes-aware mode does (no inventory entry matches them)."""
    reader = ClusterReader([live_machine("md-0-y", "10.77.2.8"), live_machine("md-0-x", "10.77.2.7")])
    monkeypatch.setattr("inplace_extension.kube.rollout.connect_rollout", lambda kubeconfig: reader)
    monkeypatch.setattr(
        "inplace_extension.preview.hosts.check_hosts",
        events_for({"md-0-x": WOULD_CHANGE, "md-0-y": STAMPED}),
    )
    defaults = tmp_path / "inventory.yaml"
    defaults.write_text(
        yaml.safe_dump({"defaults": {"user": "ansible", "insecure_skip_host_key_check": True}})
    )
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("apiVersion: v1\nkind: Config\n")
    code = main(
        [
            "plan",
            *CAPI,
            "--machines-of=md/md-0",
            "--kubeconfig",
            str(kubeconfig),
            "--inventory",
            str(defaults),
            "--allowed-cidrs",
            "10.77.0.0/16",
            "--hosts",
            "-o",
            "json",
        ]
    )
    out, err = capsys.readouterr()
    assert code == 2, (out, err)
    machines = yaml.safe_load(out)["machines"]
    assert [m["name"] for m in machines] == ["default/md-0-x", "default/md-0-y"]
    assert [m["host"]["address"] for m in machines] == ["10.77.2.7", "10.77.2.8"]
    assert {m["host"]["source"] for m in machines} == {"machine status"}
    assert [m["check"]["result"] for m in machines] == ["would change", "unchanged"]
    assert reader.closed
    assert main(["plan", *CAPI, "--machines-of=md/other", "--kubeconfig", str(kubeconfig)]) == 2
    assert "not found" in capsys.readouterr().err


SCENARIOS = {"md-0-a": WOULD_CHANGE, "md-0-b": STAMPED}


def test_through_the_kubernetes_executor_each_host_is_checked_in_a_job_and_shown_alike(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``--executor kubernetes``: plan creates a check Job per Machine (of --job-image, in
    --job-namespace) in the cluster (here in memory, tests/kubefake.py: each Job ends with the check its
    Machine's host gives), reads each check back, deletes each Job, and shows the checks as the local
    dry run shows them."""
    from kubefake import FakeJobs

    from inplace_extension.kubejobs.dry_run import encode_check
    from inplace_extension.kubejobs.spec import AttemptSpec

    local_code, local_out, _ = run_plan(capsys, monkeypatch, tmp_path, SCENARIOS)

    class Cluster(FakeJobs):
        closed = False

        def create_job(self, job: Any, secret: Any) -> bool:
            created = super().create_job(job, secret)
            spec = AttemptSpec.decode(secret["stringData"]["attempt.json"])
            # what check-host in the Job answers: the check play of its one host
            [check] = events_for(SCENARIOS)([DryRun(spec.request, spec.target)], on_host=lambda _: None)
            fake = self.jobs[(job["metadata"]["namespace"], job["metadata"]["name"])]
            fake.finished, fake.termination_message = True, encode_check(check)
            return created

        def close(self) -> None:
            self.closed = True

    cluster = Cluster()
    monkeypatch.setattr("inplace_extension.kube.cluster.connect_attempts", lambda _: cluster)
    code, out, err = run_plan(
        capsys,
        monkeypatch,
        tmp_path,
        SCENARIOS,
        *("--executor", "kubernetes", "--job-image", "example.org/inplace:1", "--job-namespace", "jobs"),
    )
    assert (code, out) == (local_code, local_out) and code == 2, err
    assert len(cluster.deleted) == 2 and not cluster.jobs and not cluster.secrets
    assert cluster.closed
