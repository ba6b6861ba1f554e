"""Workload clusters: where a Machine's Node lives, reached through a kubeconfig chosen by a setting.

``--workload-kubeconfig`` says where a cluster's workload kubeconfig comes from:

- ``secret`` (default): CAPI's ``<cluster>-kubeconfig`` Secret in the Machine's namespace, key ``value``
  (what ``clusterctl get kubeconfig`` reads);
- ``management``: the workload Nodes are in the management cluster itself (self-hosted clusters, and
  the kubelab, whose kwok Nodes stand in for the Machines' Nodes);
- an absolute path: one kubeconfig file for every cluster.

Clients are cached per cluster; the Secret is read again when a call fails, so a rotated kubeconfig
is picked up.
"""

from __future__ import annotations

import base64
import threading
from pathlib import Path

import yaml
from lightkube import Client, KubeConfig
from lightkube.core.exceptions import ConfigError
from lightkube.resources.core_v1 import Secret

from inplace_extension.kube.client import FIELD_MANAGER, translated
from inplace_extension.kube.errors import KubeError

FROM_SECRET = "secret"  # noqa: S105  # a source name, not a credential
FROM_MANAGEMENT = "management"


def secret_name(cluster: str) -> str:
    return f"{cluster}-kubeconfig"


class WorkloadClients:
    """One client per workload cluster, built on first use from the configured source."""

    def __init__(self, management: Client, source: str) -> None:
        if source not in (FROM_SECRET, FROM_MANAGEMENT) and not Path(source).is_absolute():
            raise KubeError(
                f"workload kubeconfig source {source!r}: use secret, management or an absolute path"
            )
        self._management = management
        self._source = source
        self._lock = threading.Lock()
        self._clients: dict[tuple[str, str], Client] = {}

    def get(self, namespace: str, cluster: str) -> Client:
        if self._source == FROM_MANAGEMENT:
            return self._management
        with self._lock:
            client = self._clients.get((namespace, cluster))
        if client is None:
            client = self._build(namespace, cluster)
            with self._lock:
                self._clients[(namespace, cluster)] = client
        return client

    def close(self) -> None:
        """Close the workload clients built here (the management client belongs to the caller)."""
        with self._lock:
            clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            client.close()

    def forget(self, namespace: str, cluster: str) -> None:
        """Drop a cached client (after an API failure) so the next call reads the kubeconfig again."""
        with self._lock:
            self._clients.pop((namespace, cluster), None)

    def _build(self, namespace: str, cluster: str) -> Client:
        if self._source != FROM_SECRET:
            where = self._source
            try:
                return Client(config=KubeConfig.from_file(self._source), field_manager=FIELD_MANAGER)
            except (OSError, ConfigError, ValueError, KeyError) as exc:
                raise KubeError(f"workload kubeconfig {where}: {type(exc).__name__}") from None
        where = f"Secret {namespace}/{secret_name(cluster)}"
        with translated(f"get {where}"):
            secret = self._management.get(Secret, secret_name(cluster), namespace=namespace)
        encoded = (secret.data or {}).get("value")
        if not encoded:
            raise KubeError(f"{where} has no key 'value'")
        try:
            config = yaml.safe_load(base64.b64decode(encoded))
            return Client(config=KubeConfig.from_dict(config), field_manager=FIELD_MANAGER)
        except (ValueError, yaml.YAMLError, ConfigError, KeyError, TypeError) as exc:
            # never the content: it holds the cluster's credentials
            raise KubeError(f"{where}: not a usable kubeconfig ({type(exc).__name__})") from None
