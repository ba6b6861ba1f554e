"""How the adapter connects and calls: a kubeconfig file when one is given, else the in-cluster service
account; library errors become the adapter's own (:mod:`inplace_extension.kube.errors`); and the one
list-then-watch loop every watched kind uses.

The watch is our own loop rather than lightkube's retrying one: after any error (API outage, expired
resourceVersion) it waits with a capped exponential backoff, lists again (a full snapshot, so no change
is missed) and watches from the list's resourceVersion.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Final

import httpx2  # lightkube's transport: its connection errors are httpx2's
from lightkube import ApiError, AsyncClient, Client, KubeConfig
from lightkube.core.exceptions import ConfigError, NotReadyError

from inplace_extension.errors import ExtensionError
from inplace_extension.kube.errors import Conflict, Forbidden, KubeError, NotFound, Unreachable

log = logging.getLogger(__name__)

FIELD_MANAGER: Final = "inplace-extension"
IN_CLUSTER: Final = "in-cluster service account"
BACKOFF_START: Final = 0.5
BACKOFF_CAP: Final = 30.0
WATCH_TIMEOUT: Final = 300  # seconds; the server ends each watch request after this and we resume


class KubeConfigError(ExtensionError):
    """No usable client configuration: the message names the source (never its credentials)."""

    reason = "KubeConfigError"


def load_config(kubeconfig: Path | None, context: str | None = None) -> KubeConfig:
    """The cluster to talk to: ``kubeconfig`` (its ``context`` or current one), else in-cluster."""
    source = str(kubeconfig) if kubeconfig else IN_CLUSTER
    try:
        if kubeconfig is not None:
            config = KubeConfig.from_file(kubeconfig)
            if context is not None and context not in config.contexts:
                raise KubeConfigError(f"kubeconfig {source}: no context named {context!r}")
            return config
        return KubeConfig.from_service_account()
    except (OSError, ConfigError, ValueError, KeyError) as exc:
        raise KubeConfigError(f"cannot load the Kubernetes client config from {source}: {exc}") from exc


def connect(kubeconfig: Path | None, context: str | None = None) -> Client:
    """A blocking client (``serve``'s Kubernetes-aware steps, run in the service's worker threads)."""
    config = load_config(kubeconfig, context)
    return Client(config=config.get(context) if context else config, field_manager=FIELD_MANAGER)


def connect_async(kubeconfig: Path | None, context: str | None = None) -> AsyncClient:
    """An asynchronous client (the MCM agent's event loop)."""
    config = load_config(kubeconfig, context)
    return AsyncClient(config=config.get(context) if context else config, field_manager=FIELD_MANAGER)


_BY_STATUS: Final[dict[int, type[KubeError]]] = {403: Forbidden, 404: NotFound, 409: Conflict}


def unavailable(status: int) -> bool:
    """An answer that says "not now" rather than anything about the object: 429 (the API server's
    priority and fairness, a webhook's rate limit) and every 5xx (overloaded, restarting, etcd away)."""
    return status == 429 or status >= 500


def translate(what: str, exc: Exception) -> KubeError:
    """The adapter's error for a library error raised while doing ``what`` (``get Machine ns/name``)."""
    # a list's error answer can come as the transport's HTTPStatusError rather than an ApiError
    if isinstance(exc, ApiError | httpx2.HTTPStatusError):
        status = exc.response.status_code
        kind = Unreachable if unavailable(status) else _BY_STATUS.get(status, KubeError)
        return kind(f"{what}: the API server answered {status}", status)
    return Unreachable(f"the API server is unreachable ({type(exc).__name__})")


@contextmanager
def translated(what: str) -> Iterator[None]:
    """Run library calls; their API and transport errors leave as :class:`KubeError` s naming ``what``."""
    try:
        yield
    except (ApiError, httpx2.HTTPError, OSError) as exc:
        raise translate(what, exc) from None


def plain(obj: Any) -> dict[str, Any]:
    """A lightkube object as the plain dict the API server sent."""
    result: dict[str, Any] = obj.to_dict()
    return result


async def list_then_watch(
    client: AsyncClient, resource: Any, namespace: str | None = None, connected: asyncio.Event | None = None
) -> AsyncIterator[tuple[str, list[dict[str, Any]]]]:
    """``("LISTED", every object)`` after each (re)connect, then ``(ADDED|MODIFIED|DELETED, [object])``
    for each change; never ends. ``connected`` is set while it works and cleared during an outage."""
    where = {"namespace": namespace} if namespace is not None else {}
    kube: Any = client  # one loop for cluster-wide and namespaced kinds: lightkube types them apart
    delay = BACKOFF_START
    while True:
        try:
            listing = kube.list(resource, **where)
            objects = [plain(obj) async for obj in listing]
            try:
                version = listing.resourceVersion
            except NotReadyError:  # no list chunk arrived: watch from "now"
                version = ""
            if connected is not None:
                connected.set()
            delay = BACKOFF_START
            yield "LISTED", objects
            async for event, changed in kube.watch(
                resource, resource_version=version, server_timeout=WATCH_TIMEOUT, **where
            ):
                yield event, [plain(changed)]
        except (ApiError, httpx2.HTTPError, OSError) as exc:
            if connected is not None:
                connected.clear()
            name = getattr(resource, "__name__", "object")
            log.warning("%s watch interrupted (%s); listing again in %.1fs", name, type(exc).__name__, delay)
            await asyncio.sleep(delay)
            delay = min(BACKOFF_CAP, delay * 2)
