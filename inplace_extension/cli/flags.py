"""The service settings as command-line flags, and the parser every command uses.

Flag ``--foo-bar`` is setting ``foo_bar`` and environment variable ``INPLACE_FOO_BAR`` (generated from
:class:`inplace_extension.settings.Settings`, so the three never drift); a flag given on the command line
wins over the environment. ``--help`` shows each flag's value type or choices, its default and its
variable. A boolean takes ``--foo``, ``--no-foo``, ``--foo=true`` and ``--foo=false``.
"""

from __future__ import annotations

import argparse
import re
import types
import typing
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from pydantic.fields import FieldInfo

from inplace_extension.settings import Settings

TRUE_WORDS = frozenset({"true", "yes", "on", "1"})
FALSE_WORDS = frozenset({"false", "no", "off", "0"})
# a pattern that lists the allowed words, as Settings writes them: ^(text|json)$ or ^(?i:debug|info)$
_CHOICES_PATTERN = re.compile(r"^\^\((?:\?i:)?([a-z|]+)\)\$$")
# value names a type cannot tell
METAVARS = {
    "listen": "HOST:PORT",
    "path_prefix": "PATH",
    "workload_kubeconfig": "{secret,management,FILE}",
    "tls_hosts": "NAME,...",
    "address_types": "TYPE,...",
}


class Parser(argparse.ArgumentParser):
    """argparse's parser, where a boolean flag added with :meth:`add_boolean` also takes ``=true`` and
    ``=false`` (``--affects-availability=false`` as the docs write it)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.boolean_flags: set[str] = set()

    def add_boolean(self, flag: str, *, dest: str, default: bool | None, help: str) -> None:
        """``--flag`` / ``--no-flag`` (argparse's BooleanOptionalAction), plus ``--flag=true|false``."""
        self.add_argument(flag, dest=dest, action=argparse.BooleanOptionalAction, default=default, help=help)
        self.boolean_flags.add(flag)

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        if args is not None:
            args = [self._boolean_word(arg) for arg in args]
        return super().parse_known_args(args, namespace)

    def _boolean_word(self, arg: str) -> str:
        flag, sep, value = arg.partition("=")
        if not sep or flag not in self.boolean_flags:
            return arg
        if value.lower() not in TRUE_WORDS | FALSE_WORDS:
            self.error(f"argument {flag}: expected true or false, got {value!r}")
        return flag if value.lower() in TRUE_WORDS else "--no-" + flag.removeprefix("--")


def parse_listen(listen: str) -> tuple[str, int]:
    """``HOST:PORT`` or ``[v6]:PORT`` -> (host, port)."""
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"--listen must be HOST:PORT, got {listen!r}")
    return host.strip("[]") or "0.0.0.0", int(port)  # noqa: S104 -- an empty host means all, as uvicorn


def env_name(name: str) -> str:
    return "INPLACE_" + name.upper()


def _choices(field: FieldInfo) -> list[str] | None:
    if typing.get_origin(field.annotation) is typing.Literal:
        return [str(choice) for choice in typing.get_args(field.annotation)]
    for item in field.metadata:
        match = _CHOICES_PATTERN.match(str(getattr(item, "pattern", "") or ""))
        if match:
            return match.group(1).split("|")
    return None


def _value_type(field: FieldInfo) -> type | None:
    """The field's type without ``None`` (``Path | None`` -> ``Path``)."""
    annotation = field.annotation
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        kinds = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
        annotation = kinds[0] if len(kinds) == 1 else None
    return annotation if isinstance(annotation, type) else None


def _metavar(name: str, field: FieldInfo) -> str:
    if name in METAVARS:
        return METAVARS[name]
    choices = _choices(field)
    if choices:
        return "{" + ",".join(choices) + "}"
    kind = _value_type(field)
    if typing.get_origin(field.annotation) is list:
        return "A,B,..."
    if kind is Path:
        return "DIR" if name.endswith("_dir") else "FILE"
    if kind is int:
        return "SECONDS" if name.endswith("_seconds") else "N"
    return name.split("_")[-1].upper()


def _shown_default(field: FieldInfo) -> str:
    value = field.get_default(call_default_factory=True)
    if value is None or value == "" or value == []:
        return "none"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list):
        return ",".join(str(item) for item in value)
    return str(value)


def add_settings_flags(parser: Parser, names: Iterable[str] | None = None) -> None:
    """A flag for each setting in ``names`` (default: all), with its type, default and variable in help."""
    wanted = set(Settings.model_fields if names is None else names)
    for name, field in Settings.model_fields.items():
        if name not in wanted:
            continue
        flag = "--" + name.replace("_", "-")
        description = field.description or ""
        default = "" if "(default:" in description else f"default: {_shown_default(field)}; "
        shown = f"{description} ({default}env {env_name(name)})"
        if field.annotation is bool:
            parser.add_boolean(flag, dest=name, default=None, help=shown)
        else:
            parser.add_argument(flag, dest=name, default=None, metavar=_metavar(name, field), help=shown)


def settings_from_args(args: argparse.Namespace) -> Settings:
    """Environment first, then every flag that was given on the command line."""
    overrides = {
        name: getattr(args, name) for name in Settings.model_fields if getattr(args, name, None) is not None
    }
    return Settings(**overrides)
