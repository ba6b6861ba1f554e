"""CoalescingH11Protocol: each answer reaches the socket in one write, in order, and nothing is held back."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from uvicorn.server import ServerState

from inplace_extension.transport import CoalescingH11Protocol, CoalescingTransport

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class RecordingTransport(asyncio.Transport):
    """What the socket would be handed: every write() call, and whether it was closed."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: Any) -> None:
        assert not self.closed, "write after close"
        self.writes.append(bytes(data))

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 5000), "sockname": ("127.0.0.1", 8443)}.get(name, default)

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


async def _settle() -> None:
    for _ in range(10):  # a few loop steps: the request task, then the held writes
        await asyncio.sleep(0)


async def test_writes_of_one_loop_step_reach_the_socket_as_one_write_in_order() -> None:
    real = RecordingTransport()
    transport = CoalescingTransport(real, asyncio.get_running_loop())
    transport.write(b"head;")
    transport.write(b"")  # h11's end of a Content-Length body
    transport.write(bytearray(b"body"))
    assert real.writes == []  # held until the end of this step
    await _settle()
    assert real.writes == [b"head;body"]
    transport.write(b"next")
    await _settle()
    assert real.writes == [b"head;body", b"next"]


async def test_close_writes_what_is_held_first_and_nothing_is_written_after() -> None:
    real = RecordingTransport()
    transport = CoalescingTransport(real, asyncio.get_running_loop())
    transport.write(b"last answer")
    transport.close()
    assert real.writes == [b"last answer"] and real.closed
    transport.write(b"too late")
    await _settle()  # the held write is dropped, as asyncio drops writes to a closing socket
    assert real.writes == [b"last answer"]
    assert transport.is_closing()  # everything else is the real transport's


async def test_an_answer_leaves_in_one_write_on_a_keep_alive_connection() -> None:
    async def echo(request: Request) -> Response:
        return Response(b'{"got":' + await request.body() + b"}", media_type="application/json")

    app = Starlette(routes=[Route("/hook", echo, methods=["POST"])])
    config = uvicorn.Config(app, lifespan="off", access_log=False, server_header=False, date_header=False)
    protocol = CoalescingH11Protocol(config, ServerState(), {}, _loop=asyncio.get_running_loop())
    real = RecordingTransport()
    protocol.connection_made(real)
    request = b"POST /hook HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n"
    for body in (b"12", b"34"):  # two requests on the same connection
        protocol.data_received(request + body)
        await _settle()
    assert real.writes == [
        b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\ncontent-type: application/json\r\n\r\n"
        + b'{"got":'
        + body
        + b"}"
        for body in (b"12", b"34")
    ]
    protocol.connection_lost(None)
