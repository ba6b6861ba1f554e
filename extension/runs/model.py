"""Values exchanged between the hooks layer and the runs layer: what to run, and how far it got."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class RunRequest:
    """One UpdateMachine call, reduced to what a run needs. Built by ``extension.hooks.update_machine``.

    ``inputs`` maps capability name (= role name) to that role's inputs; it never holds
    ``joinConfiguration.discovery`` or any other field no capability claims. ``roles`` names the role of
    each user-defined capability (from the capabilities file; built-ins are their own role).
    """

    namespace: str
    name: str
    fingerprint: str  # sha256 hex of the canonical JSON of ``inputs``
    capabilities: tuple[str, ...]  # roles to run, in the fixed documented order
    inputs: Mapping[str, Mapping[str, Any]]
    annotations: Mapping[str, str] = field(default_factory=dict)  # Machine annotations (address, retry token)
    labels: Mapping[str, str] = field(default_factory=dict)  # Machine labels (inventory label selectors)
    roles: Mapping[str, str] = field(default_factory=dict)  # user-defined capability -> its role

    @property
    def ident(self) -> str:
        """Run ident: ``<namespace>.<name>.<fingerprint[:12]>`` (names a directory under the runs dir)."""
        return f"{self.namespace}.{self.name}.{self.fingerprint[:12]}"

    @property
    def machine(self) -> str:
        return f"{self.namespace}/{self.name}"


class ProgressState(enum.Enum):
    IN_PROGRESS = "in_progress"  # Success + retryAfterSeconds > 0
    DONE = "done"  # Success + retryAfterSeconds = 0
    FAILED = "failed"  # Failure, same message on every call


@dataclass(frozen=True)
class Progress:
    """Where an update stands. Messages are deterministic and secret-free (CAPI shows them, §3.2)."""

    state: ProgressState
    message: str
    retry_after_seconds: int = 0
