"""``inplace-extension call``: POST a JSON or YAML request to a running service, as CAPI does, and print
the answer with its base64 patches decoded for people."""

from __future__ import annotations

import argparse
import base64
import json
import ssl
import sys
from typing import Any

import httpx

from inplace_extension.cli.command import Command, load_document
from inplace_extension.hooks.table import HOOKS, find_hook

DEFAULT_URL = "https://127.0.0.1:9443"


def decode_patches(document: Any) -> Any:
    """Replace every base64 ``patch`` next to a ``patchType`` with the decoded patch document, for people."""
    if isinstance(document, dict):
        decoded = {key: decode_patches(value) for key, value in document.items()}
        if "patchType" in document and isinstance(document.get("patch"), str):
            try:
                decoded["patch"] = json.loads(base64.b64decode(document["patch"], validate=True))
            except ValueError:
                decoded["patch"] = document["patch"] + "  (not valid base64 JSON!)"
        return decoded
    if isinstance(document, list):
        return [decode_patches(item) for item in document]
    return document


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("hook", help="hook: " + ", ".join(h.name or h.hook.lower() for h in HOOKS))
    parser.add_argument("file", help="request body, JSON or YAML ('-' = stdin)")
    parser.add_argument(
        "--url", default=DEFAULT_URL, help=f"service base URL incl. any path prefix [{DEFAULT_URL}]"
    )
    parser.add_argument("--cacert", help="PEM CA to verify the server (e.g. the --self-signed ca.crt)")
    parser.add_argument(
        "--insecure", action="store_true", help="do not verify the server certificate (dev only)"
    )
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds [10]")


def run(args: argparse.Namespace) -> int:
    hook = find_hook(args.hook)
    document = load_document(args.file)
    url = args.url.rstrip("/") + hook.path
    verify: ssl.SSLContext | bool = True
    if args.insecure:
        verify = False
    elif args.cacert:
        verify = ssl.create_default_context(cafile=args.cacert)
    # send the JSON as CAPI does: POST, no Content-Type, the informational ?timeout= query
    body = json.dumps(document).encode()
    try:
        with httpx.Client(verify=verify, timeout=args.timeout) as client:
            reply = client.post(url, content=body, params={"timeout": f"{int(args.timeout)}s"})
    except httpx.HTTPError as exc:
        print(f"inplace-extension call: {url}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    print(f"HTTP {reply.status_code} {url}", file=sys.stderr)
    try:
        answer = reply.json()
    except ValueError:
        print(reply.text)
        return 1
    print(json.dumps(decode_patches(answer), indent=2, ensure_ascii=False))
    return 0 if reply.status_code == 200 and answer.get("status") == "Success" else 1


COMMAND = Command("call", "POST a JSON/YAML request to a running service; print the answer", configure, run)
