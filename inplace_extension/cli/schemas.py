"""``inplace-extension schemas``: write the JSON Schemas generated from the models, or ``--check`` that a
directory holds them unchanged (CI keeps ``schemas/`` in sync this way)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from inplace_extension.cli.command import Command
from inplace_extension.cli.flags import Option, Parser

OPTIONS = (
    Option("--write", "INPLACE_SCHEMAS_DIR", "target directory", default="schemas", metavar="DIR"),
    Option(
        "--check",
        "INPLACE_SCHEMAS_CHECK",
        "compare DIR instead of writing; exit 1 on drift",
        default=False,
        boolean=True,
    ),
)


def configure(parser: Parser) -> None:
    for option in OPTIONS:
        parser.add_option(option)


def run(args: argparse.Namespace) -> int:
    # imported when the command runs: every command's module is loaded for the program's parser, and
    # ``attempt`` (a Job's whole process) should not pay for every model's schema
    from inplace_extension import schemas

    directory = Path(args.write)
    if args.check:
        drift = schemas.check(directory)
        for line in drift:
            print(line, file=sys.stderr)
        if drift:
            print(f"regenerate with: {schemas.REGENERATE_COMMAND}", file=sys.stderr)
        return 1 if drift else 0
    for path in schemas.write(directory):
        print(path)
    return 0


COMMAND = Command("schemas", "write (or --check) the JSON Schemas generated from the models", configure, run)
