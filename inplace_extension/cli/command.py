"""What every command of the CLI is made of (:class:`Command`) and what several read: request documents.

Each command lives in its own module of this package and exports one ``COMMAND``; ``cli/__init__.py``
puts them under one parser.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from inplace_extension.cli.flags import Parser


@dataclass(frozen=True)
class Command:
    """One subcommand: its name, one line of help, the flags it adds to its parser, and what it runs."""

    name: str
    help: str
    configure: Callable[[Parser], None]
    run: Callable[[argparse.Namespace], int]


def load_document(path: str) -> Any:
    """A JSON or YAML file (``-`` = stdin) as plain data."""
    text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return yaml.safe_load(text)


def kubeconfig_from_env() -> Path | None:
    """The first file of ``$KUBECONFIG`` (a list, as kubectl reads it), or None when it is not set."""
    paths = [part for part in os.environ.get("KUBECONFIG", "").split(os.pathsep) if part]
    return Path(paths[0]).expanduser() if paths else None
