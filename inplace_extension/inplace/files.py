"""KubeadmConfig ``files`` entries: decoding their content and checking their paths.

CABPK v1beta2 ``File.encoding`` is one of ``base64``, ``gzip``, ``gzip+base64`` (absent = plain text). The
``kubeadm_files`` role receives decoded text only, so decoding happens here, once, for both the CanUpdate
guard and the UpdateMachine plan. Error texts name the problem, never the content or the path.
"""

from __future__ import annotations

import base64
import binascii
import gzip
import re
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from inplace_extension.inplace.entries import EntryInvalid, EntrySkipped, describe_key
from inplace_extension.inplace.pointers import is_object

_KNOWN_KEYS: Final = frozenset(
    {"path", "owner", "permissions", "encoding", "append", "content", "contentFrom"}
)
_PERMISSIONS: Final = re.compile(r"^[0-7]{3,4}$")
# cloud-init's ``user[:group]``, each a POSIX name (as the users role's pattern) or a numeric id: checked
# here, before any host is contacted, so a malformed owner fails the plan instead of a task on the host
_OWNER_PART: Final = r"(?:[a-z_][a-z0-9_-]{0,31}|[0-9]{1,10})"
OWNER: Final = re.compile(rf"^{_OWNER_PART}(?::{_OWNER_PART})?$")
_CONTROL: Final = re.compile(r"[\x00-\x1f\x7f]")
DEFAULT_OWNER: Final = "root:root"  # cloud-init write_files defaults
DEFAULT_PERMISSIONS: Final = "0644"


@dataclass(frozen=True)
class FileEntry:
    path: str
    content: str
    owner: str
    permissions: str
    append: bool

    def as_input(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "content": self.content,
            "owner": self.owner,
            "permissions": self.permissions,
            "append": self.append,
        }


def path_problem(path: Any) -> str | None:
    """Why a file path is unsafe to write, or None. Paths are absolute, normal and free of ``..``."""
    if not isinstance(path, str) or not path:
        return "must be a non-empty string"
    if not path.startswith("/"):
        return "must be an absolute path"
    if ".." in path.split("/"):  # the components PurePosixPath(path).parts would give, without its cost
        return "must not contain '..'"
    if _CONTROL.search(path):
        return "must not contain control characters"
    if path.endswith("/"):
        return "must name a file, not a directory"
    return None


def parse_file(entry: Any) -> FileEntry:
    """One ``files`` entry -> the role's input. Raises EntrySkipped or EntryInvalid."""
    if not is_object(entry):
        raise EntryInvalid("", "must be an object")
    if "contentFrom" in entry:
        raise EntrySkipped("uses contentFrom, which needs access to a Secret")
    unknown = sorted(set(entry) - _KNOWN_KEYS)
    if unknown:
        raise EntrySkipped(
            f"has field {describe_key(unknown[0])}, which the kubeadm_files role does not carry out"
        )
    problem = path_problem(entry.get("path"))
    if problem:
        raise EntryInvalid("path", problem)
    owner = _optional_str(entry, "owner", DEFAULT_OWNER)
    if not OWNER.match(owner):
        raise EntryInvalid("owner", "must be user[:group], each a POSIX name or a numeric id")
    permissions = _optional_str(entry, "permissions", DEFAULT_PERMISSIONS)
    if not _PERMISSIONS.match(permissions):
        raise EntryInvalid("permissions", "must be an octal mode like 0644")
    append = entry.get("append", False)
    if not isinstance(append, bool):
        raise EntryInvalid("append", "must be a boolean")
    content = _decode(entry)
    return FileEntry(entry["path"], content, owner, permissions, append)


def _optional_str(entry: Mapping[str, Any], key: str, default: str) -> str:
    value = entry.get(key, default)
    if not isinstance(value, str) or not value:
        raise EntryInvalid(key, "must be a non-empty string")
    return value


def _decode(entry: Mapping[str, Any]) -> str:
    content = entry.get("content", "")
    if not isinstance(content, str):
        raise EntryInvalid("content", "must be a string")
    encoding = entry.get("encoding", "")
    if encoding == "":
        return content
    if encoding == "gzip":
        # A JSON string cannot carry raw gzip bytes (Go replaces invalid UTF-8 with U+FFFD when encoding),
        # so this content cannot be reproduced faithfully from the request.
        raise EntrySkipped("uses encoding gzip, whose binary content does not survive JSON; use gzip+base64")
    if encoding not in ("base64", "gzip+base64"):
        raise EntryInvalid("encoding", "must be one of base64, gzip, gzip+base64")
    try:
        # Line breaks inside base64 are common in manifests and accepted by cloud-init; nothing else is.
        data = base64.b64decode("".join(content.split()).encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError) as exc:
        raise EntryInvalid("content", f"is not valid base64 for encoding {encoding}") from exc
    if encoding == "gzip+base64":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as exc:
            raise EntryInvalid("content", "is not valid gzip data for encoding gzip+base64") from exc
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise EntrySkipped("has content that is not UTF-8 text after decoding") from exc
