"""``inplace-extension mcm-agent``: the node-side updater of MCM's in-place rollouts (the service settings
it shares with ``serve`` plus the agent's own flags); the process itself is ``inplace_extension.mcm.main``."""

from __future__ import annotations

import argparse
import re
import uuid
from pathlib import Path

from inplace_extension.cli.command import (
    Command,
    bind,
    kubeconfig_from_env,
    kubeconfig_given,
    readable_file,
    usable_dir,
)
from inplace_extension.cli.flags import (
    Option,
    Parser,
    add_settings_flags,
    given_as,
    parse_listen,
    settings_from_args,
)

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
    "fork_server",
    "capabilities_file",
    "health_gate_timeout_seconds",
    # the kubernetes executor: each attempt a Job beside the agent, the record on the Node
    "executor",
    "pod_name",
    "job_image",
    "job_namespace",
    "job_service_account",
    "job_playbooks_dir",
    "job_deadline_seconds",
    "job_ttl_seconds",
    "job_start_timeout_seconds",
)


AGENT_ID_ENV = "INPLACE_AGENT_ID"

# the agent's own flags and their variables (--namespace is INPLACE_MCM_NAMESPACE, as deploy/mcm sets it)
OPTIONS = (
    Option(
        "--namespace",
        "INPLACE_MCM_NAMESPACE",
        "MCM's namespace in the control cluster",
        metavar="NAMESPACE",
        required=True,
    ),
    Option(
        "--target-kubeconfig",
        "INPLACE_TARGET_KUBECONFIG",
        "kubeconfig of the cluster with the Nodes (none: $KUBECONFIG's first file, else the in-cluster "
        "account)",
        kind=Path,
        metavar="FILE",
    ),
    Option(
        "--control-kubeconfig",
        "INPLACE_CONTROL_KUBECONFIG",
        "kubeconfig of MCM's cluster (none: the target cluster's)",
        kind=Path,
        metavar="FILE",
    ),
    Option(
        "--delete-pods",
        "INPLACE_DELETE_PODS",
        "after a successful update, delete the Pods left on the Node",
        default=False,
        boolean=True,
    ),
    Option(
        "--keep-critical-taint",
        "INPLACE_KEEP_CRITICAL_TAINT",
        "do not remove node.gardener.cloud/critical-components-not-ready (inside Gardener, GRM does)",
        default=False,
        boolean=True,
    ),
    Option(
        "--resync-seconds",
        "INPLACE_RESYNC_SECONDS",
        "look again this often at the Nodes MCM is updating",
        kind=float,
        default=30.0,
        metavar="SECONDS",
    ),
    Option(
        "--poll-seconds",
        "INPLACE_POLL_SECONDS",
        "poll a running update at least this often (and as its play ends)",
        kind=float,
        default=2.0,
        metavar="SECONDS",
    ),
    Option(
        "--agent-id",
        AGENT_ID_ENV,
        "this replica's name in its Node claims: give it one that survives a restart (the Pod's name, as "
        "deploy/mcm sets it) and a restarted replica resumes its own Nodes at once, while another live "
        "replica's claim still blocks (none: random)",
        metavar="NAME",
    ),
    Option(
        "--claim-seconds",
        "INPLACE_CLAIM_SECONDS",
        "a replica's claim on a Node lasts this long",
        kind=float,
        default=120.0,
        metavar="SECONDS",
    ),
)


def configure(parser: Parser) -> None:
    add_settings_flags(parser, AGENT_SETTINGS)
    for option in OPTIONS:
        parser.add_option(option)


AGENT_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$")  # a Pod name fits; no blank (claim syntax)


def agent_id(value: str | None, given: str = "--agent-id") -> str:
    """The replica's identity in its claims: ``--agent-id`` or ``$INPLACE_AGENT_ID``, else random (a
    restart is then a new replica that waits for its predecessor's claims to expire); ``given`` names
    where a refused value came from."""
    if not value:
        return uuid.uuid4().hex[:12]
    if not AGENT_ID_RE.match(value):
        raise ValueError(f"{given}: letters, digits, '.', '_' and '-' only (at most 253)")
    return value


def run(args: argparse.Namespace) -> int:
    # imported when the command runs: every command's module is loaded for the program's parser, and
    # ``attempt`` (a Job's whole process) should not pay for the agent's
    from inplace_extension.mcm.agent import AgentOptions
    from inplace_extension.mcm.main import Clusters, run_agent

    settings = settings_from_args(args)
    listen_given = given_as(args, "listen", settings.listen)
    host, port = parse_listen(settings.listen, listen_given)
    options = AgentOptions(
        namespace=args.namespace,
        delete_pods=args.delete_pods,
        remove_critical_taint=not args.keep_critical_taint,
        poll_seconds=args.poll_seconds,
        resync_seconds=args.resync_seconds,
        claim_seconds=args.claim_seconds,
        agent_id=agent_id(args.agent_id, given_as(args, "agent_id")),
        max_failed_attempts=settings.max_failed_attempts,
    )
    clusters = Clusters(args.target_kubeconfig or kubeconfig_from_env(), args.control_kubeconfig)
    # every file and directory it reads or writes, refused before anything starts, naming its flag
    for name in ("inventory", "capabilities_file"):
        path = getattr(settings, name)
        readable_file(path, given_as(args, name, path))
    readable_file(clusters.target, kubeconfig_given(args, "target_kubeconfig", clusters.target))
    readable_file(clusters.control, given_as(args, "control_kubeconfig", clusters.control))
    if settings.executor == "local":  # the kubernetes executor's runs dir is in each Job
        usable_dir(settings.runs_dir, given_as(args, "runs_dir", settings.runs_dir))
    # bound before anything else starts: a port in use is said naming --listen, before "serving"
    sock = bind(host, port, listen_given)
    try:
        return run_agent(settings, options, clusters, sock)
    finally:
        sock.close()


COMMAND = Command(
    "mcm-agent", "update the Nodes of MCM in-place rollouts (see docs/install-mcm.md)", configure, run
)
