"""Running the MCM agent in-process for tests: a thread with its own event loop, a scripted executor, and
a forwarder to the API server that can stall new connections."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import Callable
from pathlib import Path

from inplace_extension.kube.cluster import connect_control, connect_target
from inplace_extension.mcm.agent import Agent, AgentOptions
from inplace_extension.mcm.metrics import AgentMetrics
from inplace_extension.metrics import Metrics
from inplace_extension.runs.model import Progress, ProgressState, RunRequest


class ScriptedRuns:
    """Answers polls with ``answer(request, calls so far for this ident)``; records every request."""

    def __init__(self, answer: Callable[[RunRequest, int], Progress]) -> None:
        self.answer = answer
        self.requests: list[RunRequest] = []
        self.released: set[str] = set()  # Nodes whose scripted trouble the test has ended
        self._lock = threading.Lock()

    async def poll(self, request: RunRequest) -> Progress:
        with self._lock:
            count = sum(1 for r in self.requests if r.ident == request.ident)
            self.requests.append(request)
        return self.answer(request, count)

    async def held(self, request: RunRequest) -> Progress | None:
        """A request's hold (the pause annotation the agent read) as the run service answers it
        (tests/runs/test_service.py checks the service's own)."""
        if request.hold is not None and request.hold.cancel:
            return Progress(ProgressState.FAILED, request.hold.message, cancelled=True)
        if request.hold is not None:
            return Progress(ProgressState.IN_PROGRESS, request.hold.message, 30, waiting="pause")
        return None

    async def wait_end(self, request: RunRequest, seconds: float) -> bool:
        """Scripted answers have no play in flight (they never say ``in_flight``, unless a test's do and
        it overrides this): nothing to wait for."""
        return True

    def seen(self, node: str) -> list[RunRequest]:
        with self._lock:
            return [r for r in self.requests if r.name == node]

    def nodes(self) -> set[str]:
        """The Nodes this executor was asked to update."""
        with self._lock:
            return {r.name for r in self.requests}


class AgentThread:
    """The agent on its own loop in a thread; ``stop`` cancels it (and the agent closes its clients)."""

    def __init__(self, kubeconfig: Path, options: AgentOptions, runs: ScriptedRuns) -> None:
        self.metrics = Metrics()
        self._kubeconfig = kubeconfig
        self._options = options
        self._runs = runs
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self.agent: Agent | None = None
        self._task: asyncio.Task[None] | None = None
        self._thread = threading.Thread(target=self._main, name="mcm-agent", daemon=True)
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError("the agent thread did not start")

    def _main(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._run())

    async def _run(self) -> None:
        target = connect_target(self._kubeconfig)
        control = connect_control(self._kubeconfig)
        self.agent = Agent(self._options, target, control, self._runs, AgentMetrics(self.metrics))
        self._task = asyncio.create_task(self.agent.run())
        self._ready.set()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task  # a stopped agent closes its clients itself

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    @property
    def connected(self) -> bool:
        return self.agent is not None and self.agent.connected.is_set()

    def stop(self) -> None:
        if self._loop.is_closed():
            return  # stopped already
        if self._task is not None:
            self._loop.call_soon_threadsafe(self._task.cancel)
        self._thread.join(30)
        if not self._thread.is_alive():
            self._loop.close()


class StallingForwarder:
    """A TCP forwarder to ``port`` on 127.0.0.1; after :meth:`stall`, new connections are accepted and
    never answered (their TLS handshake hangs, as towards an overloaded API server)."""

    def __init__(self, port: int) -> None:
        self._port = port
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._server.getsockname()[1])
        self._stalled = threading.Event()
        self.held: list[socket.socket] = []  # the stalled connections
        self._open: list[socket.socket] = []
        threading.Thread(target=self._accept, name="forwarder", daemon=True).start()

    def stall(self) -> None:
        self._stalled.set()

    def open_held(self) -> int:
        """How many stalled connections the client has not closed (no end of stream after what it sent)."""
        still_open = 0
        for sock in list(self.held):
            sock.setblocking(False)
            try:
                while sock.recv(65536):
                    pass  # the client's TLS hello
            except BlockingIOError:
                still_open += 1  # nothing more, and no end of stream: the client's socket is open
            except OSError:
                pass  # reset by the client: closed
        return still_open

    def close(self) -> None:
        for sock in [self._server, *self.held, *self._open]:
            sock.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return  # closed
            if self._stalled.is_set():
                self.held.append(client)
                continue
            upstream = socket.create_connection(("127.0.0.1", self._port))
            self._open += [client, upstream]
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=_pipe, args=(source, sink), daemon=True).start()


def _pipe(source: socket.socket, sink: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while data := source.recv(65536):
            sink.sendall(data)
    with contextlib.suppress(OSError):
        sink.shutdown(socket.SHUT_WR)
