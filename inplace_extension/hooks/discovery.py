"""Discovery: the handler list CAPI registers, generated from the HOOKS table (never written by hand)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from inplace_extension.api.common import ResponseStatus
from inplace_extension.api.discovery import (
    DiscoveryRequest,
    DiscoveryResponse,
    ExtensionHandler,
    GroupVersionHook,
)
from inplace_extension.hooks.context import HookContext

if TYPE_CHECKING:
    from inplace_extension.hooks.table import Hook


def discovery_response(hooks: Iterable[Hook[Any, Any]]) -> DiscoveryResponse:
    """One ExtensionHandler per named hook; the singleton Discovery itself is not a handler (§2)."""
    handlers = [
        ExtensionHandler(
            name=hook.name,
            request_hook=GroupVersionHook(hook=hook.hook),
            timeout_seconds=hook.timeout_seconds,
            failure_policy=hook.failure_policy,
        )
        for hook in hooks
        if hook.name is not None
    ]
    return DiscoveryResponse(status=ResponseStatus.SUCCESS, handlers=handlers)


async def discovery(request: DiscoveryRequest, context: HookContext) -> DiscoveryResponse:
    return discovery_response(context.hooks)
