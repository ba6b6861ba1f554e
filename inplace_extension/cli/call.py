"""``inplace-extension call``: POST a JSON or YAML request to a running service, as CAPI does, and print
the answer with its base64 patches decoded for people.

The server certificate is verified against the system's CAs and, when it exists, the CA that
``serve --self-signed`` made (``--tls-dir``'s ``ca.crt``, under ``$XDG_STATE_HOME``), so a local dev
service is trusted without flags. A failure that is the wrong scheme or an untrusted certificate says so.
"""

from __future__ import annotations

import argparse
import base64
import json
import ssl
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from inplace_extension.cli.command import Command, load_document
from inplace_extension.cli.flags import Option, Parser, add_settings_flags, given_as, settings_from_args
from inplace_extension.hooks.table import HOOKS, find_hook
from inplace_extension.settings import Settings

if TYPE_CHECKING:
    import httpx

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


OPTIONS = (
    Option(
        "--url",
        "INPLACE_CALL_URL",
        "the service's base URL, with any path prefix",
        default=DEFAULT_URL,
        metavar="URL",
    ),
    Option(
        "--cacert",
        "INPLACE_CALL_CACERT",
        "PEM CA to verify the server with (none: the system's CAs and, when it exists, the ca.crt of a "
        "local serve --self-signed, in --tls-dir)",
        metavar="FILE",
    ),
    Option(
        "--insecure",
        "INPLACE_CALL_INSECURE",
        "do not verify the server certificate (dev only)",
        default=False,
        boolean=True,
    ),
    Option("--timeout", "INPLACE_CALL_TIMEOUT", "seconds", kind=float, default=10.0, metavar="SECONDS"),
)


def configure(parser: Parser) -> None:
    parser.add_argument("hook", help="hook: " + ", ".join(h.name or h.hook.lower() for h in HOOKS))
    parser.add_argument("file", help="request body, JSON or YAML ('-' = stdin)")
    for option in OPTIONS:
        parser.add_option(option)
    add_settings_flags(parser, ["tls_dir"])  # where the local dev CA is


def dev_ca_file(settings: Settings) -> Path:
    """The CA certificate ``serve --self-signed`` writes (``--tls-dir``, default under $XDG_STATE_HOME)."""
    return settings.tls_dir.expanduser() / "ca.crt"


def _trust(cafile: Path, given: str, context: ssl.SSLContext) -> None:
    """Trust ``cafile`` too; ``given`` names it as the user gave it (``--cacert /x``,
    ``INPLACE_CALL_CACERT=/x``)."""
    try:
        context.load_verify_locations(cafile=str(cafile))
    except OSError as exc:
        raise ValueError(f"{given}: cannot read it ({exc.strerror or exc})") from None
    except ssl.SSLError:
        raise ValueError(f"{given}: holds no PEM CA certificate") from None


def verification(
    insecure: bool, cacert: str | None, dev_ca: Path, given: str = "--cacert"
) -> ssl.SSLContext | bool:
    """What verifies the server: nothing (--insecure); the system's CAs plus --cacert (``given``: as the
    user gave it), or plus the local dev CA when it exists."""
    if insecure:
        return False
    context = ssl.create_default_context()
    if cacert:
        _trust(Path(cacert).expanduser(), given, context)
    elif dev_ca.is_file():
        _trust(dev_ca, f"the dev CA {dev_ca}", context)
    return context


def hint(url: str, exc: httpx.HTTPError, cacert: str | None, dev_ca: Path) -> str | None:
    """What the user can do about a failed call, when the error tells."""
    import httpx

    text = str(exc)
    if url.startswith("http://") and isinstance(exc, httpx.RemoteProtocolError | httpx.ReadError):
        return "the server closed the connection without an answer: if it serves HTTPS, use --url https://..."
    if url.startswith("https://") and ("WRONG_VERSION_NUMBER" in text or "record layer failure" in text):
        return "the server does not speak TLS: if it serves plain HTTP (--plain-http), use --url http://..."
    if "CERTIFICATE_VERIFY_FAILED" in text:
        if cacert:
            return f"the server's certificate is not signed by --cacert {cacert}"
        found = "" if dev_ca.is_file() else ", not found"
        return (
            "the server's certificate is not trusted: pass --cacert FILE with the CA that signed it "
            f"(a local serve --self-signed writes {dev_ca}{found}), or --insecure for a test server"
        )
    return None


def run(args: argparse.Namespace) -> int:
    # imported when the command runs: every command's module is loaded for the program's parser, and
    # httpx (with its own command line's imports) is a tenth of an ``attempt`` Job's start-up
    import httpx

    hook = find_hook(args.hook)
    document = load_document(args.file)
    url = args.url.rstrip("/") + hook.path
    dev_ca = dev_ca_file(settings_from_args(args))
    verify = verification(args.insecure, args.cacert, dev_ca, given_as(args, "cacert"))
    # send the JSON as CAPI does: POST, no Content-Type, the informational ?timeout= query
    body = json.dumps(document).encode()
    try:
        with httpx.Client(verify=verify, timeout=args.timeout) as client:
            reply = client.post(url, content=body, params={"timeout": f"{int(args.timeout)}s"})
    except httpx.HTTPError as exc:
        print(f"inplace-extension call: {url}: {type(exc).__name__}: {exc}", file=sys.stderr)
        advice = hint(url, exc, args.cacert, dev_ca)
        if advice is not None:
            print(f"inplace-extension call: {advice}", file=sys.stderr)
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
