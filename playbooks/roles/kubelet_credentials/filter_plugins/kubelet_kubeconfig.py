"""Filters of the kubelet_credentials role: the client certificate files a kubeconfig names by path, and
the kubeconfig with those files embedded (``client-certificate-data`` / ``client-key-data``).

Why: kubeadm's ``/etc/kubernetes/kubelet.conf`` names ``/var/lib/kubelet/pki/kubelet-client-current.pem``
by path. A bootstrap kubeconfig copied from it would point into the directory the rotation deletes, and
the kubelet could never bootstrap again; with the current certificate embedded it requests a new one
with the identity it has (as gardener-node-agent does). Runs on the controller; no secret is printed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

FIELDS = {"client-certificate": "client-certificate-data", "client-key": "client-key-data"}


def _users(kubeconfig: Any) -> list[dict[str, Any]]:
    if not isinstance(kubeconfig, Mapping) or not isinstance(kubeconfig.get("users"), list):
        raise ValueError("the kubelet kubeconfig has no users list")
    return [u.get("user") or {} for u in kubeconfig["users"] if isinstance(u, Mapping)]


def client_files(kubeconfig: Any) -> list[str]:
    """Every file path the kubeconfig's users name for their client certificate or key, once each."""
    paths: list[str] = []
    for user in _users(kubeconfig):
        for field in FIELDS:
            path = user.get(field)
            if isinstance(path, str) and path and path not in paths:
                paths.append(path)
    return paths


def embed_client_files(kubeconfig: Any, contents: Mapping[str, str]) -> dict[str, Any]:
    """The kubeconfig with each client-certificate/-key path replaced by its base64 ``contents[path]``."""
    users = []
    for entry in kubeconfig["users"]:
        user = dict(entry.get("user") or {})
        for field, data_field in FIELDS.items():
            path = user.pop(field, None)
            if isinstance(path, str) and path:
                user[data_field] = contents[path]
        users.append({**entry, "user": user})
    return {**kubeconfig, "users": users}


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "kubelet_credentials_client_files": client_files,
            "kubelet_credentials_embed_client_files": embed_client_files,
        }
