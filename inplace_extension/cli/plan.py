"""``inplace-extension plan``: explain a CanUpdate*/UpdateMachine request field by field, offline, judged
as the service would judge it (with the same capabilities file)."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from inplace_extension.cli.command import Command, load_document
from inplace_extension.cli.flags import Parser
from inplace_extension.engine import load_config
from inplace_extension.hooks.explain import explain_request
from inplace_extension.settings import Settings


def configure(parser: Parser) -> None:
    parser.add_argument("file", help="request body, JSON or YAML ('-' = stdin)")
    parser.add_argument(
        "--capabilities-file",
        metavar="FILE",
        help="user-defined capabilities YAML, judged as the service would [INPLACE_CAPABILITIES_FILE]",
    )


def run(args: argparse.Namespace) -> int:
    path = Path(args.capabilities_file) if args.capabilities_file else Settings().capabilities_file
    config = load_config(path)
    body = json.dumps(load_document(args.file)).encode()
    lines, ok = explain_request(body, config.custom, config.windows, time.time())
    print("\n".join(lines))
    return 0 if ok else 1


COMMAND = Command(
    "plan", "explain a CanUpdate*/UpdateMachine request field by field (offline)", configure, run
)
