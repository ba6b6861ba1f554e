"""Hook POSTs through the raw ASGI interface: every message the app sends, a body in several messages."""

from __future__ import annotations

from typing import Any

import pytest
from starlette.types import Message

from inplace_extension.app import create_app
from inplace_extension.settings import Settings

from .asgi_post import post_scope
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
    scope = post_scope(path, body, root_path)
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
async def test_every_hook_answers_200_json_through_the_asgi_interface_also_under_a_root_path(
    hook: str,
) -> None:
    app = create_app(Settings(plain_http=True))
    body = BODIES[hook]
    direct = await _call(app, PATHS[hook], body)
    # behind a proxy that strips a prefix (root_path), the same route answers the same bytes
    proxied = await _call(app, PATHS[hook], body, root_path="/proxy")
    assert direct == proxied
    assert direct[0]["status"] == 200 and direct[1]["body"].startswith(b'{"kind":')


async def test_a_body_in_several_messages_is_read_whole() -> None:
    app = create_app(Settings(plain_http=True))
    body = BODIES["can-update-machineset"]
    assert await _call(app, PATHS["can-update-machineset"], body, chunk=1000) == await _call(
        app, PATHS["can-update-machineset"], body
    )
