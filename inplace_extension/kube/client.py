"""How the adapter connects: a kubeconfig file when one is given, else the in-cluster service account.

One function per client kind, so every caller connects the same way and errors name the source.
"""

from __future__ import annotations

from pathlib import Path

from lightkube import AsyncClient, Client, KubeConfig
from lightkube.core.exceptions import ConfigError

from inplace_extension.errors import ExtensionError

FIELD_MANAGER = "inplace-extension"
KubeClient = AsyncClient  # the name callers outside this package use for the client they are handed
IN_CLUSTER = "in-cluster service account"


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
    """A synchronous client (``serve``'s Kubernetes-aware steps, run in the service's worker threads)."""
    config = load_config(kubeconfig, context)
    return Client(config=config.get(context) if context else config, field_manager=FIELD_MANAGER)


def connect_async(kubeconfig: Path | None, context: str | None = None) -> AsyncClient:
    """An asynchronous client (the MCM agent's event loop)."""
    config = load_config(kubeconfig, context)
    return AsyncClient(config=config.get(context) if context else config, field_manager=FIELD_MANAGER)
