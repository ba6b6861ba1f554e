"""Role inputs for the playbook tests, shaped as inplace_extension.inplace.plan produces them.

The inputs file is ``{capability: {<capability>_<input>: value}}`` (docs/architecture.md).
"""

from __future__ import annotations

import copy
from typing import Any

# A made-up SHA-512 crypt string: usermod stores it as given, and tests look for it in artifacts.
PASSWORD_HASH = "$6$inplacetest$" + "Q" * 43 + "SECRETHASHMARK" + "q" * 29
FILE_SECRET = "-----BEGIN PRIVATE KEY-----\nSECRETFILEMARK\n-----END PRIVATE KEY-----\n"
KEY_A = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl alice@a"
KEY_B = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBd6Yp5yUNKzOv4b5zY3X0t4e2mX2k8sS1D7yQ3a5m4r alice@b"

_BASE: dict[str, dict[str, Any]] = {
    "users": {
        "users_users": [
            {
                "name": "alice",
                "gecos": "Alice Example",
                "groups": ["adm", "inplace-ops"],
                "shell": "/bin/bash",
                "passwd": PASSWORD_HASH,
                "lock_password": False,
                "sudo": "ALL=(ALL) NOPASSWD:ALL",
                "ssh_authorized_keys": [KEY_A, KEY_B],
            },
            {"name": "bob", "ssh_authorized_keys": []},
        ]
    },
    "ntp": {"ntp_enabled": True, "ntp_servers": ["0.pool.ntp.org", "192.0.2.10"]},
    "kubeadm_files": {
        "kubeadm_files_files": [
            {
                "path": "/etc/inplace-test/nested/whole.conf",
                "content": "whole file\nline two\n",
                "owner": "root:root",
                "permissions": "0640",
                "append": False,
            },
            {
                "path": "/etc/inplace-test/secret.key",
                "content": FILE_SECRET,
                "owner": "root:root",
                "permissions": "0600",
                "append": False,
            },
        ]
    },
    "kubelet_args": {
        "kubelet_args_extra_args": [
            {"name": "node-labels", "value": "tier=web,zone=a"},
            {"name": "max-pods", "value": "60"},
        ]
    },
    "kubernetes_version": {"kubernetes_version_target": "v1.30.2", "kubernetes_version_control_plane": False},
}


def inputs(*capabilities: str) -> dict[str, dict[str, Any]]:
    """A fresh copy of the base inputs for ``capabilities`` (all of them when none are named)."""
    names = capabilities or tuple(_BASE)
    return {name: copy.deepcopy(_BASE[name]) for name in names}
