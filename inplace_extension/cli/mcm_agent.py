"""``inplace-extension mcm-agent``: the node-side updater of MCM's in-place rollouts (the service settings
it shares with ``serve`` plus the agent's own flags); the process itself is ``inplace_extension.mcm.main``."""

from __future__ import annotations

import argparse
from pathlib import Path

from inplace_extension.cli.command import Command
from inplace_extension.cli.flags import add_settings_flags, parse_listen, settings_from_args
from inplace_extension.mcm.agent import AgentOptions
from inplace_extension.mcm.main import Clusters, run_agent


def configure(parser: argparse.ArgumentParser) -> None:
    add_settings_flags(parser)
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


def run(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    options = AgentOptions(
        namespace=args.namespace,
        delete_pods=args.delete_pods,
        remove_critical_taint=not args.keep_critical_taint,
        poll_seconds=args.poll_seconds,
        resync_seconds=args.resync_seconds,
        claim_seconds=args.claim_seconds,
    )
    clusters = Clusters(args.target_kubeconfig, args.control_kubeconfig)
    return run_agent(settings, options, clusters, parse_listen(settings.listen))


COMMAND = Command(
    "mcm-agent", "update the Nodes of MCM in-place rollouts (see docs/install-mcm.md)", configure, run
)
