"""``inplace-extension mcm-agent``: its own flags, the run service, two cluster clients, and a small
plain-HTTP server for ``/healthz`` (200 while the Node watch is connected) and ``/metrics``.

The service settings (``--runs-dir``, ``--inventory``, ``--allowed-cidrs``, ``--playbooks-dir``,
``--capabilities-file``, ``--listen``, logging) mean the same as for ``serve``; the flags added here
are the agent's own.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
from collections.abc import Callable
from pathlib import Path

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from inplace_extension.capabilities_file import FileConfig, load_file
from inplace_extension.inplace.custom import NO_CUSTOM
from inplace_extension.kube.client import connect_async
from inplace_extension.logs import configure_logging
from inplace_extension.mcm.agent import Agent, AgentOptions
from inplace_extension.mcm.metrics import AgentMetrics
from inplace_extension.metrics import Metrics
from inplace_extension.runs.service import RunService
from inplace_extension.settings import Settings

log = logging.getLogger(__name__)


def add_command(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
    add_settings_flags: Callable[[argparse.ArgumentParser], None],
    settings_from_args: Callable[[argparse.Namespace], Settings],
    parse_listen: Callable[[str], tuple[str, int]],
) -> None:
    """``mcm-agent``: the service settings flags (the CLI's, passed in) plus the agent's own."""
    parser = sub.add_parser("mcm-agent", help="update the Nodes of MCM in-place rollouts (see README)")
    add_settings_flags(parser)
    add_agent_flags(parser)

    def command(args: argparse.Namespace) -> int:
        settings = settings_from_args(args)
        return run_agent(settings, args, parse_listen(settings.listen))

    parser.set_defaults(func=command)


def add_agent_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--target-kubeconfig", type=Path, help="kubeconfig of the cluster with the Nodes [in-cluster]"
    )
    parser.add_argument(
        "--control-kubeconfig", type=Path, help="kubeconfig of MCM's cluster [--target-kubeconfig]"
    )
    parser.add_argument("--namespace", required=True, help="MCM's namespace in the control cluster")
    parser.add_argument(
        "--delete-pods",
        action="store_true",
        help="after a successful update, delete the Pods left on the Node",
    )
    parser.add_argument(
        "--keep-critical-taint",
        action="store_true",
        help="do not remove node.gardener.cloud/critical-components-not-ready (inside Gardener, GRM does)",
    )
    parser.add_argument(
        "--resync-seconds", type=float, default=30.0, help="re-check every Node this often [30]"
    )
    parser.add_argument(
        "--poll-seconds", type=float, default=2.0, help="poll a running update this often [2]"
    )
    parser.add_argument(
        "--claim-seconds", type=float, default=120.0, help="a replica's claim on a Node lasts this long [120]"
    )


def options_from_args(args: argparse.Namespace) -> AgentOptions:
    return AgentOptions(
        namespace=args.namespace,
        delete_pods=args.delete_pods,
        remove_critical_taint=not args.keep_critical_taint,
        poll_seconds=args.poll_seconds,
        resync_seconds=args.resync_seconds,
        claim_seconds=args.claim_seconds,
    )


def http_app(agent: Agent, metrics: Metrics) -> Starlette:
    async def healthz(request: Request) -> Response:
        if agent.connected.is_set():
            return PlainTextResponse("ok\n")
        return PlainTextResponse("node watch not connected\n", status_code=503)

    return Starlette(routes=[Route("/healthz", healthz), Route("/metrics", metrics.endpoint)])


async def serve(
    settings: Settings, args: argparse.Namespace, listen: tuple[str, int], config_file: FileConfig
) -> None:
    metrics = Metrics()
    custom = config_file.custom
    executor = RunService(settings, metrics, custom.roles_paths, windows=config_file.windows)
    target = connect_async(args.target_kubeconfig)
    control = connect_async(args.control_kubeconfig or args.target_kubeconfig)
    agent = Agent(options_from_args(args), target, control, executor, AgentMetrics(metrics), custom)
    config = uvicorn.Config(
        http_app(agent, metrics), host=listen[0], port=listen[1], log_config=None, access_log=False
    )
    server = uvicorn.Server(config)
    watcher = asyncio.create_task(agent.run(), name="node watch")
    log.info("mcm-agent %s: namespace %s, serving /healthz and /metrics on %s:%d", agent.options.agent_id,
             agent.options.namespace, *listen)  # fmt: skip
    try:
        await server.serve()
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
        await target.close()
        await control.close()
        executor.close()


def run_agent(settings: Settings, args: argparse.Namespace, listen: tuple[str, int]) -> int:
    configure_logging(settings.log_format, settings.log_level)
    config_file = FileConfig(NO_CUSTOM)
    if settings.capabilities_file is not None:
        config_file = load_file(settings.capabilities_file.expanduser())  # a bad file stops the start
    asyncio.run(serve(settings, args, listen, config_file))
    return 0
