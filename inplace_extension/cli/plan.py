"""``inplace-extension plan``: preview an update offline, judged as the service would judge it (the same
settings, capabilities file and inventory): from old and new objects (``--old FILE --new FILE``: CAPI
templates or an MCM MachineClass pair) or from a saved hook request (``plan FILE``). The preview itself
is ``inplace_extension.preview``.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from inplace_extension.cli.command import Command, kubeconfig_from_env, readable_file
from inplace_extension.cli.flags import Option, Parser, add_settings_flags, given_as, settings_from_args
from inplace_extension.errors import ExtensionError

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from inplace_extension.capabilities_file import FileConfig
    from inplace_extension.plays.dry_run import DryRun, HostCheck
    from inplace_extension.preview.hosts import Checker
    from inplace_extension.preview.inputs import Machine
    from inplace_extension.settings import Settings

# the settings that change what the service would do with an update (the rest only say how it serves)
SETTINGS = (
    "capabilities_file",
    "inventory",
    "allowed_cidrs",
    "address_types",
    "kube",
    "drain",
    "affects_availability",
    "playbooks_dir",
    "max_parallel_runs",
    "kubeconfig",
    # --hosts through the kubernetes executor: each host's check a Job, as the service runs attempts
    "executor",
    "job_image",
    "job_namespace",
    "job_service_account",
    "job_playbooks_dir",
    "job_deadline_seconds",
    "job_start_timeout_seconds",
)


OPTIONS = (
    Option(
        "--old",
        "INPLACE_PLAN_OLD",
        "the objects as they are: MachineDeployment/MachineSet, KubeadmConfigTemplate, infrastructure "
        "machine template, or MachineClass (MCM); JSON or YAML, a List (kubectl get -o yaml) too",
        metavar="FILE",
    ),
    Option("--new", "INPLACE_PLAN_NEW", "the same objects as they will be", metavar="FILE"),
    Option(
        "--machine",
        "INPLACE_PLAN_MACHINE",
        "a Machine (MCM: a Node) to preview the host, run and window of (repeatable, the variable "
        "comma-separated; Machine or Node objects in the files count too)",
        default=[],
        metavar="NAME",
        repeatable=True,
    ),
    Option(
        "--machines-of",
        "INPLACE_PLAN_MACHINES_OF",
        "read the Machines of this owner from the management cluster (md/NAME, ms/NAME or kcp/NAME; "
        "--kubeconfig, else $KUBECONFIG; read-only) and preview each, as in the Kubernetes-aware mode; "
        "mcd/NAME: an MCM MachineDeployment, whose Machines' Nodes are previewed",
        metavar="KIND/NAME",
    ),
    Option(
        "--target-kubeconfig",
        "INPLACE_PLAN_TARGET_KUBECONFIG",
        "with --machines-of mcd/NAME: the kubeconfig of the cluster with the Nodes (none: the cluster "
        "of the MCM objects)",
        kind=Path,
        metavar="FILE",
    ),
    Option(
        "--namespace",
        "INPLACE_PLAN_NAMESPACE",
        "the namespace of --machines-of's owner",
        default="default",
        short="-n",
    ),
    Option(
        "--hosts",
        "INPLACE_PLAN_HOSTS",
        "also check each Machine's host: the update playbook in Ansible check mode with diff over SSH "
        "(changes nothing); exit 0 nothing to do, 2 changes, 1 error",
        default=False,
        boolean=True,
    ),
    Option(
        "--output",
        "INPLACE_PLAN_OUTPUT",
        "table, or the PlanPreview document as json or yaml",
        default="table",
        choices=("table", "json", "yaml"),
        short="-o",
    ),
)


def configure(parser: Parser) -> None:
    parser.add_argument(
        "file", nargs="?", help="a saved hook request, JSON or YAML ('-' = stdin); or give --old and --new"
    )
    for option in OPTIONS:
        parser.add_option(option)
    add_settings_flags(parser, SETTINGS)
    parser.epilog = (
        "The service settings are read as serve reads them (flags, else INPLACE_* variables) and only judged "
        "with: plan connects to nothing. --kube (or INPLACE_KUBECONFIG) says the service runs in its "
        "Kubernetes-aware mode, where it drains. Exit 0: previewed (any outcome); 1: outcome invalid, "
        "the service would fail the update for its values; 2: input plan cannot read. With --hosts plan "
        "connects to each Machine's host over SSH (--executor kubernetes: from a Job per host, in "
        "--job-namespace of --kubeconfig's cluster) and changes nothing there; exit 0: no host would change, "
        "2: some host would change (or cannot tell), 1: an error (a host unreachable, a check failed, "
        "the input unreadable or invalid)."
    )


def run(args: argparse.Namespace) -> int:
    if not args.hosts:
        return _run(args)
    try:
        return _run(args)
    except (ValueError, LookupError, OSError, ExtensionError) as exc:
        # --hosts speaks terraform plan -detailed-exitcode: 2 means changes, so any error is 1
        print(f"inplace-extension: {exc}", file=sys.stderr)
        return 1


def _run(args: argparse.Namespace) -> int:
    # imported when the command runs: every command's module is loaded for the program's parser, and
    # ``attempt`` (a Job's whole process) should not pay for the preview and the engine's models
    from inplace_extension.engine import load_config
    from inplace_extension.preview.hosts import check_preview, exit_code, terminal_progress
    from inplace_extension.preview.inputs import (
        Machine,
        Part,
        PlanInputError,
        machines_of,
        pair,
        read_request,
        read_side,
    )
    from inplace_extension.preview.judge import (
        Context,
        preview_control_plane,
        preview_machine_classes,
        preview_request,
        preview_templates,
    )
    from inplace_extension.preview.model import Preview
    from inplace_extension.preview.render import render, render_checked
    from inplace_extension.runs.inventory import load_inventory

    if (args.file is None) == (args.old is None and args.new is None):
        raise PlanInputError(
            "give a saved request (plan FILE) or two object files (plan --old FILE --new FILE)"
        )
    if args.file is None and (args.old is None or args.new is None):
        raise PlanInputError(f"--{'new' if args.new is None else 'old'} FILE is missing: give both")
    settings = settings_from_args(args)
    for name in ("inventory", "capabilities_file"):  # refused naming the flag or the variable
        path = getattr(settings, name)
        readable_file(path, given_as(args, name, path))
    config = load_config(settings.capabilities_file)
    inventory = load_inventory(settings.inventory.expanduser()) if settings.inventory is not None else None
    context = Context(settings, config.custom, config.windows, inventory, time.time())
    names = tuple(args.machine)
    preview: Preview
    if args.file is not None:
        live = cluster_machines(args, settings) if args.machines_of is not None else ()
        given = tuple(Machine(name) for name in names)
        preview = preview_request(read_request(args.file), with_live(given, live), context)
    else:
        old, new = read_side(args.old), read_side(args.new)
        pair(old, new)
        if Part.MACHINE_CLASS in new.parts:
            live = mcm_nodes(args, settings) if args.machines_of is not None else ()
            nodes = with_live(machines_of((old, new), names, "Node"), live)
            preview = preview_machine_classes(old, new, nodes, context)
        else:
            live = cluster_machines(args, settings) if args.machines_of is not None else ()
            machines = with_live(machines_of((old, new), names, "Machine"), live)
            if Part.CONTROL_PLANE in new.parts:
                preview = preview_control_plane(old, new, machines, context)
            else:
                preview = preview_templates(old, new, machines, context)
    if args.hosts:
        checked = check_preview(preview, settings, host_checker(settings, config), terminal_progress)
        print(render_checked(checked, args.output))
        return exit_code(checked)
    print(render(preview, args.output))
    return 1 if preview.outcome == "invalid" else 0


def host_checker(settings: Settings, config: FileConfig) -> Checker:
    """How ``--hosts`` checks the hosts: through the configured executor (``--executor kubernetes``: a
    Job per host of --job-image in --job-namespace of --kubeconfig's cluster, else $KUBECONFIG's). What
    it needs is refused at once; the cluster is connected to only when there is a host to check."""
    from inplace_extension.engine import ExecutorError, play_config, refuse_own_roles
    from inplace_extension.kube.client import KubeConfigError
    from inplace_extension.kube.cluster import connect_attempts
    from inplace_extension.preview.hosts import job_checker, local_checker

    play = play_config(config)
    if settings.executor != "kubernetes":
        return local_checker(settings, play)
    refuse_own_roles(config)
    image = settings.job_image
    if image is None:  # the service reads its own Pod's; plan runs in no Pod of the service
        raise ExecutorError("--hosts with --executor kubernetes needs --job-image: the service's image")

    def check(runs: Sequence[DryRun], on_host: Callable[[HostCheck], None]) -> list[HostCheck]:
        try:
            jobs = connect_attempts(settings.kubeconfig or kubeconfig_from_env())
        except KubeConfigError as exc:
            raise ExecutorError(f"--executor kubernetes needs cluster access (--kubeconfig): {exc}") from None
        try:
            return job_checker(settings, play, jobs, image)(runs, on_host)
        finally:  # one dry run per command: its client goes with it
            jobs.close()

    return check


def cluster_machines(args: argparse.Namespace, settings: Settings) -> tuple[Machine, ...]:
    """The Machines of ``--machines-of``'s owner, read from the management cluster (get and list only)."""
    from inplace_extension.cli.status import owner_of
    from inplace_extension.kube.rollout import connect_rollout
    from inplace_extension.preview.inputs import machine_of_object

    if _mcm_owner(args.machines_of) is not None:
        raise ValueError(
            f"--machines-of {args.machines_of} is an MCM MachineDeployment: its Nodes are previewed with "
            "MachineClass files (--old, --new)"
        )
    owner = owner_of(args.machines_of, args.namespace)
    if owner.kind == "Cluster":
        raise ValueError(f"--machines-of {args.machines_of}: give md/NAME, ms/NAME or kcp/NAME")
    reader = connect_rollout(settings.kubeconfig or kubeconfig_from_env())

    async def read() -> tuple[dict[str, Any], ...]:
        try:
            if not await reader.owner_exists(owner):
                raise LookupError(f"--machines-of: {owner}: not found")
            return (await reader.snapshot(owner)).machines
        finally:
            await reader.close()

    found = asyncio.run(read())
    if not found:
        raise LookupError(f"--machines-of: {owner} has no Machines")
    return tuple(
        machine_of_object(obj, f"{owner}: Machine {obj['metadata']['name']}")
        for obj in sorted(found, key=lambda obj: str(obj["metadata"]["name"]))
    )


# how --machines-of names an MCM MachineDeployment (its CRD's short name, and kubectl's full names)
MCM_DEPLOYMENT_KINDS = (
    "mcd",
    "machinedeployment.machine.sapcloud.io",
    "machinedeployments.machine.sapcloud.io",
)


def _mcm_owner(text: str) -> str | None:
    """The name of the MCM MachineDeployment ``text`` names (``mcd/NAME``), else None."""
    kind, slash, name = text.partition("/")
    return name if slash and name and kind.lower() in MCM_DEPLOYMENT_KINDS else None


def mcm_nodes(args: argparse.Namespace, settings: Settings) -> tuple[Machine, ...]:
    """The Nodes of ``--machines-of mcd/NAME``'s Machines: the MCM objects read from --kubeconfig's
    cluster (else $KUBECONFIG's), the Nodes from --target-kubeconfig's (else the same); get and list
    only."""
    from inplace_extension.kube.mcm_objects import deployment_nodes
    from inplace_extension.preview.inputs import machine_of_object

    name = _mcm_owner(args.machines_of)
    if name is None:
        raise ValueError(
            f"--machines-of {args.machines_of}: MachineClass files preview MCM Nodes: give mcd/NAME (an "
            "MCM MachineDeployment)"
        )
    owner = f"MCM MachineDeployment {args.namespace}/{name}"
    control = settings.kubeconfig or kubeconfig_from_env()
    target = args.target_kubeconfig or control
    found = deployment_nodes(control, target, args.namespace, name)
    if found is None:
        raise LookupError(f"--machines-of: {owner}: not found")
    machines, nodes = found
    if not machines:
        raise LookupError(f"--machines-of: {owner} has no Machines")
    if not nodes:
        raise LookupError(
            f"--machines-of: {owner}: no Node of its Machines ({', '.join(machines)}) has joined the "
            "target cluster (label node.gardener.cloud/machine-name)"
        )
    return tuple(
        machine_of_object(obj, f"{owner}: Node {obj['metadata']['name']}")
        for obj in sorted(nodes, key=lambda obj: str(obj["metadata"]["name"]))
    )


def with_live(given: tuple[Machine, ...], live: tuple[Machine, ...]) -> tuple[Machine, ...]:
    """The Machines named or in the files, then those read from the cluster; a Machine read from the
    cluster takes the place of one of the same name (its labels, annotations and addresses are live)."""
    read = {machine.name: machine for machine in live}
    return (*(read.pop(machine.name, machine) for machine in given), *read.values())


COMMAND = Command(
    "plan",
    "preview an update (old and new objects, or a saved request): changes, steps, drain, hosts (offline)",
    configure,
    run,
)
