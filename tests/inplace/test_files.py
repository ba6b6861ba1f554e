"""KubeadmConfig ``files`` entries: encodings decoded for the role, unsafe paths refused."""

from __future__ import annotations

import base64
import gzip
from typing import Any

import pytest

from inplace_extension.inplace.entries import EntryInvalid, EntrySkipped
from inplace_extension.inplace.files import parse_file, path_problem

TEXT = "line one\nzweite Zeile: äöü\n"


@pytest.mark.parametrize(
    ("encoding", "content"),
    [
        (None, TEXT),
        ("base64", base64.b64encode(TEXT.encode()).decode()),
        ("gzip+base64", base64.b64encode(gzip.compress(TEXT.encode(), mtime=0)).decode()),
    ],
)
def test_parse_file_decodes_every_text_encoding(encoding: str | None, content: str) -> None:
    entry: dict[str, Any] = {"path": "/etc/x.conf", "content": content}
    if encoding:
        entry["encoding"] = encoding
    parsed = parse_file(entry)
    assert parsed.content == TEXT
    assert parsed.as_input() == {
        "path": "/etc/x.conf",
        "content": TEXT,
        "owner": "root:root",
        "permissions": "0644",
        "append": False,
    }


def test_parse_file_accepts_line_broken_base64() -> None:
    encoded = base64.b64encode(TEXT.encode()).decode()
    folded = "\n".join(encoded[i : i + 8] for i in range(0, len(encoded), 8))
    assert parse_file({"path": "/x", "encoding": "base64", "content": folded}).content == TEXT


def test_parse_file_keeps_owner_permissions_and_append() -> None:
    entry = {"path": "/x", "content": "", "owner": "www-data:adm", "permissions": "0600", "append": True}
    assert parse_file(entry).as_input() == {
        "path": "/x",
        "content": "",
        "owner": "www-data:adm",
        "permissions": "0600",
        "append": True,
    }


@pytest.mark.parametrize(
    ("entry", "why"),
    [
        ({"path": "/x", "contentFrom": {"secret": {"name": "s", "key": "k"}}}, "contentFrom"),
        (
            {"path": "/x", "encoding": "base64", "content": base64.b64encode(b"\x89PNG\r\n").decode()},
            "not UTF-8",
        ),
        ({"path": "/x", "encoding": "gzip", "content": "anything"}, "gzip"),
        ({"path": "/x", "content": "", "futureField": 1}, "'futureField'"),
        ({"path": "/x", "content": "", "bad key\n": 1}, "an unexpected field"),
    ],
)
def test_parse_file_skips_entries_the_role_cannot_write(entry: dict[str, Any], why: str) -> None:
    with pytest.raises(EntrySkipped, match=why):
        parse_file(entry)


@pytest.mark.parametrize(
    ("entry", "field"),
    [
        ({"content": "x"}, "path"),
        ({"path": "relative/x", "content": "x"}, "path"),
        ({"path": "/a/../b", "content": "x"}, "path"),
        ({"path": "/x", "content": 5}, "content"),
        ({"path": "/x", "content": "x", "owner": ""}, "owner"),
        ({"path": "/x", "content": "x", "permissions": "0999"}, "permissions"),
        ({"path": "/x", "content": "x", "append": "yes"}, "append"),
        ({"path": "/x", "content": "!!", "encoding": "base64"}, "content"),
        ({"path": "/x", "content": "eA==", "encoding": "gzip+base64"}, "content"),
        ({"path": "/x", "content": "x", "encoding": "zstd"}, "encoding"),
        ("not an object", ""),
    ],
)
def test_parse_file_rejects_malformed_entries_naming_the_field(entry: Any, field: str) -> None:
    with pytest.raises(EntryInvalid) as caught:
        parse_file(entry)
    assert caught.value.where == field


@pytest.mark.parametrize(
    ("path", "problem"),
    [
        ("/etc/motd", None),
        ("/etc/..hidden/x", None),  # '..' only matters as a whole component
        ("etc/motd", "must be an absolute path"),
        ("/etc/../shadow", "must not contain '..'"),
        ("/etc/x/..", "must not contain '..'"),
        ("/etc/x\nnext", "must not contain control characters"),
        ("", "must be a non-empty string"),
    ],
)
def test_path_problem(path: str, problem: str | None) -> None:
    assert path_problem(path) == problem
