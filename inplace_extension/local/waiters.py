"""Calls held until a run ends: a poll near a play's expected end, and the MCM agent between its polls,
wait for the end instead of answering "running" or sleeping (runs/play_time.py).

The worker thread that finishes an entry wakes every asyncio call held for its ident, on that call's own
event loop; the holding call never blocks its loop.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

import anyio

from inplace_extension.local.registry import EntryView


class EndWaiters:
    """Per run ident, the held calls to wake when its entry leaves the registry."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiters: dict[str, list[tuple[asyncio.AbstractEventLoop, asyncio.Event]]] = {}

    async def hold(self, ident: str, seconds: float, view: Callable[[str], EntryView | None]) -> None:
        """Wait until the entry ``ident`` leaves the registry, or ``seconds`` pass; never blocks the loop."""
        loop = asyncio.get_running_loop()
        ended = asyncio.Event()
        waiter = (loop, ended)
        with self._lock:
            self._waiters.setdefault(ident, []).append(waiter)
        try:
            if view(ident) is None:
                return  # it ended between the caller's look and our registration
            with anyio.move_on_after(seconds):
                await ended.wait()
        finally:
            with self._lock:
                waiters = self._waiters.get(ident, [])
                if waiter in waiters:
                    waiters.remove(waiter)
                if not waiters:
                    self._waiters.pop(ident, None)

    def ended(self, ident: str) -> None:
        """Worker thread, after the entry left the registry: wake the calls held in _hold()."""
        with self._lock:
            waiters = list(self._waiters.get(ident, []))
        for loop, ended in waiters:
            if not loop.is_closed():
                loop.call_soon_threadsafe(ended.set)
