"""Discovery is generated from HOOKS and satisfies what CAPI validates (docs/capi-hooks.md §2.3)."""

from __future__ import annotations

import re

import pytest

from inplace_extension.api.common import FailurePolicy
from inplace_extension.hooks.discovery import discovery_response
from inplace_extension.hooks.table import HOOKS, find_hook

from .conftest import load

DNS1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def test_discovery_response_equals_the_explicit_capi_example() -> None:
    assert discovery_response(HOOKS).model_dump(mode="json", by_alias=True, exclude_none=True) == load(
        "discovery/response.explicit.json"
    )


def test_handlers_pass_capi_discovery_validation() -> None:
    handlers = discovery_response(HOOKS).handlers or []
    names = [handler.name for handler in handlers]
    assert len(names) == len(set(names)) == 3
    for handler in handlers:
        assert DNS1123.match(handler.name) and len(handler.name) <= 63
        assert handler.timeout_seconds is not None and 0 <= handler.timeout_seconds <= 30
        # Ignore would turn a network error into "UpdateMachine done" (docs/capi-hooks.md §1.4)
        assert handler.failure_policy is FailurePolicy.FAIL
        assert handler.request_hook.hook in {"CanUpdateMachine", "CanUpdateMachineSet", "UpdateMachine"}


def test_paths_follow_capi_gvh_to_path() -> None:
    api = "/hooks.runtime.cluster.x-k8s.io/v1alpha1"
    paths = {hook.hook: hook.path for hook in HOOKS}
    assert paths == {
        "Discovery": f"{api}/discovery",
        "CanUpdateMachine": f"{api}/canupdatemachine/can-update-machine",
        "CanUpdateMachineSet": f"{api}/canupdatemachineset/can-update-machineset",
        "UpdateMachine": f"{api}/updatemachine/update-machine",
    }


@pytest.mark.parametrize("word", ["update-machine", "UpdateMachine", "updatemachine", " UPDATE-MACHINE "])
def test_find_hook_accepts_handler_go_and_path_names(word: str) -> None:
    assert find_hook(word).hook == "UpdateMachine"


def test_find_hook_lists_known_names_when_unknown() -> None:
    with pytest.raises(LookupError, match="known: discovery, can-update-machine"):
        find_hook("GeneratePatches")
