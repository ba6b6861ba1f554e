"""Every flag of every command and its ``INPLACE_*`` variable, and the parser every command uses.

Two kinds of flag, one behaviour: the service settings (flag ``--foo-bar`` is setting ``foo_bar`` and
variable ``INPLACE_FOO_BAR``, generated from :class:`inplace_extension.settings.Settings`) and a
command's own options (:class:`Option`: each command module's ``OPTIONS`` table names the variable).
A flag given on the command line wins over its variable; ``--help`` shows each flag's value type or
choices, its default and its variable, and docs/configuration.md's table of variables is generated from
these parsers (``python -m inplace_extension.cli.reference``). A boolean takes ``--foo``, ``--no-foo``,
``--foo=true`` and ``--foo=false``. Where a value came from is kept (:class:`Origin`), so that an error
names it as the user gave it: ``--drain sometimes`` or ``INPLACE_DRAIN=sometimes``.

A command reads only its own variables: :func:`settings_from_args` hands :class:`Settings` the settings
of the command's flags, nothing else, and :func:`variable_problems` refuses an ``INPLACE_*`` variable no
command has (a misspelling, with the name it most likely meant) and warns about one of a setting the
command does not use (``INPLACE_TLS_CERT`` for ``mcm-agent``): no variable is ignored in silence.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import sys
import types
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import ValidationError
from pydantic.fields import FieldInfo

from inplace_extension.settings import Settings
from inplace_extension.validation import close_match, problems

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


@dataclass(frozen=True)
class Option:
    """A command's own flag (not a service setting) and its variable: one row of a command's ``OPTIONS``.

    ``kind`` turns the text of the flag or the variable into the value (a ValueError says why not);
    a ``repeatable`` option is a list: the flag given again, the variable comma-separated.
    """

    flag: str
    variable: str
    help: str
    kind: Callable[[str], Any] = str
    default: Any = None
    metavar: str | None = None
    required: bool = False
    boolean: bool = False
    repeatable: bool = False
    choices: tuple[str, ...] | None = None
    short: str | None = None

    @property
    def dest(self) -> str:
        return self.flag.removeprefix("--").replace("-", "_")


@dataclass(frozen=True)
class Variable:
    """A flag of a parser and the variable that stands for it; ``option`` is None for a service setting
    (pydantic-settings reads its variable)."""

    dest: str
    flag: str
    variable: str
    shown_default: str
    option: Option | None = None


@dataclass(frozen=True)
class Origin:
    """Where a value came from: the flag (with its text), the variable (with its text), or the default."""

    flag: str
    variable: str
    source: Literal["flag", "variable", "default"]
    text: str = ""

    def shown(self, value: object = None) -> str:
        """How the user gave it: ``--drain sometimes``, ``INPLACE_DRAIN=sometimes``, or
        ``--listen 0.0.0.0:9443 (the default)``."""
        if self.source == "flag":
            return f"{self.flag} {shlex.quote(self.text)}" if self.text else self.flag
        if self.source == "variable":
            return f"{self.variable}={shlex.quote(self.text)}"
        return f"{self.flag} {shlex.quote(str(value))} (the default)"


class Parser(argparse.ArgumentParser):
    """argparse's parser, where a boolean flag added with :meth:`add_boolean` also takes ``=true`` and
    ``=false`` (``--affects-availability=false`` as the docs write it), and each flag has a variable."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.boolean_flags: set[str] = set()
        self.variables: dict[str, Variable] = {}
        # every command's variables -> their flags (set by the program's parser): a command's parser
        # checks the environment against them (:func:`variable_problems`); None: not checked
        self.every_variable: Mapping[str, str] | None = None

    def add_option(self, option: Option) -> None:
        """A command's own flag, with its variable and default in ``--help``; argparse leaves it None when
        it is not given, :meth:`parse_known_args` then takes the variable, else the default."""
        default = "required" if option.required else f"default: {_shown(option.default)}"
        shown = f"{option.help} ({default}; env {option.variable})"
        self.variables[option.dest] = Variable(
            option.dest, option.flag, option.variable, _shown(option.default), option
        )
        if option.boolean:
            self.add_boolean(option.flag, dest=option.dest, default=None, help=shown)
            return
        flags = [option.short, option.flag] if option.short else [option.flag]
        self.add_argument(
            *flags,
            dest=option.dest,
            default=None,
            metavar=option.metavar,
            choices=option.choices,
            action="append" if option.repeatable else "store",
            help=shown,
        )

    def add_boolean(self, flag: str, *, dest: str, default: bool | None, help: str) -> None:
        """``--flag`` / ``--no-flag`` (argparse's BooleanOptionalAction), plus ``--flag=true|false``."""
        self.add_argument(flag, dest=dest, action=argparse.BooleanOptionalAction, default=default, help=help)
        self.boolean_flags.add(flag)

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        if args is not None:
            args = [self._boolean_word(arg) for arg in args]
        parsed, rest = super().parse_known_args(args, namespace)
        if self.variables:
            self._refuse_unknown_flags(rest)
            self._check_environment(os.environ)
            self._take_variables(parsed, os.environ)
        return parsed, rest

    def _check_environment(self, environ: Mapping[str, str]) -> None:
        """Warn about each ``INPLACE_*`` variable this command does not read; refuse the start on one no
        command has (before a required flag is missed: the misspelt variable may be the one meant)."""
        if self.every_variable is None:
            return
        command = self.prog.rsplit(" ", 1)[-1]
        own = [var.variable for var in self.variables.values()]
        found = variable_problems(environ, command, own, self.every_variable)
        for line in found.warned:
            sys.stderr.write(f"inplace-extension: warning: {line}\n")
        if found.refused:
            self.exit(2, "".join(f"inplace-extension: {line}\n" for line in found.refused))

    def _refuse_unknown_flags(self, rest: Sequence[str]) -> None:
        """A flag this command does not have is refused here, with the one it most likely meant."""
        known = {var.flag for var in self.variables.values()}
        known |= {"--no-" + flag.removeprefix("--") for flag in self.boolean_flags}
        for arg in rest:
            flag = arg.split("=", 1)[0]
            if flag.startswith("--") and flag not in known:
                guess = close_match(flag, sorted(known))
                hint = f" (did you mean {guess}?)" if guess else ""
                self.error(f"unknown flag {flag}{hint}; {self.prog} --help lists its flags")

    def _take_variables(self, parsed: argparse.Namespace, environ: Mapping[str, str]) -> None:
        """Fill each option not given as a flag from its variable, else its default; keep every origin."""
        origins: dict[str, Origin] = dict(getattr(parsed, "origins", {}))
        for var in self.variables.values():
            value = getattr(parsed, var.dest, None)
            if value is not None:
                origin = Origin(var.flag, var.variable, "flag", _flag_text(var, value))
            elif var.variable in environ:
                origin = Origin(var.flag, var.variable, "variable", environ[var.variable])
            else:
                origin = Origin(var.flag, var.variable, "default")
            origins[var.dest] = origin
            option = var.option
            if option is None:
                continue  # a service setting: settings_from_args hands Settings its flag or variable
            if origin.source == "default":
                if option.required:
                    self.error(f"{option.flag} (or the variable {option.variable}) is required")
                setattr(parsed, var.dest, option.default)
            else:
                setattr(parsed, var.dest, self._convert(option, origin, value))
        parsed.origins = origins

    def _convert(self, option: Option, origin: Origin, value: Any) -> Any:
        """The option's value from the flag's or the variable's text; a bad one is refused by its origin."""
        if origin.source == "flag" and option.boolean:
            return value  # argparse's own --flag / --no-flag
        texts = value if origin.source == "flag" and option.repeatable else [origin.text]
        if option.repeatable and origin.source == "variable":
            texts = [part.strip() for part in origin.text.split(",") if part.strip()]
        try:
            converted = [_convert_text(option, text) for text in texts]
        except ValueError as exc:
            self.error(f"{origin.shown()}: {exc}")
        return converted if option.repeatable else converted[0]

    def _boolean_word(self, arg: str) -> str:
        flag, sep, value = arg.partition("=")
        if not sep or flag not in self.boolean_flags:
            return arg
        if value.lower() not in TRUE_WORDS | FALSE_WORDS:
            self.error(f"argument {flag}: expected true or false, got {value!r}")
        return flag if value.lower() in TRUE_WORDS else "--no-" + flag.removeprefix("--")


def parse_listen(listen: str, given: str | None = None) -> tuple[str, int]:
    """``HOST:PORT`` or ``[v6]:PORT`` -> (host, port); ``given`` names where a refused value came from
    (:func:`given_as`)."""
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise ValueError(
            f"{given or '--listen ' + shlex.quote(listen)}: must be HOST:PORT (e.g. 127.0.0.1:9443)"
        )
    return host.strip("[]") or "0.0.0.0", int(port)  # noqa: S104 -- an empty host means all, as uvicorn


def _convert_text(option: Option, text: str) -> Any:
    if option.boolean:
        if text.lower() not in TRUE_WORDS | FALSE_WORDS:
            raise ValueError("expected true or false")
        return text.lower() in TRUE_WORDS
    if option.choices is not None and text not in option.choices:
        raise ValueError(f"must be one of {', '.join(option.choices)}")
    try:
        return option.kind(text)
    except ValueError:
        raise ValueError("must be a number" if option.kind is float else "not a valid value") from None


def _flag_text(var: Variable, value: Any) -> str:
    """The text a flag was given with (a boolean flag: none; a repeated one: its values joined)."""
    if isinstance(value, bool):
        return ""
    if isinstance(value, list):
        return ",".join(str(item) for item in value)
    return str(value)


def _shown(value: Any) -> str:
    if value is None or value == "" or value == []:
        return "none"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, list):
        return ",".join(str(item) for item in value)
    return str(value)


def given_as(args: argparse.Namespace, dest: str, value: object = None) -> str:
    """How the value of ``dest`` was given, for a message: ``--tls-cert /x``, ``INPLACE_TLS_CERT=/x`` or
    ``--listen 0.0.0.0:9443 (the default)`` (``value`` is the value in use, shown for a default)."""
    origins: dict[str, Origin] = getattr(args, "origins", {})
    origin = origins.get(dest)
    if origin is not None:
        return origin.shown(value)
    return f"{dest} {value}"


class SettingsError(ValueError):
    """Settings that do not validate: one line per problem, each naming the flag or the variable."""

    def __init__(self, lines: list[str]) -> None:
        super().__init__("; ".join(lines))
        self.lines = lines


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
    """The default as --help shows it; a description that says its own default ("(default: the Pod's
    own)") is taken at its word."""
    said = re.search(r"\(default: ([^)]*)\)", field.description or "")
    return said.group(1) if said else _shown(field.get_default(call_default_factory=True))


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
        parser.variables[name] = Variable(name, flag, env_name(name), _shown_default(field))
        if field.annotation is bool:
            parser.add_boolean(flag, dest=name, default=None, help=shown)
        else:
            parser.add_argument(flag, dest=name, default=None, metavar=_metavar(name, field), help=shown)


def settings_from_args(args: argparse.Namespace) -> Settings:
    """The command's settings: each one's flag when given, else its variable, else the default; a setting
    the command has no flag for keeps its default (its variable is not read: see :func:`variable_problems`).
    A bad value raises :class:`SettingsError` naming the flag or the variable it came from."""
    origins: dict[str, Origin] = getattr(args, "origins", {})
    given: dict[str, Any] = {}
    for name in Settings.model_fields:
        origin = origins.get(name)
        if origin is None or origin.source == "default":
            continue
        given[name] = getattr(args, name) if origin.source == "flag" else origin.text
    try:
        return Settings(**given)
    except ValidationError as exc:
        lines = []
        for problem in problems(exc, Settings):
            name = str(problem.loc[0]) if problem.loc else ""
            lines.append(f"{given_as(args, name, getattr(args, name, None))}: {problem.message}")
        raise SettingsError(lines) from None


# INPLACE_* variables that are no command's: other tools' of the project (scripts/release and
# clusterctl's INPLACE_NAMESPACE and INPLACE_IMAGE, the tests' INPLACE_TEST_WORKERS, INPLACE_TEST_TIMELINE
# and caches) and the one the service sets for its own plays (plays/artifacts.py): neither refused nor
# warned about
OTHER_VARIABLES: frozenset[str] = frozenset(
    {
        "INPLACE_NAMESPACE",
        "INPLACE_IMAGE",
        "INPLACE_TEST_WORKERS",
        "INPLACE_TEST_TIMELINE",
        "INPLACE_IMAGE_CACHE_DIR",
        "INPLACE_VAGRANT_CACHE_DIR",
        "INPLACE_EXTENSION_PLAY_LEASE",
    }
)


@dataclass(frozen=True)
class VariableProblems:
    """What :func:`variable_problems` found: variables refused (no command has them) and warned about
    (another command's, or a setting this command does not use: not read)."""

    refused: list[str]
    warned: list[str]


def variable_problems(
    environ: Mapping[str, str], command: str, own: Iterable[str], every: Mapping[str, str]
) -> VariableProblems:
    """The ``INPLACE_*`` variables of ``environ`` that ``command`` (whose variables are ``own``) does not
    read. ``every`` maps each variable of any command to the flag it stands for. A variable in ``every``
    is warned about (it would be ignored), any other is refused, with the variable it most likely meant."""
    mine = set(own)
    refused: list[str] = []
    warned: list[str] = []
    for name in sorted(environ):
        if not name.startswith("INPLACE_") or name in mine or name in OTHER_VARIABLES:
            continue
        if name in every:
            warned.append(
                f"{name} is ignored: {command} has no {every[name]} (inplace-extension {command} --help "
                "lists what it reads)"
            )
            continue
        suffixes = {variable.removeprefix("INPLACE_"): variable for variable in [*sorted(mine), *every]}
        guess = close_match(name.removeprefix("INPLACE_"), list(suffixes))
        hint = f" (did you mean {suffixes[guess]}?)" if guess else ""
        refused.append(
            f"{name} is not a variable of inplace-extension{hint}; inplace-extension {command} --help lists "
            "the variables it reads"
        )
    return VariableProblems(refused, warned)
