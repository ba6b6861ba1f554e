"""Cluster API's side of the demo's protocol: Discovery, and deciding in place from the patches.

As the MachineDeployment controller does (docs/capi-hooks.md §5), the demo applies the CanUpdateMachineSet
answer's patches to the current objects and compares them with the desired ones, leaving out the
Machine fields CAPI ignores; any difference means a rollout of new machines.
"""

from __future__ import annotations

import base64
import copy
import json
from collections.abc import Mapping
from typing import Any

import httpx
import jsonpatch

from hostlab.errors import DemoError

HOOKS = "/hooks.runtime.cluster.x-k8s.io/v1alpha1"
# fields CAPI leaves out when it compares Machine specs (CleanupMachineSpecForDiff, docs/capi-hooks.md §7.3)
IGNORED_MACHINE_FIELDS = ("clusterName", "bootstrap", "infrastructureRef", "providerID", "minReadySeconds")
PATCH_FIELDS = {
    "machineSet": "machineSetPatch",
    "infrastructureMachineTemplate": "infrastructureMachineTemplatePatch",
    "bootstrapConfigTemplate": "bootstrapConfigTemplatePatch",
}


def apply_patch(obj: dict[str, Any], patch: Mapping[str, Any] | None) -> dict[str, Any]:
    if not patch or not patch.get("patch"):
        return obj
    ops = json.loads(base64.b64decode(patch["patch"]))
    if patch.get("patchType") == "JSONPatch":
        result = jsonpatch.apply_patch(obj, ops)
        assert isinstance(result, dict)  # noqa: S101 - a patch of an object yields an object
        return result
    if patch.get("patchType") == "JSONMergePatch":
        merged = _merge(obj, ops)
        if not isinstance(merged, dict):
            raise DemoError("a JSONMergePatch replaced a whole object with a non-object")
        return merged
    raise DemoError(f"unknown patchType {patch.get('patchType')!r}")


def _merge(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return patch
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = _merge(result.get(key), value)
    return result


def _comparable(kind: str, obj: dict[str, Any]) -> Any:
    spec = copy.deepcopy(obj.get("spec", {}))
    if kind == "machineSet":
        template_spec = spec.get("template", {}).get("spec", {})
        return {k: v for k, v in template_spec.items() if k not in IGNORED_MACHINE_FIELDS}
    return spec.get("template", {}).get("spec", {})


def capi_decides_in_place(request: dict[str, Any], response: dict[str, Any]) -> list[str]:
    """Apply the answer's patches to the current objects; return the objects that still differ."""
    differing = []
    for kind, field in PATCH_FIELDS.items():
        patched = apply_patch(copy.deepcopy(request["current"][kind]), response.get(field))
        if _comparable(kind, patched) != _comparable(kind, request["desired"][kind]):
            differing.append(kind)
    return differing


def patch_summary(response: dict[str, Any]) -> str:
    parts = []
    for field in PATCH_FIELDS.values():
        patch = response.get(field)
        if patch and patch.get("patch"):
            ops = json.loads(base64.b64decode(patch["patch"]))
            paths = [f"{op['op']} {op['path']}" for op in ops] if isinstance(ops, list) else ["merge"]
            parts.append(f"{field}: {', '.join(paths)}")
    return "; ".join(parts) or "no patches"


def post(client: httpx.Client, path: str, body: dict[str, Any]) -> dict[str, Any]:
    response = client.post(path, json=body)
    if response.status_code != 200:
        raise DemoError(f"POST {path}: HTTP {response.status_code}: {response.text[:500]}")
    data = response.json()
    if not isinstance(data, dict):
        raise DemoError(f"POST {path}: the answer is not a JSON object")
    return data


def discover(client: httpx.Client) -> dict[str, str]:
    """Hook name -> handler path, from the Discovery answer (as the CAPI runtime client builds it)."""
    body = {"kind": "DiscoveryRequest", "apiVersion": "hooks.runtime.cluster.x-k8s.io/v1alpha1"}
    answer = post(client, f"{HOOKS}/discovery", body)
    if answer.get("status") != "Success":
        raise DemoError(f"Discovery failed: {answer.get('message')}")
    paths = {}
    for handler in answer.get("handlers", []):
        hook = handler["requestHook"]["hook"]
        paths[hook] = f"{HOOKS}/{hook.lower()}/{handler['name']}"
    for hook in ("CanUpdateMachineSet", "UpdateMachine"):
        if hook not in paths:
            raise DemoError(f"the service registers no {hook} handler")
    return paths
