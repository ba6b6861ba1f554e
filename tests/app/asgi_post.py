"""The ASGI scope of one hook POST as an ASGI server hands it to the app, for the callers that go straight
through the ASGI interface (tests/app/test_hook_routes.py, bench/same_answers.py). Imports nothing of
``inplace_extension``: bench/same_answers.py uses it beside another revision's sources."""

from __future__ import annotations

from typing import Any


def post_scope(path: str, body: bytes, root_path: str = "") -> dict[str, Any]:
    """A POST of ``body`` to ``path`` with CAPI's ``?timeout=10s``; behind ``root_path`` (a proxy that
    strips that prefix: the request's path is ``root_path + path``)."""
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": root_path + path,
        "raw_path": (root_path + path).encode(),
        "root_path": root_path,
        "query_string": b"timeout=10s",
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 2),
        "state": {},
        "headers": [(b"host", b"x"), (b"content-length", str(len(body)).encode())],
    }
