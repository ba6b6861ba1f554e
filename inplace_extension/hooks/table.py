"""HOOKS: the one table of the hooks we serve. The app's routes and the Discovery answer are derived from it.

Paths follow CAPI's ``GVHToPath``: ``/<group>/<version>/<lower(hook)>/<handler name>``; the singleton
Discovery has no handler segment (docs/capi-hooks.md §1.1).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from inplace_extension.api.common import API_VERSION, CommonResponse, FailurePolicy, ResponseStatus, WireModel
from inplace_extension.api.discovery import DiscoveryRequest, DiscoveryResponse
from inplace_extension.api.inplace import (
    CanUpdateMachineRequest,
    CanUpdateMachineResponse,
    CanUpdateMachineSetRequest,
    CanUpdateMachineSetResponse,
    UpdateMachineRequest,
    UpdateMachineResponse,
)
from inplace_extension.hooks.can_update import can_update_machine, can_update_machine_set
from inplace_extension.hooks.context import HookContext
from inplace_extension.hooks.discovery import discovery
from inplace_extension.hooks.update_machine import update_machine

RequestT = TypeVar("RequestT", bound=WireModel)
ResponseT = TypeVar("ResponseT", bound=CommonResponse)


@dataclass(frozen=True)
class Hook(Generic[RequestT, ResponseT]):
    hook: str  # Go hook name, case-sensitive in Discovery: "CanUpdateMachine"
    name: str | None  # handler name (DNS-1123 label); None for the singleton Discovery
    request_model: type[RequestT]
    response_model: type[ResponseT]
    handler: Callable[[RequestT, HookContext], Awaitable[ResponseT]]
    timeout_seconds: int | None = None  # CAPI: 0..30, absent = 10
    failure_policy: FailurePolicy | None = None

    @property
    def path(self) -> str:
        path = f"/{API_VERSION}/{self.hook.lower()}"
        return f"{path}/{self.name}" if self.name is not None else path

    def failure(self, message: str) -> ResponseT:
        """The hook's own response type carrying ``Failure`` (UpdateMachine's keeps retryAfterSeconds 0)."""
        return self.response_model(status=ResponseStatus.FAILURE, message=message)


HOOKS: tuple[Hook[Any, Any], ...] = (
    Hook("Discovery", None, DiscoveryRequest, DiscoveryResponse, discovery),
    # CanUpdate* are fast pure decisions; UpdateMachine only polls the executor. Fail for all:
    # with Ignore a network error reads as "Success, retryAfterSeconds 0" = update done (§1.4)
    Hook(
        "CanUpdateMachine",
        "can-update-machine",
        CanUpdateMachineRequest,
        CanUpdateMachineResponse,
        can_update_machine,
        timeout_seconds=5,
        failure_policy=FailurePolicy.FAIL,
    ),
    Hook(
        "CanUpdateMachineSet",
        "can-update-machineset",
        CanUpdateMachineSetRequest,
        CanUpdateMachineSetResponse,
        can_update_machine_set,
        timeout_seconds=5,
        failure_policy=FailurePolicy.FAIL,
    ),
    Hook(
        "UpdateMachine",
        "update-machine",
        UpdateMachineRequest,
        UpdateMachineResponse,
        update_machine,
        timeout_seconds=10,
        failure_policy=FailurePolicy.FAIL,
    ),
)


def find_hook(word: str, hooks: tuple[Hook[Any, Any], ...] = HOOKS) -> Hook[Any, Any]:
    """A hook by handler name, Go name or path segment, any case: ``update-machine``, ``UpdateMachine``."""
    wanted = word.strip().lower()
    for hook in hooks:
        if wanted in {hook.hook.lower(), (hook.name or "").lower()}:
            return hook
    known = ", ".join(hook.name or hook.hook.lower() for hook in hooks)
    raise LookupError(f"unknown hook {word!r}; known: {known}")


def hook_of_body(
    document: Any, hooks: tuple[Hook[Any, Any], ...] = HOOKS
) -> tuple[Hook[Any, Any], str] | None:
    """The hook a request body was written for, and how that shows (its ``kind``, else its objects);
    None when it does not tell. Used to say so when a body is posted to another hook's path."""
    if not isinstance(document, dict):
        return None
    kind = document.get("kind")
    for hook in hooks:
        if kind and kind == getattr(hook.request_model, "KIND", None):
            return hook, f"its kind {kind}"
    desired = document.get("desired")
    if kind is not None or not isinstance(desired, dict):
        return None
    by_name = {hook.hook: hook for hook in hooks}
    if "machineSet" in desired:
        return by_name["CanUpdateMachineSet"], "its desired.machineSet"
    if "machine" in desired:
        if "current" in document:
            return by_name["CanUpdateMachine"], "its current and desired Machine"
        return by_name["UpdateMachine"], "its desired Machine without a current one"
    return None
