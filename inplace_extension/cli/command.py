"""What every command of the CLI is made of (:class:`Command`) and what several read: request documents.

Each command lives in its own module of this package and exports one ``COMMAND``; ``cli/__init__.py``
puts them under one parser.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
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


def bind(host: str, port: int, given: str = "--listen") -> socket.socket:
    """The listening socket; one that cannot be had (a port in use, an address not of this machine) is
    refused naming the address and ``given`` (how --listen was given)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto must say TCP: asyncio turns Nagle off (TCP_NODELAY) only on sockets whose proto is IPPROTO_TCP,
    # and with Nagle on, a response written in two parts waits ~40 ms for the client's delayed ACK
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(1024)
    except OSError as exc:
        sock.close()
        shown = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        raise ValueError(f"{given}: cannot listen on {shown}: {exc.strerror or exc}") from None
    sock.set_inheritable(True)
    return sock


def readable_file(path: Path | None, given: str) -> None:
    """A file the command reads at start-up (or later): refused now when it cannot be opened, naming it
    as ``given`` (``--inventory /x``, ``INPLACE_INVENTORY=/x``, ``$KUBECONFIG's first file /x``).
    None: not given."""
    if path is None:
        return
    try:
        with path.expanduser().open("rb"):
            pass
    except OSError as exc:
        raise ValueError(f"{given}: cannot read it ({exc.strerror or exc})") from None


def usable_dir(path: Path, given: str) -> None:
    """A directory the command writes in (``--runs-dir``): created when missing; refused, naming it as
    ``given``, when it cannot be created or written in."""
    where = path.expanduser()
    try:
        where.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"{given}: cannot create it ({exc.strerror or exc})") from None
    if not os.access(where, os.W_OK | os.X_OK):
        raise ValueError(f"{given}: cannot write in it (permission denied)")


def kubeconfig_given(args: argparse.Namespace, dest: str, path: Path | None) -> str:
    """How a kubeconfig was given: its flag or variable, else ``$KUBECONFIG`` (whose first file is
    used when the flag is not given)."""
    origins = getattr(args, "origins", {})
    origin = origins.get(dest)
    if origin is not None and origin.source != "default":
        return str(origin.shown(path))
    return f"$KUBECONFIG's first file {path}"
