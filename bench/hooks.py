"""Benchmark: CanUpdateMachineSet over real HTTP against the running service, next to the framework floor.

Starts two uvicorn subprocesses on loopback: ``inplace-extension serve --plain-http`` and a bare
Starlette endpoint that parses a JSON body and returns it (the floor: what any Python service on this
stack pays), both with the same uvicorn settings. Then, for 1, 8 and 32 concurrent keep-alive clients,
posts the same ~8 KB CanUpdateMachineSet request (fixture 5A) to both and prints p50/p99 latency,
throughput, the server's CPU time per request (user + system, from /proc) and the p99 ratio against the
floor. Both servers get the same client (one cheap asyncio protocol per connection, in this process),
a warm-up, and short measured rounds that alternate between them, in alternating order.

    .venv/bin/python bench/hooks.py [--seconds 5] [--clients 1,8,32]

Target (issue #2): at 32 clients p99 <= 1.5x the floor and < 20 ms on 2 cores. The load is bounded in
time and count and goes to 127.0.0.1 only; both servers are stopped by PID at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the service's command line, as the tests start it

from e2e.service import loopback_serve_argv  # noqa: E402
from hostlab.proc import stop_child  # noqa: E402

FIXTURE = ROOT / "tests" / "fixtures" / "capi" / "can_update_machine_set" / "5A.request.json"
HOOK_PATH = "/hooks.runtime.cluster.x-k8s.io/v1alpha1/canupdatemachineset/can-update-machineset"
SERVING = re.compile(r"serving http://127\.0\.0\.1:(\d+)")
CONTENT_LENGTH = re.compile(rb"(?i)\r\ncontent-length:\s*(\d+)")
MAX_REQUESTS_PER_RUN = 200_000  # a hard bound on the load, whatever --seconds says


def floor_app() -> object:
    """The framework floor: Starlette + uvicorn, parse the JSON body, serialize it back."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    async def echo(request: Request) -> Response:
        document = json.loads(await request.body())
        return Response(json.dumps(document), media_type="application/json")

    return Starlette(routes=[Route(HOOK_PATH, echo, methods=["POST"])])


def serve_floor() -> None:
    import socket

    import uvicorn

    # TCP, so that asyncio turns Nagle off, as cli.serve.bind does
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    sock.listen(1024)  # listening before the port is announced, as the service does
    print(f"floor: serving http://127.0.0.1:{sock.getsockname()[1]}", flush=True)
    # the same uvicorn settings as ``inplace-extension serve`` (cli.serve.run), start-up objects frozen alike
    config = uvicorn.Config(
        floor_app(),  # type: ignore[arg-type]
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=5,
        server_header=False,
    )
    gc.collect()
    gc.freeze()
    uvicorn.Server(config).run(sockets=[sock])


@dataclass(frozen=True)
class Server:
    pid: int
    port: int

    def cpu_seconds(self) -> float:
        """CPU time (user + system) the server process has used so far, from /proc (Linux)."""
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextmanager
def server(argv: list[str]) -> Iterator[Server]:
    """Start a server subprocess, yield it with its port (read from its 'serving' line), stop it by PID."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=ROOT)
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 30
        port = None
        while port is None and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line and proc.poll() is not None:
                raise RuntimeError(f"{argv[0]} exited with {proc.returncode} before serving")
            match = SERVING.search(line)
            port = int(match.group(1)) if match else None
        if port is None:
            raise RuntimeError("server did not report its port within 30 s")
        yield Server(proc.pid, port)
    finally:
        stop_child(proc, 10)


class _Connection(asyncio.Protocol):
    """One keep-alive client connection, kept cheap (the client shares the 2 cores with the server):
    a plain asyncio protocol that completes a future per whole answer, no stream reader layers."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.expected = -1  # length of the whole answer once its header block is in, else -1
        self.answer: asyncio.Future[bytes] | None = None
        self.lost = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if self.expected < 0:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            # both servers answer with Content-Length
            match = CONTENT_LENGTH.search(self.buffer, 0, end + 2)
            if not self.buffer.startswith(b"HTTP/1.1 200") or match is None:
                self._finish(RuntimeError(f"unexpected answer {bytes(self.buffer[:200])!r}"))
                return
            self.expected = end + 4 + int(match.group(1))
        if len(self.buffer) >= self.expected:
            del self.buffer[: self.expected]
            self.expected = -1
            self._finish(None)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self._finish(exc or ConnectionError("server closed the connection"))

    def _finish(self, problem: Exception | None) -> None:
        if self.answer is not None and not self.answer.done():
            if problem is None:
                self.answer.set_result(b"")
            else:
                self.answer.set_exception(problem)

    async def ask(self, request: bytes) -> None:
        assert self.transport is not None
        if self.lost:
            raise ConnectionError("server closed the connection")
        self.answer = asyncio.get_running_loop().create_future()
        self.transport.write(request)
        await self.answer


async def _client(port: int, body: bytes, stop_at: float, budget: list[int], latencies: list[float]) -> None:
    _, connection = await asyncio.get_running_loop().create_connection(_Connection, "127.0.0.1", port)
    request = (
        f"POST {HOOK_PATH}?timeout=5s HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"  # no Content-Type, as CAPI sends it
    ).encode() + body
    try:
        while time.perf_counter() < stop_at and budget[0] > 0:
            budget[0] -= 1
            started = time.perf_counter()
            await connection.ask(request)
            latencies.append(time.perf_counter() - started)
    finally:
        assert connection.transport is not None
        connection.transport.close()


@dataclass(frozen=True)
class Result:
    p50_ms: float
    p99_ms: float
    rps: float
    cpu_ms: float  # server CPU time (user + system) per answered request


def summarize(latencies: list[float], elapsed: float, cpu: float) -> Result:
    cuts = statistics.quantiles(latencies, n=100)
    return Result(cuts[49] * 1000, cuts[98] * 1000, len(latencies) / elapsed, cpu / len(latencies) * 1000)


async def measure(port: int, body: bytes, clients: int, seconds: float, latencies: list[float]) -> float:
    """Run ``clients`` keep-alive connections for ``seconds``; append latencies; return the elapsed time."""
    started = time.perf_counter()
    budget = [MAX_REQUESTS_PER_RUN]
    await asyncio.gather(*(_client(port, body, started + seconds, budget, latencies) for _ in range(clients)))
    return time.perf_counter() - started


async def compare(
    servers: dict[str, Server], body: bytes, clients: int, seconds: float, rounds: int
) -> dict[str, Result]:
    """Alternate short rounds between the servers, so load from elsewhere on the machine hits both alike."""
    latencies: dict[str, list[float]] = {name: [] for name in servers}
    elapsed = dict.fromkeys(servers, 0.0)
    cpu = dict.fromkeys(servers, 0.0)
    for each in servers.values():  # warm-up, not counted
        await measure(each.port, body, clients, 1.0, [])
    for round_number in range(rounds):
        # alternate the order too, so neither server always runs right after the other
        order = list(servers.items()) if round_number % 2 == 0 else list(reversed(servers.items()))
        for name, each in order:
            before = each.cpu_seconds()
            elapsed[name] += await measure(each.port, body, clients, seconds / rounds, latencies[name])
            cpu[name] += each.cpu_seconds() - before
    return {name: summarize(latencies[name], elapsed[name], cpu[name]) for name in servers}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=5.0, help="measured seconds per case [5]")
    parser.add_argument("--clients", default="1,8,32", help="concurrency levels [1,8,32]")
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds per case [5]")
    parser.add_argument("--floor-server", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.floor_server:
        serve_floor()
        return 0
    body = FIXTURE.read_bytes()
    levels = [int(part) for part in args.clients.split(",")]
    ours_argv = loopback_serve_argv()
    floor_argv = [sys.executable, str(Path(__file__).resolve()), "--floor-server"]
    print(
        f"CanUpdateMachineSet, {len(body)} byte body (fixture 5A), {args.seconds:g} s per server and case "
        f"in {args.rounds} alternating rounds, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}, "
        f"python {sys.version.split()[0]}"
    )
    header = f"{'clients':>7}  {'server':<9} {'p50 ms':>8} {'p99 ms':>8} {'req/s':>8} {'CPU ms/req':>10}"
    print(f"{header}   p99 ratio")
    worst_ok = True
    with server(ours_argv) as ours_server, server(floor_argv) as floor_server:
        for clients in levels:
            results = asyncio.run(
                compare(
                    {"floor": floor_server, "extension": ours_server},
                    body,
                    clients,
                    args.seconds,
                    args.rounds,
                )
            )
            floor, ours = results["floor"], results["extension"]
            ratio = ours.p99_ms / floor.p99_ms
            for name, result in (("floor", floor), ("extension", ours)):
                row = (
                    f"{clients:>7}  {name:<9} {result.p50_ms:>8.2f} {result.p99_ms:>8.2f} "
                    f"{result.rps:>8.0f} {result.cpu_ms:>10.3f}"
                )
                print(f"{row}   {ratio:.2f}x" if result is ours else row)
            if clients == 32:
                ok = ratio <= 1.5 and ours.p99_ms < 20
                worst_ok = worst_ok and ok
                print(f"target at 32 clients (p99 <= 1.5x floor and < 20 ms): {'met' if ok else 'NOT met'}")
    return 0 if worst_ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
