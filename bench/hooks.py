"""Benchmark: CanUpdateMachineSet over real HTTP against the running service, next to the framework floor.

Starts two uvicorn subprocesses on loopback: ``inplace-extension serve --plain-http`` and a bare
Starlette endpoint that parses a JSON body and returns it (the floor: what any Python service on this
stack pays). Then, for 1, 8 and 32 concurrent keep-alive clients, posts the same ~8 KB CanUpdateMachineSet
request (fixture 5A) to both and prints p50/p99 latency, throughput, and the p99 ratio against the floor.

    .venv/bin/python bench/hooks.py [--seconds 5] [--clients 1,8,32]

Target (issue #2): at 32 clients p99 <= 1.5x the floor and < 20 ms on 2 cores. The load is bounded in
time and count and goes to 127.0.0.1 only; both servers are stopped by PID at the end.
"""

from __future__ import annotations

import argparse
import asyncio
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
FIXTURE = ROOT / "tests" / "fixtures" / "capi" / "can_update_machine_set" / "5A.request.json"
HOOK_PATH = "/hooks.runtime.cluster.x-k8s.io/v1alpha1/canupdatemachineset/can-update-machineset"
SERVING = re.compile(r"serving http://127\.0\.0\.1:(\d+)")
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

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)  # TCP_NODELAY, see cli._bind
    sock.bind(("127.0.0.1", 0))
    sock.listen(1024)  # listening before the port is announced, as the service does
    print(f"floor: serving http://127.0.0.1:{sock.getsockname()[1]}", flush=True)
    config = uvicorn.Config(floor_app(), log_level="warning", access_log=False)  # type: ignore[arg-type]
    uvicorn.Server(config).run(sockets=[sock])


@contextmanager
def server(argv: list[str]) -> Iterator[int]:
    """Start a server subprocess, yield its port (read from its 'serving' line), stop it by PID."""
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
        yield port
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def _client(port: int, body: bytes, stop_at: float, budget: list[int], latencies: list[float]) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    head = (
        f"POST {HOOK_PATH}?timeout=5s HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"  # no Content-Type, as CAPI sends it
    ).encode()
    try:
        while time.perf_counter() < stop_at and budget[0] > 0:
            budget[0] -= 1
            started = time.perf_counter()
            writer.write(head + body)
            status = await reader.readline()
            length = 0
            while (line := await reader.readline()) not in (b"\r\n", b""):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":", 1)[1])
            await reader.readexactly(length)
            latencies.append(time.perf_counter() - started)
            if not status.startswith(b"HTTP/1.1 200"):
                raise RuntimeError(f"unexpected answer {status!r}")
    finally:
        writer.close()


@dataclass(frozen=True)
class Result:
    p50_ms: float
    p99_ms: float
    rps: float


def summarize(latencies: list[float], elapsed: float) -> Result:
    cuts = statistics.quantiles(latencies, n=100)
    return Result(cuts[49] * 1000, cuts[98] * 1000, len(latencies) / elapsed)


async def measure(port: int, body: bytes, clients: int, seconds: float, latencies: list[float]) -> float:
    """Run ``clients`` keep-alive connections for ``seconds``; append latencies; return the elapsed time."""
    started = time.perf_counter()
    budget = [MAX_REQUESTS_PER_RUN]
    await asyncio.gather(*(_client(port, body, started + seconds, budget, latencies) for _ in range(clients)))
    return time.perf_counter() - started


async def compare(
    ports: dict[str, int], body: bytes, clients: int, seconds: float, rounds: int
) -> dict[str, Result]:
    """Alternate short rounds between the servers, so load from elsewhere on the machine hits both alike."""
    latencies: dict[str, list[float]] = {name: [] for name in ports}
    elapsed = dict.fromkeys(ports, 0.0)
    for port in ports.values():  # warm-up, not counted
        await measure(port, body, clients, 0.5, [])
    for _ in range(rounds):
        for name, port in ports.items():
            elapsed[name] += await measure(port, body, clients, seconds / rounds, latencies[name])
    return {name: summarize(latencies[name], elapsed[name]) for name in ports}


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
    ours_argv = [sys.executable, "-m", "extension", "serve", "--listen", "127.0.0.1:0", "--plain-http"]
    floor_argv = [sys.executable, str(Path(__file__).resolve()), "--floor-server"]
    print(
        f"CanUpdateMachineSet, {len(body)} byte body (fixture 5A), {args.seconds:g} s per server and case "
        f"in {args.rounds} alternating rounds, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}, "
        f"python {sys.version.split()[0]}"
    )
    print(f"{'clients':>7}  {'server':<9} {'p50 ms':>8} {'p99 ms':>8} {'req/s':>8}   p99 ratio")
    worst_ok = True
    with server(ours_argv) as ours_port, server(floor_argv) as floor_port:
        for clients in levels:
            results = asyncio.run(
                compare(
                    {"floor": floor_port, "extension": ours_port}, body, clients, args.seconds, args.rounds
                )
            )
            floor, ours = results["floor"], results["extension"]
            ratio = ours.p99_ms / floor.p99_ms
            print(f"{clients:>7}  {'floor':<9} {floor.p50_ms:>8.2f} {floor.p99_ms:>8.2f} {floor.rps:>8.0f}")
            row = f"{clients:>7}  {'extension':<9} {ours.p50_ms:>8.2f} {ours.p99_ms:>8.2f} {ours.rps:>8.0f}"
            print(f"{row}   {ratio:.2f}x")
            if clients == 32:
                ok = ratio <= 1.5 and ours.p99_ms < 20
                worst_ok = worst_ok and ok
                print(f"target at 32 clients (p99 <= 1.5x floor and < 20 ms): {'met' if ok else 'NOT met'}")
    return 0 if worst_ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
