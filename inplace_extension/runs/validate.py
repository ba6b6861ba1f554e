"""What a run request must satisfy before it may become a directory name and an Ansible host name.

The namespace, name, fingerprint and capability names of a request end up in paths under the runs
directory and in the play's inventory; anything outside these patterns is refused before it gets there.
"""

from __future__ import annotations

import re

from inplace_extension.runs.model import RunRequest

# Kubernetes naming rules (DNS-1123); they also keep the run ident safe as a directory and Ansible name
_NAMESPACE_RE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
_FINGERPRINT_RE = re.compile(r"^[0-9a-f]{64}$")
_CAPABILITY_RE = re.compile(r"^[a-z][a-z0-9_]{0,62}$")
MAX_IDENT_LEN = 200  # a directory name; file systems allow 255 bytes


def problem(request: RunRequest) -> str | None:
    if not _NAMESPACE_RE.match(request.namespace):
        return "namespace is not a valid Kubernetes namespace name"
    if not _NAME_RE.match(request.name):
        return "name is not a valid Kubernetes object name"
    if not _FINGERPRINT_RE.match(request.fingerprint):
        return "fingerprint is not a sha256 hex digest"
    if len(request.ident) > MAX_IDENT_LEN:
        return "namespace and name are too long for a run ident"
    for cap in request.capabilities:
        if not _CAPABILITY_RE.match(cap):
            return "a capability name is not a valid role name"
    for cap, role in request.roles.items():
        if cap not in request.capabilities or not _CAPABILITY_RE.match(role):
            return "a user-defined step does not name a valid role"
    return None
