"""``plan`` agrees with the service: the same objects posted to the real hooks (the app over ASGI) get
the answer plan previewed, UpdateMachine starts the run plan named, and the Kubernetes-aware cluster
side drains before the step plan showed."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import httpx
import pytest
import yaml
from run_deps import run_service

from inplace_extension.app import create_app
from inplace_extension.cli import main
from inplace_extension.inplace.custom import NO_CUSTOM
from inplace_extension.kube.port import ManagementCluster
from inplace_extension.kubeaware.cluster_side import KubeClusterSide
from inplace_extension.runs.model import Progress, ProgressState, RunRequest
from inplace_extension.settings import Settings

from .conftest import FIXTURES, ROOT

pytestmark = pytest.mark.anyio
API = "/hooks.runtime.cluster.x-k8s.io/v1alpha1"
EXAMPLES = ROOT / "examples" / "plan"


class Recorder:
    """An executor that records the run UpdateMachine hands it."""

    def __init__(self) -> None:
        self.requests: list[RunRequest] = []

    async def poll(self, request: RunRequest) -> Progress:
        self.requests.append(request)
        return Progress(ProgressState.IN_PROGRESS, "running", 5)


@pytest.fixture
def planned(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> Callable[..., dict[str, Any]]:
    """``plan ARGS -o json`` in this process (no INPLACE_* setting of the caller's environment)."""
    for name in [name for name in os.environ if name.startswith("INPLACE_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))

    def plan(*args: str) -> dict[str, Any]:
        code = main(["plan", *args, "-o", "json"])
        out, err = capsys.readouterr()
        assert code == 0, err
        document: dict[str, Any] = json.loads(out)
        return document

    return plan


async def post(path: str, body: Any, executor: Recorder | None = None) -> dict[str, Any]:
    app = create_app(Settings(plain_http=True), executor)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://capi.test") as c:
        response = await c.post(f"{API}/{path}", content=json.dumps(body))
    answer: dict[str, Any] = response.json()
    return answer


def split(request: dict[str, Any], tmp_path: Path) -> tuple[Path, Path]:
    """A CanUpdateMachineSet request's current and desired objects as two List files (kubectl's shape)."""
    paths = []
    for side in ("current", "desired"):
        path = tmp_path / f"{side}.yaml"
        path.write_text(
            yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": [*request[side].values()]})
        )
        paths.append(path)
    return paths[0], paths[1]


@pytest.mark.parametrize("fixture", ["5A", "5B"])
async def test_plan_of_the_objects_is_the_can_update_machine_set_answer(
    tmp_path: Path, fixture: str, planned: Callable[..., dict[str, Any]]
) -> None:
    request = json.loads((FIXTURES / "can_update_machine_set" / f"{fixture}.request.json").read_text())
    old, new = split(request, tmp_path)
    preview = planned("--old", str(old), "--new", str(new))
    answer = await post("canupdatemachineset/can-update-machineset", request)
    assert preview["answer"]["status"] == answer["status"]
    assert preview["answer"]["message"] == answer["message"]
    assert preview["answer"]["affectsAvailability"] == answer.get("affectsAvailability")
    assert preview["answer"]["patches"] == sorted(key for key in answer if key.endswith("Patch"))
    rollout = "rollout needed" in answer["message"]
    assert preview["outcome"] == ("rollout" if rollout else "in-place")
    assert [c["inPlace"] for c in preview["changes"]].count(False) == answer["message"].count("no capability")


async def test_plan_of_the_templates_is_what_update_machine_runs_and_where_it_drains(
    planned: Callable[..., dict[str, Any]],
) -> None:
    preview = planned(
        "--old",
        str(EXAMPLES / "capi-old.yaml"),
        "--new",
        str(EXAMPLES / "capi-new.yaml"),
        "--machine",
        "md-0-a",
        "--kube",
    )
    recorder = Recorder()
    answer = await post("updatemachine/update-machine", update_request("md-0-a"), recorder)
    assert answer["status"] == "Success"
    (run,) = recorder.requests
    assert preview["machines"][0]["run"] == run.ident
    assert preview["fingerprint"] == run.fingerprint
    assert [step["capability"] for step in preview["steps"]] == list(run.capabilities)
    # the Kubernetes-aware cluster side (drain --auto) drains right before the step plan named; the
    # drain point reads no cluster (the management port is never called for it)
    side = KubeClusterSide(cast(ManagementCluster, object()), Settings(kube=True), NO_CUSTOM)
    assert preview["drain"]["before"] == side.drain_point(run) == "kubelet_args"
    assert [step["drained"] for step in preview["steps"]] == [False, True, True]


def update_request(name: str) -> dict[str, Any]:
    """What CAPI sends once the MachineSet answer is applied: the Machine with the new template's spec
    and labels; its KubeadmConfig and DockerMachine with the new templates' specs."""
    documents = list(yaml.safe_load_all((EXAMPLES / "capi-new.yaml").read_text()))
    deployment, bootstrap, infrastructure = documents
    template = deployment["spec"]["template"]
    metadata = {"name": name, "namespace": "default", "labels": template["metadata"]["labels"]}
    return {
        "kind": "UpdateMachineRequest",
        "desired": {
            "machine": {
                "apiVersion": "cluster.x-k8s.io/v1beta2",
                "kind": "Machine",
                "metadata": metadata,
                "spec": template["spec"],
            },
            "infrastructureMachine": {
                "apiVersion": infrastructure["apiVersion"],
                "kind": "DockerMachine",
                "metadata": {"name": name, "namespace": "default"},
                "spec": infrastructure["spec"]["template"]["spec"],
            },
            "bootstrapConfig": {
                "apiVersion": bootstrap["apiVersion"],
                "kind": "KubeadmConfig",
                "metadata": {"name": name, "namespace": "default"},
                "spec": bootstrap["spec"]["template"]["spec"],
            },
        },
    }


async def test_a_machine_plan_finds_no_host_for_gets_the_same_failure_from_the_service(
    planned: Callable[..., dict[str, Any]], tmp_path: Path
) -> None:
    inventory = EXAMPLES / "inventory.yaml"
    settings = Settings(
        plain_http=True,
        inventory=inventory,
        allowed_cidrs=["10.77.0.0/16"],
        runs_dir=tmp_path / "runs",
        playbooks_dir=ROOT / "playbooks",
    )
    flags = ("--inventory", str(inventory), "--allowed-cidrs", "10.77.0.0/16", "--machine", "md-0-b")
    preview = planned(
        "--old", str(EXAMPLES / "capi-old.yaml"), "--new", str(EXAMPLES / "capi-new.yaml"), *flags
    )
    host = preview["machines"][0]["host"]
    service = run_service(settings)
    try:
        app = create_app(settings, service)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://capi.test") as client:
            body = json.dumps(update_request("md-0-b"))
            answer = (await client.post(f"{API}/updatemachine/update-machine", content=body)).json()
    finally:
        service.close()
    assert answer["status"] == "Failure"
    assert answer["message"] == f"{host['reason']}: {host['message']}"
    assert host["reason"] == "HostNotFound"


def control_plane_files(request: dict[str, Any], tmp_path: Path) -> tuple[Path, Path]:
    """A KubeadmControlPlane and a DockerMachineTemplate per side that KCP turns into this request."""
    paths = []
    for side in ("current", "desired"):
        objects = request[side]
        labels = objects["machine"]["metadata"]["labels"]
        control_plane = {
            "apiVersion": "controlplane.cluster.x-k8s.io/v1beta2",
            "kind": "KubeadmControlPlane",
            "metadata": {
                "name": labels["cluster.x-k8s.io/control-plane-name"],
                "namespace": "default",
                "labels": {"cluster.x-k8s.io/cluster-name": labels["cluster.x-k8s.io/cluster-name"]},
            },
            "spec": {
                "version": objects["machine"]["spec"]["version"],
                "kubeadmConfigSpec": objects["bootstrapConfig"]["spec"],
            },
        }
        infrastructure = objects["infrastructureMachine"]
        template = {
            "apiVersion": infrastructure["apiVersion"],
            "kind": infrastructure["kind"] + "Template",
            "metadata": {"name": "cp", "namespace": "default"},
            "spec": {"template": {"spec": infrastructure["spec"]}},
        }
        path = tmp_path / f"{side}.yaml"
        path.write_text(yaml.safe_dump_all([control_plane, template]))
        paths.append(path)
    return paths[0], paths[1]


@pytest.mark.parametrize("fixture", ["4A", "4B"])
async def test_plan_of_a_control_plane_is_the_can_update_machine_answer(
    tmp_path: Path, fixture: str, planned: Callable[..., dict[str, Any]]
) -> None:
    request = json.loads((FIXTURES / "can_update_machine" / f"{fixture}.request.json").read_text())
    old, new = control_plane_files(request, tmp_path)
    name = request["desired"]["machine"]["metadata"]["name"]
    preview = planned("--old", str(old), "--new", str(new), "--machine", name)
    answer = await post("canupdatemachine/can-update-machine", request)
    assert preview["answer"]["hook"] == "CanUpdateMachine"
    assert preview["answer"]["status"] == answer["status"]
    assert preview["answer"]["message"] == answer["message"]
    assert preview["answer"]["patches"] == sorted(key for key in answer if key.endswith("Patch"))
    assert preview["answer"]["affectsAvailability"] == answer.get("affectsAvailability")
    if fixture == "4A":  # in place: UpdateMachine with the desired objects runs what plan showed
        recorder = Recorder()
        update = {"kind": "UpdateMachineRequest", "desired": request["desired"]}
        await post("updatemachine/update-machine", update, recorder)
        (run,) = recorder.requests
        assert [step["capability"] for step in preview["steps"]] == list(run.capabilities)
        assert preview["machines"][0]["run"] == run.ident
