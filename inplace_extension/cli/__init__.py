"""``inplace-extension``: serve the hooks, call them by hand, explain a request, run the MCM agent, write
the JSON Schemas. One module per command (each exports ``COMMAND``); ``flags.py`` turns the service
settings into flags, ``command.py`` holds what the commands share.

Every flag has an ``INPLACE_*`` variable, which the flag overrides (see flags.py).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version

from pydantic import ValidationError

from inplace_extension.cli import attempt, call, check_host, mcm_agent, plan, schemas, serve, status
from inplace_extension.cli.flags import Parser, SettingsError
from inplace_extension.errors import ExtensionError
from inplace_extension.settings import Settings
from inplace_extension.validation import problems

COMMANDS = (
    serve.COMMAND,
    call.COMMAND,
    plan.COMMAND,
    status.COMMAND,
    mcm_agent.COMMAND,
    schemas.COMMAND,
    attempt.COMMAND,
    check_host.COMMAND,
)


def installed_version() -> str:
    try:
        return version("inplace-extension")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown (not installed)"


def build_parser() -> Parser:
    parser = Parser(
        prog="inplace-extension",
        description="Cluster API Runtime Extension that updates machines in place. Every flag has an "
        "INPLACE_* environment variable, which the flag overrides (each command's --help names them).",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {installed_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    commands: dict[str, Parser] = {}
    for command in COMMANDS:
        parser_of_command = sub.add_parser(command.name, help=command.help)
        command.configure(parser_of_command)
        parser_of_command.set_defaults(func=command.run)
        commands[command.name] = parser_of_command
    # each command checks the environment against every command's variables (flags.variable_problems)
    every = {var.variable: var.flag for p in commands.values() for var in p.variables.values()}
    for parser_of_command in commands.values():
        parser_of_command.every_variable = every
    return parser


# what a Unix tool's reader sees when the tool's output is cut short (killed by SIGPIPE): 128 + 13
BROKEN_PIPE_STATUS = 141


def quiet_broken_pipe() -> int:
    """The reader of our output went away (``plan ... | head``): end as Unix tools do, without a message.

    Python ignores SIGPIPE, so the write raised instead; standard output is pointed at /dev/null so that
    the interpreter's last flush at exit does not fail on the same pipe again.
    """
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return BROKEN_PIPE_STATUS


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except BrokenPipeError:
        return quiet_broken_pipe()
    except SettingsError as exc:
        for line in exc.lines:  # each names the flag or the variable the value came from
            print(f"inplace-extension: {line}", file=sys.stderr)
        return 2
    except ValidationError as exc:  # settings read without their flags (e.g. by a library default)
        for problem in problems(exc, Settings):
            where = ".".join(str(part) for part in problem.loc)
            print(f"inplace-extension: setting {where}: {problem.message}", file=sys.stderr)
        return 2
    except (ValueError, LookupError, OSError, ExtensionError) as exc:
        print(f"inplace-extension: {exc}", file=sys.stderr)
        return 2
