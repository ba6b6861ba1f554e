"""The HTTP edge: paths, methods, always-200 answers, the body cap, hostile bodies, bugs -> InternalError."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator

import httpx
import pytest

from inplace_extension.app import create_app
from inplace_extension.errors import INTERNAL_ERROR_MESSAGE
from inplace_extension.runs.model import Progress, RunRequest
from inplace_extension.settings import Settings

from .conftest import PATHS, client_for, fixture_bytes, fixture_json

pytestmark = pytest.mark.anyio

HOOK_PATHS = [PATHS["can-update-machine"], PATHS["can-update-machineset"], PATHS["update-machine"]]


async def test_discovery_answers_the_explicit_example_when_called_as_capi_does(
    client: httpx.AsyncClient,
) -> None:
    # CAPI: POST, no Content-Type, ?timeout= appended (docs/capi-hooks.md §1.2)
    reply = await client.post(
        PATHS["discovery"] + "?timeout=10s", content=fixture_bytes("discovery/request.json")
    )
    assert reply.status_code == 200
    assert reply.json() == fixture_json("discovery/response.explicit.json")


async def test_hooks_are_served_under_the_configured_prefix_only() -> None:
    async with client_for(Settings(plain_http=True, path_prefix="/ext/")) as c:
        served = await c.post("/ext" + PATHS["discovery"], content=b"{}")
        assert served.status_code == 200
        assert served.json()["status"] == "Success"
        assert (await c.post(PATHS["discovery"], content=b"{}")).status_code == 404


async def test_unknown_path_is_404_and_wrong_method_is_405(client: httpx.AsyncClient) -> None:
    assert (await client.post(f"{PATHS['discovery']}/extra", content=b"{}")).status_code == 404
    assert (
        await client.post(PATHS["can-update-machine"].replace("can-update-machine", "other"))
    ).status_code == 404
    for method in ("GET", "PUT", "DELETE"):
        reply = await client.request(method, PATHS["update-machine"])
        assert reply.status_code == 405
        assert reply.json()["message"].startswith("MethodNotAllowed")


async def test_probes_answer_get(client: httpx.AsyncClient) -> None:
    assert (await client.get("/healthz")).json() == {"status": "ok"}
    ready = (await client.get("/readyz")).json()
    assert ready["status"] == "ready"
    assert ready["executor"] is False
    assert PATHS["update-machine"] in ready["hooks"]


async def test_metrics_count_hook_answers_by_status(client: httpx.AsyncClient) -> None:
    await client.post(PATHS["discovery"], content=b"{}")
    await client.post(PATHS["can-update-machine"], content=b"nope")
    text = (await client.get("/metrics")).text
    assert 'inplace_extension_hook_calls_total{hook="Discovery",status="Success"} 1.0' in text
    assert 'inplace_extension_hook_calls_total{hook="CanUpdateMachine",status="Failure"} 1.0' in text


@pytest.mark.parametrize("path", HOOK_PATHS)
@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b"", "InvalidRequest: (body): invalid JSON"),
        (b"not json", "InvalidRequest: (body): invalid JSON"),
        (b"[]", "InvalidRequest: (body): must be a JSON object"),
        (b'[{"current": {}}]', "InvalidRequest: (body): must be a JSON object"),
        (b"[" * 10_000 + b"]" * 10_000, "InvalidRequest: (body): invalid JSON: recursion limit"),
        (b'{"current": "\x00"}', "InvalidRequest: (body): invalid JSON"),
        (b'{"kind": "\xc3\x28"}', "InvalidRequest: (body): invalid JSON"),
        (b'{"settings": {"a": 1e999}}', "InvalidRequest: settings.a: number out of range"),
        (
            b'{"settings": {"a": 123456789012345678901234567890}}',
            "InvalidRequest: settings.a: must be a string",
        ),
        (b'{"current": 5, "desired": 5}', "InvalidRequest: "),
    ],
)
async def test_hostile_bodies_get_200_failure_naming_the_field(
    client: httpx.AsyncClient, path: str, body: bytes, expected: str
) -> None:
    reply = await client.post(path, content=body)
    assert reply.status_code == 200
    answer = reply.json()
    assert answer["status"] == "Failure"
    assert answer["message"].startswith(expected)
    if path == PATHS["update-machine"]:
        assert answer["retryAfterSeconds"] == 0


async def test_body_over_the_cap_is_413_from_content_length() -> None:
    async with client_for(Settings(plain_http=True, max_body_bytes=1000)) as c:
        reply = await c.post(PATHS["discovery"], content=b" " * 1001)
        assert reply.status_code == 413
        assert reply.json()["message"] == "RequestTooLarge: request body exceeds 1000 bytes"
        assert (await c.post(PATHS["discovery"], content=b"{}" + b" " * 998)).status_code == 200


async def test_body_over_the_cap_is_refused_before_it_is_all_read_when_chunked() -> None:
    sent: list[int] = []

    async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: a chunked upload
        for _ in range(100):
            sent.append(1)
            yield b" " * 1000

    async with client_for(Settings(plain_http=True, max_body_bytes=5000)) as c:
        reply = await c.post(PATHS["update-machine"], content=chunks())
    assert reply.status_code == 413
    assert len(sent) < 100  # the app stopped pulling the body at the cap


async def test_a_25_mib_body_is_413_at_the_default_cap(client: httpx.AsyncClient) -> None:
    reply = await client.post(
        PATHS["can-update-machineset"], content=b"[" + b"0," * (25 * 1024 * 1024 // 2) + b"0]"
    )
    assert reply.status_code == 413


async def test_a_body_just_under_the_cap_is_parsed_and_answered(client: httpx.AsyncClient) -> None:
    # about 19 MiB of valid JSON that does not fit the model: parsed off the event loop, answered 200
    body = json.dumps({"current": {"machine": {"x": "y" * (19 * 1024 * 1024)}}}).encode()
    reply = await client.post(PATHS["can-update-machine"], content=body)
    assert reply.status_code == 200
    assert reply.json()["message"].startswith("InvalidRequest: current.machine.kind: missing")


class ExplodingExecutor:
    async def poll(self, request: RunRequest) -> Progress:
        raise RuntimeError("disk on fire at /var/secret/path")


async def test_an_unexpected_exception_is_200_internal_error_and_a_logged_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    async with client_for(Settings(plain_http=True), ExplodingExecutor()) as c:
        reply = await c.post(PATHS["update-machine"], content=fixture_bytes("update_machine/6A.request.json"))
    assert reply.status_code == 200
    assert reply.json() == {
        "kind": "UpdateMachineResponse",
        "apiVersion": "hooks.runtime.cluster.x-k8s.io/v1alpha1",
        "status": "Failure",
        "message": INTERNAL_ERROR_MESSAGE,
        "retryAfterSeconds": 0,
    }
    assert "/var/secret/path" not in reply.text
    records = [r for r in caplog.records if r.exc_info]
    assert records, "the bug must be logged with its traceback"
    assert "hook=UpdateMachine decision=failure reason=InternalError" in records[0].getMessage()


async def test_a_wrong_path_is_404_listing_the_hook_paths() -> None:
    async with client_for(Settings(plain_http=True, path_prefix="/ext")) as c:
        reply = await c.post(PATHS["can-update-machine"], content=b"{}")  # the prefix is missing
    assert reply.status_code == 404
    message = reply.json()["message"]
    assert message.startswith("NotFound: Not Found; the hook paths are ")
    assert message.endswith(", ".join("/ext" + PATHS[name] for name in PATHS))


@pytest.mark.parametrize(
    ("fixture", "posted_to", "expected"),
    [
        (
            "can_update_machine_set/5A.request.json",
            "can-update-machine",
            "InvalidRequest: kind: this is a CanUpdateMachineSet request "
            "(its kind CanUpdateMachineSetRequest), "
            f"not CanUpdateMachine; post it to {PATHS['can-update-machineset']}",
        ),
        (
            "can_update_machine/4A.request.json",
            "update-machine",
            "InvalidRequest: kind: this is a CanUpdateMachine request (its kind CanUpdateMachineRequest), "
            f"not UpdateMachine; post it to {PATHS['can-update-machine']}",
        ),
    ],
)
async def test_a_body_of_another_hook_says_which_hook_it_is_for(
    client: httpx.AsyncClient, fixture: str, posted_to: str, expected: str
) -> None:
    reply = await client.post(PATHS[posted_to], content=fixture_bytes(fixture))
    assert reply.status_code == 200
    assert reply.json()["message"] == expected


async def test_a_body_of_another_hook_without_kind_is_told_by_its_objects(client: httpx.AsyncClient) -> None:
    body = fixture_json("can_update_machine_set/5A.request.json")
    del body["kind"]
    reply = await client.post(PATHS["can-update-machine"], content=json.dumps(body).encode())
    assert reply.json()["message"] == (
        "InvalidRequest: (body): this is a CanUpdateMachineSet request (its desired.machineSet), "
        f"not CanUpdateMachine; post it to {PATHS['can-update-machineset']}"
    )
    # a body for this hook that is only incomplete still names its field
    own = fixture_json("can_update_machine/4A.request.json")
    del own["desired"]["machine"]["metadata"]
    reply = await client.post(PATHS["can-update-machine"], content=json.dumps(own).encode())
    assert reply.json()["message"].startswith("InvalidRequest: desired.machine.metadata: missing")


async def test_readyz_says_when_updatemachine_cannot_reach_any_host() -> None:
    class Idle:
        async def poll(self, request: RunRequest) -> Progress:
            raise AssertionError("not called")

    problem = "UpdateMachine cannot reach any host: no --allowed-cidrs"
    app = create_app(Settings(plain_http=True), Idle(), hosts_problem=lambda: problem)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        ready = await c.get("/readyz")
    assert ready.status_code == 200  # CanUpdate* and Discovery still work
    assert ready.json()["updates"] == problem
