"""CABPK's bootstrap data (a ``#cloud-config`` document) read into what a node must carry out: the files of
``write_files`` (content decoded, mode, owner, append), the ``bootcmd`` and ``runcmd`` scripts, the
``users`` and the ``ntp`` servers. Pure, no I/O.

What CABPK writes (``bootstrap/kubeadm/pkg/cloudinit`` of CAPI v1.14.2): the header ``## template: jinja``
and ``#cloud-config``; ``write_files`` entries with ``path``, ``encoding`` (``base64``, ``gzip``,
``gzip+base64``), ``owner``, ``permissions`` (an octal string), ``append`` and ``content``; ``bootcmd``
and ``runcmd`` (the kubeadm command, ``&& echo success > /run/cluster-api/bootstrap-success.complete``);
and ``ntp``, ``users``, ``disk_setup``, ``fs_setup``, ``mounts`` when the KubeadmConfig sets them.

cloud-init renders a document with the jinja header against the instance's metadata before reading it;
the KubeadmConfigs users write name the host through it (``'{{ ds.meta_data.local_hostname }}'`` in
``nodeRegistration.name``, ``hostname "{{ ds.meta_data.hostname }}"`` in ``preKubeadmCommands``) and its
address (``'{{ ds.meta_data.local_ipv4 }}'`` as a control plane's ``advertiseAddress``, where the host
has no default route for kubeadm to find it by). This module renders exactly those expressions
(:data:`METADATA_EXPRESSIONS` with the node's name, :data:`ADDRESS_EXPRESSIONS` with its address) and
refuses any other template syntax: the document is data from the cluster, never handed to a template
engine. ``runcmd``/``bootcmd`` become one script each, as cloud-init makes them (a string entry is a line
of the script, a list entry its words quoted); they are CABPK's own commands, run by ``/bin/sh`` on the
node as cloud-init runs them. ``users`` and ``ntp`` are read as cloud-init's ``users_groups`` and ``ntp``
modules read the keys CABPK's templates write (``users.go``, ``ntp.go``): a user's ``name``, ``passwd``
(a crypt hash), ``gecos``, ``groups`` (comma-separated or a list), ``homedir``, ``inactive``,
``lock_passwd`` (cloud-init's default: locked), ``shell``, ``primary_group``, ``sudo`` (a sudoers rule,
a list of them, or false) and ``ssh_authorized_keys``; ntp's ``enabled`` (cloud-init's default: true)
and ``servers``. Every value is checked here (a POSIX name, an absolute path, one line, a host name or
address) because the node program hands them to ``useradd`` and friends as argv items and writes them
into sudoers and timesyncd files. The keys this provider does not carry out (the disk keys, ntp
``pools``, anything else) are refused when they hold anything, so nothing is silently skipped.
"""

from __future__ import annotations

import base64
import binascii
import gzip
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import yaml

JINJA_HEADER = "## template: jinja"
CLOUD_CONFIG = "#cloud-config"
SENTINEL = "/run/cluster-api/bootstrap-success.complete"  # CABPK's sentinelFileCommand writes it
DEFAULT_PERMISSIONS = 0o644  # cloud-init's default for write_files
DEFAULT_OWNER = "root:root"
# cloud-init's names for the encodings (cloudinit.config.cc_write_files); CABPK emits the long ones
ENCODINGS = {
    "b64": "base64",
    "base64": "base64",
    "gz": "gzip",
    "gzip": "gzip",
    "gz+b64": "gzip+base64",
    "gz+base64": "gzip+base64",
    "gzip+b64": "gzip+base64",
    "gzip+base64": "gzip+base64",
    "text/plain": "",
    "": "",  # no encoding: the content as written
}
FILE_KEYS = frozenset({"path", "content", "encoding", "owner", "permissions", "append"})
CARRIED_OUT = frozenset({"write_files", "bootcmd", "runcmd", "users", "ntp"})
USER_KEYS = frozenset(
    {
        "name",
        "passwd",
        "gecos",
        "groups",
        "homedir",
        "inactive",
        "lock_passwd",
        "shell",
        "primary_group",
        "sudo",
        "ssh_authorized_keys",
    }
)
NTP_KEYS = frozenset({"enabled", "servers"})
_POSIX_NAME = re.compile(r"[a-z_][a-z0-9_-]{0,31}")  # useradd's default NAME_REGEX, without the trailing $
_HOST = re.compile(r"[A-Za-z0-9]([A-Za-z0-9.:-]{0,252}[A-Za-z0-9])?")  # a host name, IPv4 or IPv6 address
# The jinja expressions of cloud-init's instance data that the lab renders, each to the node's name (a lab
# node's hostname, local hostname and instance id are its name). Whitespace inside the braces is free.
METADATA_EXPRESSIONS = (
    "ds.meta_data.hostname",
    "ds.meta_data.local_hostname",
    "ds.meta_data.instance_id",
    "v1.local_hostname",
    "v1.instance_id",
    "local_hostname",
    "instance_id",
)
# ... and the one rendered to the node's address (EC2-style instance metadata, as cloud-init names it)
ADDRESS_EXPRESSIONS = ("ds.meta_data.local_ipv4",)
_EXPRESSION = re.compile(r"\{\{\s*([A-Za-z0-9_.]+)\s*\}\}")
_TEMPLATE_SYNTAX = re.compile(r"\{\{|\{%|\{#")


class BootstrapDataError(ValueError):
    """The bootstrap data cannot be carried out; the message says what and where (for a condition)."""


@dataclass(frozen=True)
class File:
    path: str
    content: bytes
    permissions: int
    owner: str
    append: bool


@dataclass(frozen=True)
class User:
    name: str
    groups: tuple[str, ...] = ()
    primary_group: str | None = None
    gecos: str | None = None
    homedir: str | None = None
    shell: str | None = None
    passwd: str | None = None  # a crypt(3) hash, as useradd --password takes it
    lock_passwd: bool = True
    inactive: bool = False
    sudo: tuple[str, ...] = ()  # sudoers rules, each "<hosts>=(<runas>) <commands>"
    ssh_authorized_keys: tuple[str, ...] = ()


@dataclass(frozen=True)
class Bootstrap:
    files: tuple[File, ...]
    bootcmd: str | None  # a /bin/sh script, or None when there is no bootcmd
    runcmd: str | None
    users: tuple[User, ...] = ()
    ntp_servers: tuple[str, ...] = ()  # none: no ntp, or ntp not enabled


def parse(document: str, node_name: str, address: str) -> Bootstrap:
    """The bootstrap data of a node named ``node_name`` at ``address``; :class:`BootstrapDataError` if it
    cannot be."""
    text = render(document, node_name, address)
    first = text.lstrip().splitlines()[:1]
    if first != [CLOUD_CONFIG]:
        raise BootstrapDataError(
            f"not a cloud-config document: its first line is {first[0][:60] if first else ''!r},"
            f" not {CLOUD_CONFIG!r}"
        )
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise BootstrapDataError(f"the cloud-config is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise BootstrapDataError("the cloud-config is not a mapping of keys")
    unsupported = sorted(str(k) for k, v in data.items() if k not in CARRIED_OUT and v not in (None, {}, []))
    if unsupported:
        raise BootstrapDataError(
            f"the lab provider does not carry out {', '.join(unsupported)}"
            f" (it carries out {', '.join(sorted(CARRIED_OUT))})"
        )
    files = data.get("write_files") or []
    if not isinstance(files, list):
        raise BootstrapDataError("write_files is not a list")
    users = data.get("users") or []
    if not isinstance(users, list):
        raise BootstrapDataError("users is not a list")
    read = tuple(_user(entry, i) for i, entry in enumerate(users))
    names = [u.name for u in read]
    if len(set(names)) != len(names):
        raise BootstrapDataError(f"users: a name is listed twice ({', '.join(names)})")
    return Bootstrap(
        files=tuple(_file(entry, i) for i, entry in enumerate(files)),
        bootcmd=_script("bootcmd", data.get("bootcmd")),
        runcmd=_script("runcmd", data.get("runcmd")),
        users=read,
        ntp_servers=_ntp(data.get("ntp")),
    )


def render(document: str, node_name: str, address: str) -> str:
    """The document as cloud-init reads it: with the jinja header, the metadata expressions replaced by
    ``node_name`` or ``address`` and the header line dropped; without it, unchanged (cloud-init renders
    nothing)."""
    lines = document.splitlines(keepends=True)
    if not lines or lines[0].rstrip() != JINJA_HEADER:
        return document
    body = "".join(lines[1:])

    def value(match: re.Match[str]) -> str:
        if match.group(1) in ADDRESS_EXPRESSIONS:
            return address
        if match.group(1) not in METADATA_EXPRESSIONS:
            raise BootstrapDataError(
                f"template expression {match.group(0)!r} is not one the lab provider renders"
                f" ({', '.join((*METADATA_EXPRESSIONS, *ADDRESS_EXPRESSIONS))})"
            )
        return node_name

    rendered = _EXPRESSION.sub(value, body)
    leftover = _TEMPLATE_SYNTAX.search(rendered)
    if leftover:
        line = rendered.count("\n", 0, leftover.start()) + 2  # +1 for the header line, +1 for 1-based
        raise BootstrapDataError(
            f"line {line}: template syntax {leftover.group(0)!r} that the lab provider does not render"
            " (only {{ <metadata expression> }})"
        )
    return rendered


def _file(entry: Any, index: int) -> File:
    where = f"write_files[{index}]"
    if not isinstance(entry, dict):
        raise BootstrapDataError(f"{where} is not a mapping")
    path = entry.get("path")
    if not isinstance(path, str) or not path.startswith("/") or "\0" in path:
        raise BootstrapDataError(f"{where}: path must be an absolute path, got {path!r}")
    where = f"{where} ({path})"
    unknown = sorted(str(k) for k in entry if k not in FILE_KEYS)
    if unknown:
        raise BootstrapDataError(
            f"{where}: unknown key {', '.join(unknown)} (known: {', '.join(sorted(FILE_KEYS))})"
        )
    content = entry.get("content", "")
    if not isinstance(content, str):
        raise BootstrapDataError(f"{where}: content is not a string")
    encoding = str(entry.get("encoding") or "").strip().lower()
    if encoding not in ENCODINGS:
        raise BootstrapDataError(
            f"{where}: unknown encoding {encoding!r} (known: {', '.join(sorted(k for k in ENCODINGS if k))})"
        )
    return File(
        path=path,
        content=_decode(content, ENCODINGS[encoding], where),
        permissions=_permissions(entry.get("permissions"), where),
        owner=_owner(entry.get("owner"), where),
        append=_append(entry.get("append"), where),
    )


def _user(entry: Any, index: int) -> User:
    where = f"users[{index}]"
    if not isinstance(entry, dict):
        raise BootstrapDataError(f"{where} is not a mapping")
    unknown = sorted(str(k) for k in entry if k not in USER_KEYS)
    if unknown:
        raise BootstrapDataError(
            f"{where}: unknown key {', '.join(unknown)} (known: {', '.join(sorted(USER_KEYS))})"
        )
    name = _name(entry.get("name"), f"{where}.name")
    where = f"{where} ({name})"
    groups = entry.get("groups") or []
    listed = groups.split(",") if isinstance(groups, str) else groups
    if not isinstance(listed, list):
        raise BootstrapDataError(f"{where}.groups is neither a comma-separated string nor a list")
    sudo = entry.get("sudo")
    rules = [] if sudo in (None, False, "") else sudo if isinstance(sudo, list) else [sudo]
    keys = entry.get("ssh_authorized_keys") or []
    if not isinstance(keys, list):
        raise BootstrapDataError(f"{where}.ssh_authorized_keys is not a list")
    primary = entry.get("primary_group")
    return User(
        name=name,
        groups=tuple(_name(str(g).strip(), f"{where}.groups[{i}]") for i, g in enumerate(listed)),
        primary_group=_name(primary, f"{where}.primary_group") if primary else None,
        gecos=_line(entry.get("gecos"), f"{where}.gecos", forbidden=":"),
        homedir=_absolute(entry.get("homedir"), f"{where}.homedir"),
        shell=_absolute(entry.get("shell"), f"{where}.shell"),
        passwd=_line(entry.get("passwd"), f"{where}.passwd", forbidden=":"),
        lock_passwd=_flag(entry.get("lock_passwd"), f"{where}.lock_passwd", default=True),
        inactive=_flag(entry.get("inactive"), f"{where}.inactive", default=False),
        sudo=tuple(_line(r, f"{where}.sudo[{i}]") or "" for i, r in enumerate(rules)),
        ssh_authorized_keys=tuple(
            _line(k, f"{where}.ssh_authorized_keys[{i}]") or "" for i, k in enumerate(keys)
        ),
    )


def _ntp(value: Any) -> tuple[str, ...]:
    if value in (None, {}):
        return ()
    if not isinstance(value, dict):
        raise BootstrapDataError("ntp is not a mapping")
    unknown = sorted(str(k) for k in value if k not in NTP_KEYS)
    if unknown:
        raise BootstrapDataError(
            f"ntp: unknown key {', '.join(unknown)} (known: {', '.join(sorted(NTP_KEYS))})"
        )
    servers = value.get("servers") or []
    if not isinstance(servers, list):
        raise BootstrapDataError("ntp.servers is not a list")
    for i, server in enumerate(servers):
        if not isinstance(server, str) or not _HOST.fullmatch(server):
            raise BootstrapDataError(f"ntp.servers[{i}]: {server!r} is not a host name or address")
    return tuple(servers) if _flag(value.get("enabled"), "ntp.enabled", default=True) else ()


def _name(value: Any, where: str) -> str:
    if not isinstance(value, str) or not _POSIX_NAME.fullmatch(value):
        raise BootstrapDataError(f"{where}: {value!r} is not a POSIX user or group name")
    return value


def _line(value: Any, where: str, forbidden: str = "") -> str | None:
    """A one-line string (or None when unset); ``forbidden`` characters refused too."""
    if value is None or value == "":
        return None
    if not isinstance(value, str) or re.search(rf"[\x00-\x1f\x7f{re.escape(forbidden)}]", value):
        refused = f" or {forbidden!r}" if forbidden else ""
        raise BootstrapDataError(f"{where} is not a string of one line without control characters{refused}")
    return value


def _absolute(value: Any, where: str) -> str | None:
    text = _line(value, where, forbidden=":")
    if text is not None and (not text.startswith("/") or ".." in text.split("/")):
        raise BootstrapDataError(f"{where}: {text!r} is not an absolute path without '..'")
    return text


def _flag(value: Any, where: str, default: bool) -> bool:
    """A YAML boolean; CABPK writes Go's ``true``/``false``, which YAML reads as booleans."""
    if value is None:
        return default
    if isinstance(value, bool):
        return value
    raise BootstrapDataError(f"{where}: {value!r} is not true or false")


def _decode(content: str, encoding: str, where: str) -> bytes:
    data = content.encode()
    try:
        if "base64" in encoding:
            data = base64.b64decode(b"".join(data.split()), validate=True)  # line breaks are free
        if "gzip" in encoding:
            data = gzip.decompress(data)
    except (binascii.Error, OSError, EOFError) as exc:
        raise BootstrapDataError(f"{where}: content is not valid {encoding}: {exc}") from None
    return data


def _permissions(value: Any, where: str) -> int:
    if value is None or value == "":
        return DEFAULT_PERMISSIONS
    text = str(value).strip()  # YAML may have read an unquoted 0640 as the integer 640 (octal digits kept)
    if not re.fullmatch(r"0?[0-7]{3,4}", text):
        raise BootstrapDataError(f"{where}: permissions {value!r} is not an octal mode such as '0640'")
    return int(text, 8)


def _owner(value: Any, where: str) -> str:
    if value is None or value == "":
        return DEFAULT_OWNER
    if not isinstance(value, str) or not re.fullmatch(
        r"[A-Za-z0-9_][A-Za-z0-9_.-]*(:[A-Za-z0-9_][A-Za-z0-9_.-]*)?", value
    ):
        raise BootstrapDataError(f"{where}: owner {value!r} is not 'user' or 'user:group'")
    return value


def _append(value: Any, where: str) -> bool:
    if value is None:
        return False
    if isinstance(value, bool):
        return value
    raise BootstrapDataError(f"{where}: append {value!r} is not true or false")


def _script(key: str, commands: Any) -> str | None:
    """cloud-init's script of a command list: a string entry is a line, a list entry its words quoted."""
    if commands in (None, []):
        return None
    if not isinstance(commands, list):
        raise BootstrapDataError(f"{key} is not a list")
    lines = ["#!/bin/sh"]
    for i, command in enumerate(commands):
        if isinstance(command, str):
            lines.append(command)
        elif isinstance(command, list) and all(isinstance(w, (str, int, float)) for w in command):
            lines.append(shlex.join(str(w) for w in command))
        else:
            raise BootstrapDataError(f"{key}[{i}] is neither a string nor a list of words")
    return "\n".join(lines) + "\n"


def secret_document(secret: Mapping[str, Any]) -> str:
    """The cloud-config text of a bootstrap data Secret (CABPK's: ``data.value``, ``data.format``)."""
    data = secret.get("data") or {}
    fmt = _b64text(data.get("format"), "format") if data.get("format") else "cloud-config"
    if fmt != "cloud-config":
        raise BootstrapDataError(f"bootstrap data format {fmt!r}: the lab provider reads only cloud-config")
    if not data.get("value"):
        raise BootstrapDataError("the bootstrap data Secret has no data.value")
    return _b64text(data["value"], "value")


def _b64text(value: Any, key: str) -> str:
    try:
        return base64.b64decode(str(value), validate=True).decode()
    except (binascii.Error, UnicodeDecodeError) as exc:
        raise BootstrapDataError(
            f"the bootstrap data Secret's data.{key} is not base64 text: {exc}"
        ) from None


def describe(bootstrap: Bootstrap) -> Sequence[str]:
    """One line per thing the node will do, for the controller's log (paths only, never contents)."""
    lines = [f"write {f.path} mode {f.permissions:04o} owner {f.owner}" for f in bootstrap.files]
    lines += [f"user {u.name}" for u in bootstrap.users]
    lines += [f"ntp servers {' '.join(bootstrap.ntp_servers)}"] if bootstrap.ntp_servers else []
    lines += [f"run {key}" for key in ("bootcmd", "runcmd") if getattr(bootstrap, key)]
    return lines
