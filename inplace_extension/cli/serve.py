"""``inplace-extension serve``: the CAPI Runtime SDK hooks over HTTPS (TLS unless ``--plain-http``).

Builds the engine (engine.py), the Starlette app and uvicorn's server on a socket bound here; runs until
a signal, then lets the running plays end (they are never killed). The server, the app and the engine are
imported when the command runs, not with the module: every command's module is loaded for the program's
parser, and ``attempt`` (a Job's whole process) should not pay for them (bench/README.md, issue 43).
"""

from __future__ import annotations

import argparse
import gc
import logging
import socket
from pathlib import Path
from typing import Any

from inplace_extension.cli.command import (
    Command,
    bind,
    kubeconfig_from_env,
    kubeconfig_given,
    readable_file,
    usable_dir,
)
from inplace_extension.cli.flags import add_settings_flags, given_as, parse_listen, settings_from_args
from inplace_extension.logs import configure_logging
from inplace_extension.settings import Settings

logger = logging.getLogger(__name__)


def tls_options(settings: Settings, host: str, args: argparse.Namespace) -> dict[str, Any]:
    """uvicorn's TLS keyword arguments (empty for --plain-http); mTLS per inplace_extension/auth.py. The
    certificate and key are loaded here once, so that a bad file stops the start naming it."""
    from inplace_extension.auth import server_tls
    from inplace_extension.tls import check_serving_files, default_hosts, ensure_dev_certificate

    if settings.plain_http:
        if settings.tls_cert or settings.self_signed:
            raise ValueError("--plain-http cannot be combined with --tls-cert or --self-signed")
        return {}
    if settings.tls_cert or settings.tls_key:
        if not (settings.tls_cert and settings.tls_key):
            raise ValueError("--tls-cert and --tls-key go together")
        certfile, keyfile = settings.tls_cert, settings.tls_key
        check_serving_files(
            certfile, keyfile, given_as(args, "tls_cert", certfile), given_as(args, "tls_key", keyfile)
        )
    elif settings.self_signed:
        try:
            paths, created = ensure_dev_certificate(
                settings.tls_dir, [*default_hosts(host), *settings.tls_hosts]
            )
        except OSError as exc:
            raise ValueError(
                f"{given_as(args, 'tls_dir', settings.tls_dir)}: cannot keep the development certificate "
                f"there ({exc.strerror or exc})"
            ) from None
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
    # its SSL context reports each connection's verified client certificate to AuthMiddleware
    return server_tls(certfile, keyfile, settings.client_ca).uvicorn_options()


def run(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    if settings.kube and settings.kubeconfig is None and (path := kubeconfig_from_env()) is not None:
        # --kube without --kubeconfig: $KUBECONFIG as kubectl reads it, else the in-cluster account
        settings = settings.model_copy(update={"kubeconfig": path})
    configure_logging(settings.log_format, settings.log_level)
    listen_given = given_as(args, "listen", settings.listen)
    host, port = parse_listen(settings.listen, listen_given)
    check_paths(settings, args)
    # everything that can refuse the start is checked before "serving" is printed: TLS files, the
    # address, the capabilities file, the cluster connection
    tls = tls_options(settings, host, args)
    sock = bind(host, port, listen_given)
    try:
        return _serve(settings, host, sock, tls)
    finally:
        sock.close()


def check_paths(settings: Settings, args: argparse.Namespace) -> None:
    """Every file and directory the service reads or writes, refused now when it cannot be, naming the
    flag or the variable that gave it (the files' content is checked as each is loaded)."""
    for name in ("inventory", "capabilities_file", "client_ca", "bearer_token_file"):
        path = getattr(settings, name)
        readable_file(path, given_as(args, name, path))
    if settings.kube_aware:
        readable_file(settings.kubeconfig, kubeconfig_given(args, "kubeconfig", settings.kubeconfig))
    workload = settings.workload_kubeconfig
    if workload.startswith("/"):
        readable_file(Path(workload), given_as(args, "workload_kubeconfig", workload))
    if settings.executor == "local":  # the kubernetes executor's runs dir is in each Job
        usable_dir(settings.runs_dir, given_as(args, "runs_dir", settings.runs_dir))


def _serve(settings: Settings, host: str, sock: socket.socket, tls: dict[str, Any]) -> int:
    """Build the engine and the app on the bound socket, say "serving", serve until a signal."""
    import uvicorn

    from inplace_extension.app import create_app, normalize_prefix
    from inplace_extension.capabilities_file import CapabilitiesFileError
    from inplace_extension.engine import Records, build_engine, load_config, refuse_url_checks
    from inplace_extension.kubeaware.cluster_side import connect_cluster_side
    from inplace_extension.kubeaware.infra_tags import InfraTagsWait
    from inplace_extension.kubeaware.object_checks import ObjectChecks
    from inplace_extension.metrics import Metrics
    from inplace_extension.runs.model import NO_CLUSTER_SIDE, NO_OBJECT_HEALTH, ObjectHealth

    config_file = load_config(settings.capabilities_file)  # a bad file stops the start here
    custom = config_file.custom
    metrics = Metrics()  # one registry shared by the hooks (app) and the runs (executor)
    # Kubernetes-aware mode: a management client (--kubeconfig or in-cluster); a bad config stops the start
    cluster = connect_cluster_side(settings, custom) if settings.kube_aware else None
    object_health: ObjectHealth = NO_OBJECT_HEALTH
    if custom.object_checks:
        if cluster is None:
            raise CapabilitiesFileError(
                f"capabilities file {settings.capabilities_file}: the kubernetes health check "
                f'"{custom.object_checks[0].name}" reads the cluster: it needs the Kubernetes-aware mode '
                "(--kube or --kubeconfig)"
            )
        object_health = ObjectChecks(custom.object_checks, cluster.objects_of)
    if cluster is None:
        refuse_url_checks(config_file, settings.capabilities_file, "serve without --kube or --kubeconfig")
    executor = build_engine(
        settings,
        config_file,
        metrics,
        cluster or NO_CLUSTER_SIDE,
        object_health,
        # the kubernetes executor's record is on each Machine, its Jobs in the management cluster (the
        # --kubeconfig one, else the in-cluster account's): it needs no Kubernetes-aware mode
        records=Records("Machine", settings.kubeconfig),
        jobs_kubeconfig=settings.kubeconfig,
    )
    if (problem := executor.hosts_problem()) is not None:
        logger.warning("%s", problem)
    # provider-applied infrastructure tags are claimed, and waited for, only with cluster access
    infra_tags = InfraTagsWait(cluster.management, cluster.reported_version) if cluster is not None else None
    app = create_app(settings, executor, metrics, custom, executor.hosts_problem, infra_tags)
    scheme = "https" if tls else "http"
    shown = f"[{host}]" if ":" in host else host
    url = f"{scheme}://{shown}:{sock.getsockname()[1]}{normalize_prefix(settings.path_prefix)}"
    print(f"inplace-extension: serving {url}", flush=True)  # tests and scripts read the port from here
    config = uvicorn.Config(
        app,
        log_config=None,
        access_log=settings.access_log,
        timeout_graceful_shutdown=5,
        server_header=False,
        **tls,
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
    return 0


COMMAND = Command(
    "serve", "serve the CAPI Runtime SDK hooks (TLS unless --plain-http)", add_settings_flags, run
)
