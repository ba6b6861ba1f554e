"""HookRoutes, the short path of hook POSTs: the same bytes as Starlette's route, and its 500 for a bug."""

from __future__ import annotations

from typing import Any

import pytest
from starlette.responses import Response
from starlette.types import Message, Receive, Scope

from inplace_extension.app import HookRoutes, create_app
from inplace_extension.settings import Settings

from .conftest import PATHS, fixture_bytes

pytestmark = pytest.mark.anyio

BODIES = {
    "can-update-machineset": fixture_bytes("can_update_machine_set/5A.request.json"),
    "can-update-machine": fixture_bytes("can_update_machine/4A.request.json"),
    "discovery": b"{}",
    "update-machine": b'{"desired": 3}',  # hostile: still a 200 Failure naming the field
}


async def _call(app: Any, path: str, body: bytes, root_path: str = "", chunk: int = 0) -> list[Message]:
    """One POST straight through the ASGI interface: every message the app sends, in order."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": root_path + path,
        "raw_path": (root_path + path).encode(),
        "root_path": root_path,
        "query_string": b"timeout=10s",
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 2),
        "state": {},
        "headers": [(b"host", b"x"), (b"content-length", str(len(body)).encode())],
    }
    parts = [body[i : i + chunk] for i in range(0, len(body), chunk)] if chunk else [body]
    pending = [
        {"type": "http.request", "body": part, "more_body": i < len(parts) - 1}
        for i, part in enumerate(parts)
    ]
    sent: list[Message] = []

    async def receive() -> Message:
        return pending.pop(0) if pending else {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        sent.append(message)

    await app(scope, receive, send)
    return sent


@pytest.mark.parametrize("hook", sorted(BODIES))
async def test_the_short_path_answers_what_the_starlette_route_answers(hook: str) -> None:
    app = create_app(Settings(plain_http=True))
    body = BODIES[hook]
    short = await _call(app, PATHS[hook], body)
    # under a root_path the request is not the short path's: Starlette's route for the hook answers it
    routed = await _call(app, PATHS[hook], body, root_path="/proxy")
    assert short == routed
    assert short[0]["status"] == 200 and short[1]["body"].startswith(b'{"kind":')


async def test_a_body_in_several_messages_is_read_whole() -> None:
    app = create_app(Settings(plain_http=True))
    body = BODIES["can-update-machineset"]
    assert await _call(app, PATHS["can-update-machineset"], body, chunk=1000) == await _call(
        app, PATHS["can-update-machineset"], body
    )


async def test_an_endpoint_that_raises_gets_starlettes_500_and_the_error_goes_on() -> None:
    async def broken(scope: Scope, receive: Receive) -> Response:
        raise RuntimeError("a bug")

    routes = HookRoutes({"/hook": broken})
    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    async def receive() -> Message:
        return {"type": "http.request", "body": b"{}", "more_body": False}

    with pytest.raises(RuntimeError, match="a bug"):  # uvicorn logs it, as after Starlette's 500
        await routes({"type": "http", "method": "POST", "path": "/hook", "headers": []}, receive, send)
    assert sent[0]["status"] == 500 and sent[1]["body"] == b"Internal Server Error"


def test_only_posts_to_a_hook_path_take_the_short_path() -> None:
    async def endpoint(scope: Scope, receive: Receive) -> Response:
        return Response(b"{}")

    routes = HookRoutes({"/hook": endpoint})
    http = {"type": "http", "method": "POST", "path": "/hook", "root_path": ""}
    assert routes.serves(http)
    assert not routes.serves({**http, "method": "GET"})  # Starlette's 405
    assert not routes.serves({**http, "path": "/hook/"})  # Starlette's redirect or 404
    assert not routes.serves({**http, "root_path": "/proxy"})
    assert not routes.serves({**http, "type": "websocket"})
