"""The ``mcm-agent`` process: the engine (built as ``serve`` builds it), two cluster clients, the agent,
and a small plain-HTTP server for ``/healthz`` (200 while the Node watch is connected) and ``/metrics``.

Its flags are parsed by the CLI (``inplace_extension.cli``), which hands over the settings and the
agent's options.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from dataclasses import dataclass
from pathlib import Path

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from inplace_extension.capabilities_file import FileConfig
from inplace_extension.engine import Records, build_engine, load_config, refuse_url_checks
from inplace_extension.kube.cluster import connect_control, connect_objects, connect_target
from inplace_extension.kubeaware.object_checks import ObjectChecks
from inplace_extension.logs import configure_logging
from inplace_extension.mcm.agent import Agent, AgentOptions
from inplace_extension.mcm.metrics import AgentMetrics
from inplace_extension.metrics import Metrics
from inplace_extension.runs.model import NO_CLUSTER_SIDE, NO_OBJECT_HEALTH, ObjectHealth
from inplace_extension.settings import Settings

log = logging.getLogger(__name__)


def http_app(agent: Agent, metrics: Metrics) -> Starlette:
    async def healthz(request: Request) -> Response:
        if agent.connected.is_set():
            return PlainTextResponse("ok\n")
        return PlainTextResponse("node watch not connected\n", status_code=503)

    return Starlette(routes=[Route("/healthz", healthz), Route("/metrics", metrics.endpoint)])


@dataclass(frozen=True)
class Clusters:
    """Where the agent's two clients connect: a kubeconfig each (``None``: the in-cluster account)."""

    target: Path | None  # the cluster with the Nodes
    control: Path | None  # MCM's cluster (the target's when not given)


async def serve(
    settings: Settings,
    options: AgentOptions,
    clusters: Clusters,
    sock: socket.socket,
    config_file: FileConfig,
) -> None:
    metrics = Metrics()
    custom = config_file.custom
    # the kubernetes health checks read the target cluster (where the Nodes and their workloads are)
    objects = connect_objects(clusters.target) if custom.object_checks else None
    object_health: ObjectHealth = NO_OBJECT_HEALTH
    if objects is not None:
        object_health = ObjectChecks(custom.object_checks, lambda _request: objects)
    runs = build_engine(
        settings,
        config_file,
        metrics,
        NO_CLUSTER_SIDE,  # drain, health gate and Events around the play are the agent's (mcm/agent.py)
        object_health,
        # the kubernetes executor's record is on each Node, its Jobs beside the agent (MCM's cluster)
        records=Records("Node", clusters.target),
        jobs_kubeconfig=clusters.control or clusters.target,
    )
    target = connect_target(clusters.target)
    control = connect_control(clusters.control or clusters.target)
    agent = Agent(options, target, control, runs, AgentMetrics(metrics), custom)
    config = uvicorn.Config(http_app(agent, metrics), log_config=None, access_log=False)
    server = uvicorn.Server(config)
    watcher = asyncio.create_task(agent.run(), name="node watch")
    host, port = sock.getsockname()[:2]
    log.info(
        "mcm-agent %s: namespace %s, serving /healthz and /metrics on %s",
        agent.options.agent_id,
        agent.options.namespace,
        f"[{host}]:{port}" if ":" in host else f"{host}:{port}",
    )
    try:
        await server.serve(sockets=[sock])
    finally:
        watcher.cancel()  # the agent stops: its Node tasks finish their step, then it closes both clients
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
        runs.close()
        if objects is not None:
            objects.close()


def run_agent(settings: Settings, options: AgentOptions, clusters: Clusters, sock: socket.socket) -> int:
    """Run the agent until a signal, its HTTP server on ``sock`` (bound by the caller, which names the
    flag when the address cannot be had)."""
    configure_logging(settings.log_format, settings.log_level)
    config_file = load_config(settings.capabilities_file)  # a bad file stops the start
    # the agent has no health gate of Node checks after the play, where url checks would be asked
    refuse_url_checks(config_file, settings.capabilities_file, "mcm-agent")
    asyncio.run(serve(settings, options, clusters, sock, config_file))
    return 0
