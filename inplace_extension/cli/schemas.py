"""``inplace-extension schemas``: write the JSON Schemas generated from the models, or ``--check`` that a
directory holds them unchanged (CI keeps ``schemas/`` in sync this way)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from inplace_extension import schemas
from inplace_extension.cli.command import Command
from inplace_extension.cli.flags import Parser


def configure(parser: Parser) -> None:
    parser.add_argument(
        "--write", dest="dir", default="schemas", metavar="DIR", help="target directory [schemas]"
    )
    parser.add_boolean(
        "--check", dest="check", default=False, help="compare DIR instead of writing; exit 1 on drift"
    )


def run(args: argparse.Namespace) -> int:
    directory = Path(args.dir)
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
