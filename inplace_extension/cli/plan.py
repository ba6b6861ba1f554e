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
from typing import TYPE_CHECKING, Any

from inplace_extension.cli.command import Command, kubeconfig_from_env, readable_file
from inplace_extension.cli.flags import Option, Parser, add_settings_flags, given_as, settings_from_args
from inplace_extension.errors import ExtensionError

if TYPE_CHECKING:
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
        "--kubeconfig, else $KUBECONFIG; read-only) and preview each, as in the Kubernetes-aware mode",
        metavar="KIND/NAME",
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
        "connects to each Machine's host over SSH and changes nothing there; exit 0: no host would change, "
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
    from inplace_extension.engine import load_config, play_config
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
    live = cluster_machines(args, settings) if args.machines_of is not None else ()
    preview: Preview
    if args.file is not None:
        given = tuple(Machine(name) for name in names)
        preview = preview_request(read_request(args.file), with_live(given, live), context)
    else:
        old, new = read_side(args.old), read_side(args.new)
        pair(old, new)
        if Part.MACHINE_CLASS in new.parts:
            if live:
                raise PlanInputError("--machines-of reads CAPI Machines: an MCM MachineClass has Nodes")
            preview = preview_machine_classes(old, new, machines_of((old, new), names, "Node"), context)
        elif Part.CONTROL_PLANE in new.parts:
            machines = with_live(machines_of((old, new), names, "Machine"), live)
            preview = preview_control_plane(old, new, machines, context)
        else:
            machines = with_live(machines_of((old, new), names, "Machine"), live)
            preview = preview_templates(old, new, machines, context)
    if args.hosts:
        checked = check_preview(preview, settings, play_config(config), terminal_progress)
        print(render_checked(checked, args.output))
        return exit_code(checked)
    print(render(preview, args.output))
    return 1 if preview.outcome == "invalid" else 0


def cluster_machines(args: argparse.Namespace, settings: Settings) -> tuple[Machine, ...]:
    """The Machines of ``--machines-of``'s owner, read from the management cluster (get and list only)."""
    from inplace_extension.cli.status import owner_of
    from inplace_extension.kube.rollout import connect_rollout
    from inplace_extension.preview.inputs import machine_of_object

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
