"""uvicorn's h11 protocol sending each answer in one write: the status line and headers go with the body.

uvicorn's h11 protocol writes the head of a response on ``http.response.start`` and the body on
``http.response.body``: two ``send()`` calls, so two TCP segments, per answer. On a keep-alive
connection serving small hook answers those system calls are a large share of the server's CPU per
request (bench/hooks.py). :class:`CoalescingH11Protocol` gives the connection a transport that holds
the writes of one event-loop step and hands them to the socket as one write at the end of the step.
Starlette's ``Response`` sends head and body in one step (uvicorn's ``send`` does not yield unless the
socket buffer is full), so an answer leaves in one segment. Order is kept, and nothing is held past
the step: a ``close()`` writes what is held first.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol


class CoalescingTransport:
    """A transport wrapper whose ``write()`` calls within one event-loop step reach the socket as one."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: list[bytes | bytearray | memoryview] = []

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not data:  # h11's end of a Content-Length body is b""
            return
        if not self._held:
            self._loop.call_soon(self.flush)
        self._held.append(data)

    def flush(self) -> None:
        """Write what is held as one write (nothing after the connection started closing, as asyncio)."""
        held, self._held = self._held, []
        if not held or self._transport.is_closing():
            return
        self._transport.write(held[0] if len(held) == 1 else b"".join(held))

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        # everything else (is_closing, get_extra_info, pause_reading, set_protocol, ...) is the socket's
        return getattr(self._transport, name)


class CoalescingH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with the connection's writes coalesced per event-loop step."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)  # type: ignore[arg-type]
        # flow control (pause/resume reading) keeps the real transport; requests write through this one
        self.transport = CoalescingTransport(self.transport, self.loop)  # type: ignore[assignment]
