"""What every handler receives besides its request: the service settings, the hook table, the executor.

Also parses the per-call switches CAPI forwards from ``ExtensionConfig.spec.settings``
(docs/capi-hooks.md §3.1).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from inplace_extension.inplace.custom import NO_CUSTOM, CustomTable
from inplace_extension.inplace.infra_tags import DesiredTags
from inplace_extension.settings import Settings

if TYPE_CHECKING:
    from inplace_extension.hooks.table import Hook
    from inplace_extension.runs.model import Progress, RunRequest, Runs


class InfraTagsPoller(Protocol):
    """UpdateMachine's wait for the infrastructure provider to apply the desired tags
    (``kubeaware.infra_tags.InfraTagsWait`` in the Kubernetes-aware mode)."""

    async def poll(self, desired: DesiredTags, machine: str) -> Progress:
        """``machine``: the name of the Machine (in ``desired.namespace``) the tags are for."""
        ...

    async def host_idle(self, run: RunRequest) -> bool:
        """True when the host has nothing to do for ``run`` (its steps hold already): no play runs."""
        ...


@dataclass(frozen=True)
class HookContext:
    settings: Settings
    hooks: tuple[Hook[Any, Any], ...]  # heterogeneous table: each row has its own models
    runs: Runs | None
    custom: CustomTable = NO_CUSTOM  # user-defined capabilities, loaded once at start-up by the CLI
    # the Kubernetes-aware mode's wait for provider-applied infrastructure tags; None without cluster access
    infra_tags: InfraTagsPoller | None = None


@dataclass(frozen=True)
class HookOptions:
    """ExtensionConfig settings we honour; as in CAPI's reference extension only the string "true" is true."""

    disable_in_place_updates: bool = False  # decline everything (CanUpdate: Success, no patches)
    require_in_place: bool = (
        False  # strict mode (CAPI #13863): Failure listing unclaimed fields, not a rollout
    )

    @classmethod
    def from_settings(cls, settings: Mapping[str, str] | None) -> HookOptions:
        settings = settings or {}
        return cls(
            disable_in_place_updates=settings.get("disableInPlaceUpdates") == "true",
            require_in_place=settings.get("requireInPlace") == "true",
        )
