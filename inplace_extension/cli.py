"""``inplace-extension``: serve the hooks, call them by hand, explain a request, write the JSON Schemas.

Settings come from ``INPLACE_*`` environment variables, overridden by flags: flag ``--foo-bar`` is
setting ``foo_bar`` (generated from :class:`inplace_extension.settings.Settings`, so the two never drift).
"""

from __future__ import annotations

import argparse
import base64
import gc
import json
import logging
import socket
import ssl
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import uvicorn
import yaml
from pydantic import ValidationError

from inplace_extension import schemas
from inplace_extension.app import create_app, normalize_prefix
from inplace_extension.auth import PeerCertH11Protocol, server_tls
from inplace_extension.engine import build_engine, load_config
from inplace_extension.errors import ExtensionError
from inplace_extension.hooks.explain import explain_request
from inplace_extension.hooks.table import HOOKS, find_hook
from inplace_extension.kubeaware.cluster_side import connect_cluster_side
from inplace_extension.logs import configure_logging
from inplace_extension.mcm.agent import AgentOptions
from inplace_extension.mcm.main import Clusters, run_agent
from inplace_extension.metrics import Metrics
from inplace_extension.runs.model import NO_CLUSTER_SIDE
from inplace_extension.settings import Settings
from inplace_extension.tls import default_hosts, ensure_dev_certificate
from inplace_extension.transport import CoalescingH11Protocol

logger = logging.getLogger(__name__)

DEFAULT_URL = "https://127.0.0.1:9443"


def parse_listen(listen: str) -> tuple[str, int]:
    """``HOST:PORT`` or ``[v6]:PORT`` -> (host, port)."""
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"--listen must be HOST:PORT, got {listen!r}")
    return host.strip("[]") or "0.0.0.0", int(port)  # noqa: S104 -- an empty host means all, as uvicorn


def _add_settings_flags(parser: argparse.ArgumentParser) -> None:
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


def _tls_options(settings: Settings, host: str) -> dict[str, Any]:
    """uvicorn's TLS keyword arguments (empty for --plain-http); mTLS per inplace_extension/auth.py."""
    if settings.plain_http:
        if settings.tls_cert or settings.self_signed:
            raise ValueError("--plain-http cannot be combined with --tls-cert or --self-signed")
        return {}
    if settings.tls_cert or settings.tls_key:
        if not (settings.tls_cert and settings.tls_key):
            raise ValueError("--tls-cert and --tls-key go together")
        certfile, keyfile = settings.tls_cert, settings.tls_key
    elif settings.self_signed:
        paths, created = ensure_dev_certificate(settings.tls_dir, [*default_hosts(host), *settings.tls_hosts])
        print(
            f"inplace-extension: {'generated' if created else 'reusing'} dev certificate {paths.cert}; "
            f"trust {paths.ca_cert} (call --cacert {paths.ca_cert})",
            flush=True,
        )
        certfile, keyfile = paths.cert, paths.key
    else:
        raise ValueError(
            "TLS needs --tls-cert/--tls-key (or --self-signed for development, --plain-http for tests)"
        )
    tls = server_tls(certfile, keyfile, settings.client_ca)
    return {
        "ssl_certfile": tls.certfile,
        "ssl_keyfile": tls.keyfile,
        "ssl_ca_certs": tls.ca_certs,
        "ssl_cert_reqs": tls.cert_reqs,
        # puts the verified client certificate into the request scope for AuthMiddleware
        "http": PeerCertH11Protocol,
    }


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto must say TCP: asyncio turns Nagle off (TCP_NODELAY) only on sockets whose proto is IPPROTO_TCP,
    # and with Nagle on, a response written in two parts waits ~40 ms for the client's delayed ACK
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(1024)
    sock.set_inheritable(True)
    return sock


def cmd_serve(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    configure_logging(settings.log_format, settings.log_level)
    host, port = parse_listen(settings.listen)
    tls_options = _tls_options(settings, host)
    config_file = load_config(settings.capabilities_file)  # a bad file stops the start here
    custom = config_file.custom
    metrics = Metrics()  # one registry shared by the hooks (app) and the runs (executor)
    # Kubernetes-aware mode: a management client (--kubeconfig or in-cluster); a bad config stops the start
    cluster = connect_cluster_side(settings, custom) if settings.kube_aware else None
    executor = build_engine(settings, config_file, metrics, cluster or NO_CLUSTER_SIDE)
    app = create_app(settings, executor, metrics, custom)  # mypy: RunService is an Executor
    sock = _bind(host, port)
    scheme = "https" if tls_options else "http"
    shown = f"[{host}]" if ":" in host else host
    url = f"{scheme}://{shown}:{sock.getsockname()[1]}{normalize_prefix(settings.path_prefix)}"
    print(f"inplace-extension: serving {url}", flush=True)  # tests and scripts read the port from here
    config = uvicorn.Config(
        app,
        log_config=None,
        access_log=settings.access_log,
        timeout_graceful_shutdown=5,
        server_header=False,
        **({"http": CoalescingH11Protocol} | tls_options),
    )
    # everything built so far lives as long as the process: move it out of the collector's sight, so a
    # full collection (tens of ms over ~60k start-up objects) never lands in a hook's latency
    gc.collect()
    gc.freeze()
    try:
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        executor.close()  # admit no more runs, give running plays time to end (they are never killed)
        if cluster is not None:
            cluster.close()  # post the Events still queued
        sock.close()
    return 0


def load_document(path: str) -> Any:
    """A JSON or YAML file (``-`` = stdin) as plain data."""
    text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return yaml.safe_load(text)


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


def cmd_call(args: argparse.Namespace) -> int:
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


def cmd_plan(args: argparse.Namespace) -> int:
    path = Path(args.capabilities_file) if args.capabilities_file else Settings().capabilities_file
    custom = load_config(path).custom
    lines, ok = explain_request(json.dumps(load_document(args.file)).encode(), custom)
    print("\n".join(lines))
    return 0 if ok else 1


def cmd_schemas(args: argparse.Namespace) -> int:
    directory = Path(args.dir)
    if args.check:
        drift = schemas.check(directory)
        for line in drift:
            print(line, file=sys.stderr)
        if drift:
            print(f"regenerate with: {schemas.REGENERATE_COMMAND}", file=sys.stderr)
        return 1 if drift else 0
    for path in schemas.write(directory):
        print(path)
    return 0


def _add_agent_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--target-kubeconfig", type=Path, help="kubeconfig of the cluster with the Nodes [in-cluster]"
    )
    parser.add_argument(
        "--control-kubeconfig", type=Path, help="kubeconfig of MCM's cluster [--target-kubeconfig]"
    )
    parser.add_argument("--namespace", required=True, help="MCM's namespace in the control cluster")
    parser.add_argument(
        "--delete-pods",
        action="store_true",
        help="after a successful update, delete the Pods left on the Node",
    )
    parser.add_argument(
        "--keep-critical-taint",
        action="store_true",
        help="do not remove node.gardener.cloud/critical-components-not-ready (inside Gardener, GRM does)",
    )
    parser.add_argument(
        "--resync-seconds", type=float, default=30.0, help="re-check every Node this often [30]"
    )
    parser.add_argument(
        "--poll-seconds", type=float, default=2.0, help="poll a running update this often [2]"
    )
    parser.add_argument(
        "--claim-seconds", type=float, default=120.0, help="a replica's claim on a Node lasts this long [120]"
    )


def cmd_mcm_agent(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    options = AgentOptions(
        namespace=args.namespace,
        delete_pods=args.delete_pods,
        remove_critical_taint=not args.keep_critical_taint,
        poll_seconds=args.poll_seconds,
        resync_seconds=args.resync_seconds,
        claim_seconds=args.claim_seconds,
    )
    clusters = Clusters(args.target_kubeconfig, args.control_kubeconfig)
    return run_agent(settings, options, clusters, parse_listen(settings.listen))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="inplace-extension",
        description="Cluster API Runtime Extension that updates machines in place. Settings come from "
        "INPLACE_* environment variables, overridden by flags (--foo-bar = INPLACE_FOO_BAR).",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="serve the CAPI Runtime SDK hooks (TLS unless --plain-http)")
    _add_settings_flags(serve)
    serve.set_defaults(func=cmd_serve)

    call = sub.add_parser("call", help="POST a JSON/YAML request to a running service; print the answer")
    call.add_argument("hook", help="hook: " + ", ".join(h.name or h.hook.lower() for h in HOOKS))
    call.add_argument("file", help="request body, JSON or YAML ('-' = stdin)")
    call.add_argument(
        "--url", default=DEFAULT_URL, help=f"service base URL incl. any path prefix [{DEFAULT_URL}]"
    )
    call.add_argument("--cacert", help="PEM CA to verify the server (e.g. the --self-signed ca.crt)")
    call.add_argument(
        "--insecure", action="store_true", help="do not verify the server certificate (dev only)"
    )
    call.add_argument("--timeout", type=float, default=10.0, help="seconds [10]")
    call.set_defaults(func=cmd_call)

    plan = sub.add_parser("plan", help="explain a CanUpdate*/UpdateMachine request field by field (offline)")
    plan.add_argument("file", help="request body, JSON or YAML ('-' = stdin)")
    plan.add_argument(
        "--capabilities-file",
        metavar="FILE",
        help="user-defined capabilities YAML, judged as the service would [INPLACE_CAPABILITIES_FILE]",
    )
    plan.set_defaults(func=cmd_plan)

    agent = sub.add_parser("mcm-agent", help="update the Nodes of MCM in-place rollouts (see README)")
    _add_settings_flags(agent)
    _add_agent_flags(agent)
    agent.set_defaults(func=cmd_mcm_agent)
    gen = sub.add_parser("schemas", help="write (or --check) the JSON Schemas generated from the models")
    gen.add_argument(
        "--write", dest="dir", default="schemas", metavar="DIR", help="target directory [schemas]"
    )
    gen.add_argument("--check", action="store_true", help="compare DIR instead of writing; exit 1 on drift")
    gen.set_defaults(func=cmd_schemas)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except ValidationError as exc:
        for error in exc.errors(include_url=False, include_input=False):
            where = ".".join(str(part) for part in error["loc"])
            print(f"inplace-extension: setting {where}: {error['msg']}", file=sys.stderr)
        return 2
    except (ValueError, LookupError, OSError, ExtensionError) as exc:
        print(f"inplace-extension: {exc}", file=sys.stderr)
        return 2
