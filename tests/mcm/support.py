"""Running the MCM agent in-process for tests: a thread with its own event loop, a scripted executor."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from pathlib import Path

from inplace_extension.kube.cluster import connect_control, connect_target
from inplace_extension.mcm.agent import Agent, AgentOptions
from inplace_extension.mcm.metrics import AgentMetrics
from inplace_extension.metrics import Metrics
from inplace_extension.runs.model import Progress, RunRequest


class ScriptedExecutor:
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

    def seen(self, node: str) -> list[RunRequest]:
        with self._lock:
            return [r for r in self.requests if r.name == node]

    def nodes(self) -> set[str]:
        """The Nodes this executor was asked to update."""
        with self._lock:
            return {r.name for r in self.requests}


class AgentThread:
    """The agent on its own loop in a thread; ``stop`` cancels it and closes its clients."""

    def __init__(self, kubeconfig: Path, options: AgentOptions, executor: ScriptedExecutor) -> None:
        self.metrics = Metrics()
        self._kubeconfig = kubeconfig
        self._options = options
        self._executor = executor
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
        self.agent = Agent(self._options, target, control, self._executor, AgentMetrics(self.metrics))
        self._task = asyncio.create_task(self.agent.run())
        self._ready.set()
        try:
            await self._task
        except asyncio.CancelledError:
            pass
        finally:
            # What asyncio.run does on exit, before the clients close: the agent's per-Node tasks are
            # cancelled and its watch streams (async generators) finalized, so no connection is left open
            # for the garbage collector to warn about.
            leftover = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in leftover:
                task.cancel()
            await asyncio.gather(*leftover, return_exceptions=True)
            await self._loop.shutdown_asyncgens()
            await target.close()
            await control.close()

    @property
    def connected(self) -> bool:
        return self.agent is not None and self.agent.connected.is_set()

    def stop(self) -> None:
        if self._task is not None:
            self._loop.call_soon_threadsafe(self._task.cancel)
        self._thread.join(30)
        if not self._thread.is_alive():
            self._loop.close()
