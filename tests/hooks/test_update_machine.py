"""UpdateMachine: plan -> RunRequest -> executor Progress -> answer; without an executor: Failure."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest

from inplace_extension.errors import InvalidRequest
from inplace_extension.hooks.update_machine import NO_EXECUTOR_MESSAGE, UNEXPECTED_CALL_MESSAGE, to_response
from inplace_extension.inplace.plan import plan_update
from inplace_extension.runs.model import Progress, ProgressState, RunRequest

from .conftest import TOKEN, UPDATE_MACHINE, FakeRuns, load, post

pytestmark = pytest.mark.anyio


async def test_run_request_is_built_from_the_plan_and_machine_metadata() -> None:
    request = load("update_machine/6B.request.json")
    executor = FakeRuns()
    await post(UPDATE_MACHINE, request, executor)
    [run] = executor.requests
    plan = plan_update(request["desired"])
    assert (run.namespace, run.name) == ("default", "my-cluster-md-0-7c9b8d5f4x-hx9tv")
    assert run.fingerprint == plan.fingerprint
    assert run.capabilities == tuple(step.capability for step in plan.steps)
    assert run.capabilities == ("kubeadm_files", "kubelet_args", "kubernetes_version")
    assert dict(run.inputs) == {step.capability: step.inputs for step in plan.steps}
    assert run.labels["cluster.x-k8s.io/set-name"] == "my-cluster-md-0-5d8f6c7b9q"
    assert run.annotations["runtime.cluster.x-k8s.io/pending-hooks"] == "UpdateMachine"
    assert TOKEN not in json.dumps(dict(run.inputs))  # joinConfiguration.discovery is never an input


@pytest.mark.parametrize(
    ("progress", "expected"),
    [
        (
            Progress(ProgressState.IN_PROGRESS, "queued (position 2)", 0),
            {"status": "Success", "message": "queued (position 2)", "retryAfterSeconds": 10},
        ),
        (
            Progress(ProgressState.IN_PROGRESS, "running kubelet_args", 7),
            {"status": "Success", "message": "running kubelet_args", "retryAfterSeconds": 7},
        ),
        (
            Progress(ProgressState.DONE, "update applied", 0),
            {"status": "Success", "message": "update applied", "retryAfterSeconds": 0},
        ),
        (
            Progress(ProgressState.FAILED, "PlaybookFailed: role kubelet_args, task 'Restart kubelet'", 0),
            {
                "status": "Failure",
                "message": "PlaybookFailed: role kubelet_args, task 'Restart kubelet'",
                "retryAfterSeconds": 0,
            },
        ),
    ],
)
async def test_progress_maps_to_the_answer(progress: Progress, expected: dict[str, Any]) -> None:
    answer = await post(UPDATE_MACHINE, load("update_machine/6A.request.json"), FakeRuns(progress))
    assert {k: answer[k] for k in expected} == expected
    assert answer["kind"] == "UpdateMachineResponse"


def test_in_progress_never_answers_zero_retry_even_if_the_default_is_misconfigured() -> None:
    response = to_response(Progress(ProgressState.IN_PROGRESS, "running", 0), default_retry_after=0)
    assert response.retry_after_seconds == 1


async def test_without_executor_the_answer_is_a_failure_not_a_fake_success() -> None:
    answer = await post(UPDATE_MACHINE, load("update_machine/6A.request.json"))
    assert answer == {
        "kind": "UpdateMachineResponse",
        "apiVersion": "hooks.runtime.cluster.x-k8s.io/v1alpha1",
        "status": "Failure",
        "message": NO_EXECUTOR_MESSAGE,
        "retryAfterSeconds": 0,
    }


async def test_disabled_in_place_updates_answer_like_capis_reference_extension() -> None:
    request = load("update_machine/6A.request.json")
    request["settings"]["disableInPlaceUpdates"] = "true"
    executor = FakeRuns()
    answer = await post(UPDATE_MACHINE, request, executor)
    assert (answer["status"], answer["message"]) == ("Failure", UNEXPECTED_CALL_MESSAGE)
    assert executor.requests == []


async def test_an_invalid_desired_value_is_a_failure_naming_its_path() -> None:
    request = load("update_machine/6A.request.json")
    request["desired"]["machine"]["spec"]["version"] = "latest-and-greatest"
    executor = FakeRuns()
    answer = await post(UPDATE_MACHINE, request, executor)
    assert answer["status"] == "Failure"
    assert answer["message"].startswith("InvalidRequest: desired.machine.spec.version: ")
    assert "latest-and-greatest" not in answer["message"]
    assert executor.requests == []


class RefusingExecutor:
    async def poll(self, request: RunRequest) -> Progress:
        raise InvalidRequest("desired.machine.metadata.annotations", "refused here")


async def test_known_executor_errors_become_their_failure_message() -> None:
    answer = await post(UPDATE_MACHINE, load("update_machine/6A.request.json"), RefusingExecutor())
    assert answer["status"] == "Failure"
    assert answer["message"] == "InvalidRequest: desired.machine.metadata.annotations: refused here"


@pytest.mark.parametrize("fixture", ["update_machine/6A.request.json", "update_machine/6B.request.json"])
async def test_bootstrap_tokens_never_reach_answers_or_logs(
    fixture: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    request = load(fixture)
    assert TOKEN in json.dumps(request)
    for executor in (FakeRuns(), None):
        answer = await post(UPDATE_MACHINE, request, executor, log_level="DEBUG")
        assert TOKEN not in json.dumps(answer)
    assert TOKEN not in caplog.text
    assert "hook=UpdateMachine machine=default/" in caplog.text
