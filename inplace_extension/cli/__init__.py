"""``inplace-extension``: serve the hooks, call them by hand, explain a request, run the MCM agent, write
the JSON Schemas. One module per command (each exports ``COMMAND``); ``flags.py`` turns the service
settings into flags, ``command.py`` holds what the commands share.

Settings come from ``INPLACE_*`` environment variables, overridden by flags (see flags.py).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version

from pydantic import ValidationError

from inplace_extension.cli import call, mcm_agent, plan, schemas, serve
from inplace_extension.cli.flags import Parser
from inplace_extension.errors import ExtensionError

COMMANDS = (serve.COMMAND, call.COMMAND, plan.COMMAND, mcm_agent.COMMAND, schemas.COMMAND)


def installed_version() -> str:
    try:
        return version("inplace-extension")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown (not installed)"


def build_parser() -> Parser:
    parser = Parser(
        prog="inplace-extension",
        description="Cluster API Runtime Extension that updates machines in place. Settings come from "
        "INPLACE_* environment variables, overridden by flags (--foo-bar = INPLACE_FOO_BAR).",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {installed_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        parser_of_command = sub.add_parser(command.name, help=command.help)
        command.configure(parser_of_command)
        parser_of_command.set_defaults(func=command.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except ValidationError as exc:
        for error in exc.errors(include_url=False, include_input=False):
            where = ".".join(str(part) for part in error["loc"])
            print(f"inplace-extension: setting {where}: {error['msg']}", file=sys.stderr)
        return 2
    except (ValueError, LookupError, OSError, ExtensionError) as exc:
        print(f"inplace-extension: {exc}", file=sys.stderr)
        return 2
