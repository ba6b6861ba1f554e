"""The service settings as command-line flags: flag ``--foo-bar`` is setting ``foo_bar`` and environment
variable ``INPLACE_FOO_BAR`` (generated from :class:`inplace_extension.settings.Settings`, so the three
never drift); a flag given on the command line wins over the environment."""

from __future__ import annotations

import argparse

from inplace_extension.settings import Settings


def parse_listen(listen: str) -> tuple[str, int]:
    """``HOST:PORT`` or ``[v6]:PORT`` -> (host, port)."""
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"--listen must be HOST:PORT, got {listen!r}")
    return host.strip("[]") or "0.0.0.0", int(port)  # noqa: S104 -- an empty host means all, as uvicorn


def add_settings_flags(parser: argparse.ArgumentParser) -> None:
    for name, field in Settings.model_fields.items():
        flag = "--" + name.replace("_", "-")
        env = "INPLACE_" + name.upper()
        if field.annotation is bool:
            parser.add_argument(
                flag, dest=name, action="store_true", default=None, help=f"{field.description} [{env}]"
            )
        else:
            parser.add_argument(
                flag, dest=name, default=None, metavar="VALUE", help=f"{field.description} [{env}]"
            )


def settings_from_args(args: argparse.Namespace) -> Settings:
    """Environment first, then every flag that was given on the command line."""
    overrides = {
        name: getattr(args, name) for name in Settings.model_fields if getattr(args, name, None) is not None
    }
    return Settings(**overrides)
