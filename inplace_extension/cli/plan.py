"""``inplace-extension plan``: preview an update offline, judged as the service would judge it (the same
settings, capabilities file and inventory): from old and new objects (``--old FILE --new FILE``: CAPI
templates or an MCM MachineClass pair) or from a saved hook request (``plan FILE``). The preview itself
is ``inplace_extension.preview``.
"""

from __future__ import annotations

import argparse
import sys
import time

from inplace_extension.cli.command import Command, readable_file
from inplace_extension.cli.flags import Option, Parser, add_settings_flags, given_as, settings_from_args
from inplace_extension.errors import ExtensionError

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
    preview: Preview
    if args.file is not None:
        preview = preview_request(read_request(args.file), tuple(Machine(name) for name in names), context)
    else:
        old, new = read_side(args.old), read_side(args.new)
        pair(old, new)
        if Part.MACHINE_CLASS in new.parts:
            preview = preview_machine_classes(old, new, machines_of((old, new), names, "Node"), context)
        elif Part.CONTROL_PLANE in new.parts:
            preview = preview_control_plane(old, new, machines_of((old, new), names, "Machine"), context)
        else:
            preview = preview_templates(old, new, machines_of((old, new), names, "Machine"), context)
    if args.hosts:
        checked = check_preview(preview, settings, play_config(config), terminal_progress)
        print(render_checked(checked, args.output))
        return exit_code(checked)
    print(render(preview, args.output))
    return 1 if preview.outcome == "invalid" else 0


COMMAND = Command(
    "plan",
    "preview an update (old and new objects, or a saved request): changes, steps, drain, hosts (offline)",
    configure,
    run,
)
