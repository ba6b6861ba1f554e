"""``inplace-extension mcm-agent``: the node-side updater of MCM's in-place rollouts (the service settings
it shares with ``serve`` plus the agent's own flags); the process itself is ``inplace_extension.mcm.main``."""

from __future__ import annotations

import argparse
import os
import re
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from inplace_extension.cli.command import Command, kubeconfig_from_env
from inplace_extension.cli.flags import Parser, add_settings_flags, parse_listen, settings_from_args
from inplace_extension.mcm.agent import AgentOptions
from inplace_extension.mcm.main import Clusters, run_agent

# the service settings the agent uses: its listener and logs, and what the engine reads
AGENT_SETTINGS = (
    "listen",
    "log_format",
    "log_level",
    "inventory",
    "allowed_cidrs",
    "address_types",
    "runs_dir",
    "max_parallel_runs",
    "retry_after_seconds",
    "max_failed_attempts",
    "playbooks_dir",
    "capabilities_file",
    "health_gate_timeout_seconds",
)


def configure(parser: Parser) -> None:
    add_settings_flags(parser, AGENT_SETTINGS)
    parser.add_argument(
        "--target-kubeconfig",
        type=Path,
        metavar="FILE",
        help="kubeconfig of the cluster with the Nodes (default: $KUBECONFIG, else the in-cluster account)",
    )
    parser.add_argument(
        "--control-kubeconfig",
        type=Path,
        metavar="FILE",
        help="kubeconfig of MCM's cluster (default: the target cluster's)",
    )
    parser.add_argument("--namespace", required=True, help="MCM's namespace in the control cluster")
    parser.add_boolean(
        "--delete-pods",
        dest="delete_pods",
        default=False,
        help="after a successful update, delete the Pods left on the Node",
    )
    parser.add_boolean(
        "--keep-critical-taint",
        dest="keep_critical_taint",
        default=False,
        help="do not remove node.gardener.cloud/critical-components-not-ready (inside Gardener, GRM does)",
    )
    seconds: dict[str, Any] = {"type": float, "metavar": "SECONDS"}
    parser.add_argument(
        "--resync-seconds",
        default=30.0,
        help="look again this often at the Nodes MCM is updating (default: 30)",
        **seconds,
    )
    parser.add_argument(
        "--poll-seconds", default=2.0, help="poll a running update this often (default: 2)", **seconds
    )
    parser.add_argument(
        "--agent-id",
        default=None,
        help="this replica's name in its Node claims: give it one that survives a restart (the Pod's name, "
        "which deploy/mcm passes as INPLACE_AGENT_ID) and a restarted replica resumes its own Nodes at "
        "once, while another live replica's claim still blocks (default: $INPLACE_AGENT_ID, else random)",
    )
    parser.add_argument(
        "--claim-seconds",
        default=120.0,
        help="a replica's claim on a Node lasts this long (default: 120)",
        **seconds,
    )


AGENT_ID_ENV = "INPLACE_AGENT_ID"
AGENT_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$")  # a Pod name fits; no blank (claim syntax)


def agent_id(flag: str | None, environ: Mapping[str, str]) -> str:
    """The replica's identity in its claims: ``--agent-id``, else ``$INPLACE_AGENT_ID``, else random (a
    restart is then a new replica that waits for its predecessor's claims to expire)."""
    value = flag if flag is not None else environ.get(AGENT_ID_ENV, "")
    if not value:
        return uuid.uuid4().hex[:12]
    if not AGENT_ID_RE.match(value):
        raise ValueError(f"--agent-id / {AGENT_ID_ENV}: letters, digits, '.', '_' and '-' only (at most 253)")
    return value


def run(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    options = AgentOptions(
        namespace=args.namespace,
        delete_pods=args.delete_pods,
        remove_critical_taint=not args.keep_critical_taint,
        poll_seconds=args.poll_seconds,
        resync_seconds=args.resync_seconds,
        claim_seconds=args.claim_seconds,
        agent_id=agent_id(args.agent_id, os.environ),
    )
    clusters = Clusters(args.target_kubeconfig or kubeconfig_from_env(), args.control_kubeconfig)
    return run_agent(settings, options, clusters, parse_listen(settings.listen))


COMMAND = Command(
    "mcm-agent", "update the Nodes of MCM in-place rollouts (see docs/install-mcm.md)", configure, run
)
