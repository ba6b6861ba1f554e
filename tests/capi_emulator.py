"""Test-side emulation of how CAPI decides "in place or rollout" from a CanUpdate* answer.

Reproduces docs/capi-hooks.md §3.3 and §7.2-§7.3 independently of ``inplace_extension`` (it does not use
the ``jsonpatch`` library the production code uses, so the two cannot share a bug): strict base64 decoding,
RFC 6902 applied with evanphx/json-patch v5 default semantics, RFC 7386 merge patches, both applied to the
WHOLE ``current`` object, then only ``spec`` (CanUpdateMachine) or ``spec.template.spec``
(CanUpdateMachineSet) is kept, Machine specs go through ``CleanupMachineSpecForDiff``, and the result is
compared exactly with ``desired``. Anything CAPI would treat as an error raises :class:`EmulatorError`;
it is never reported as a rollout.
"""

from __future__ import annotations

import base64
import binascii
import copy
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

Outcome = Literal["in-place", "rollout"]

# (request object key, response patch field, spec path inside the object, is it the Machine/MachineSet?)
_MACHINE_OBJECTS: tuple[tuple[str, str, tuple[str, ...], bool], ...] = (
    ("machine", "machinePatch", ("spec",), True),
    ("infrastructureMachine", "infrastructureMachinePatch", ("spec",), False),
    ("bootstrapConfig", "bootstrapConfigPatch", ("spec",), False),
)
_MACHINE_SET_OBJECTS: tuple[tuple[str, str, tuple[str, ...], bool], ...] = (
    ("machineSet", "machineSetPatch", ("spec", "template", "spec"), True),
    (
        "infrastructureMachineTemplate",
        "infrastructureMachineTemplatePatch",
        ("spec", "template", "spec"),
        False,
    ),
    ("bootstrapConfigTemplate", "bootstrapConfigTemplatePatch", ("spec", "template", "spec"), False),
)

# CleanupMachineSpecForDiff (internal/util/inplace/inplace.go) zeroes these before comparing (§7.3).
_IGNORED_MACHINE_FIELDS = ("clusterName", "bootstrap", "infrastructureRef", "providerID", "minReadySeconds")
_IGNORED_MACHINE_LISTS = ("readinessGates", "taints")
_IGNORED_DELETION_FIELDS = (
    "nodeDrainTimeoutSeconds",
    "nodeVolumeDetachTimeoutSeconds",
    "nodeDeletionTimeoutSeconds",
)

_MISSING = object()


class EmulatorError(Exception):
    """CAPI would fail the reconcile (bad status, undecodable or inapplicable patch), not roll out."""


@dataclass(frozen=True)
class Difference:
    """One remaining difference after patching: which request object, and where in its compared spec."""

    obj: str
    pointer: str

    def __str__(self) -> str:
        return f"{self.obj} {self.pointer or '/'}"


@dataclass(frozen=True)
class EmulatorResult:
    outcome: Outcome
    diff: tuple[Difference, ...]
    patched: Mapping[str, Any]  # the request's current objects after applying the response patches

    @property
    def in_place(self) -> bool:
        return self.outcome == "in-place"


def emulate_can_update_machine(
    request_json: Mapping[str, Any], response_json: Mapping[str, Any]
) -> EmulatorResult:
    """What KCP concludes from a CanUpdateMachine response (docs/capi-hooks.md §7.2)."""
    return _emulate(request_json, response_json, _MACHINE_OBJECTS)


def emulate_can_update_machine_set(
    request_json: Mapping[str, Any], response_json: Mapping[str, Any]
) -> EmulatorResult:
    """What the MachineDeployment controller concludes from a CanUpdateMachineSet response (§7.2)."""
    return _emulate(request_json, response_json, _MACHINE_SET_OBJECTS)


def _emulate(
    request_json: Mapping[str, Any],
    response_json: Mapping[str, Any],
    objects: tuple[tuple[str, str, tuple[str, ...], bool], ...],
) -> EmulatorResult:
    status = response_json.get("status")
    if status != "Success":
        raise EmulatorError(f"response status is {status!r}, not 'Success': reconcile error, no fallback")
    current = request_json["current"]
    desired = request_json["desired"]
    patched: dict[str, Any] = {}
    diff: list[Difference] = []
    for key, patch_field, spec_path, is_machine in objects:
        if key not in current:
            # An absent object (bootstrapConfigTemplate without configRef) ignores its patch (§5.3).
            continue
        obj = current[key]
        patch = response_json.get(patch_field)
        if patch is not None:
            obj = _apply_patch_field(obj, patch, patch_field, spec_path)
        patched[key] = obj
        got = _get_path(obj, spec_path)
        want = _get_path(desired.get(key, {}), spec_path)
        if is_machine:
            got, want = _cleanup_machine_spec(got), _cleanup_machine_spec(want)
        diff.extend(Difference(key, p) for p in _diff_pointers(got, want, ""))
    return EmulatorResult("in-place" if not diff else "rollout", tuple(diff), patched)


def _apply_patch_field(obj: Any, patch: Any, field: str, spec_path: tuple[str, ...]) -> Any:
    """Apply one response Patch to the whole object and copy back only the spec part (§3.3)."""
    if not isinstance(patch, Mapping):
        raise EmulatorError(f"{field}: not an object")
    patch_type = patch.get("patchType") or ""
    raw = patch.get("patch") or ""
    if not patch_type and not raw:
        return obj  # Patch.IsDefined() is false: skipped
    if not patch_type:
        raise EmulatorError(f"{field}: patchType is not set")
    document = _decode_base64_json(raw, field) if raw else _MISSING
    if patch_type == "JSONPatch":
        if document is _MISSING:
            raise EmulatorError(f"{field}: empty JSONPatch document cannot be decoded")
        result = apply_json_patch(obj, document)
    elif patch_type == "JSONMergePatch":
        result = obj if document is _MISSING else apply_merge_patch(obj, document)
    else:
        raise EmulatorError(f"{field}: unknown patchType {patch_type!r}")
    # Only spec (or spec.template.spec) is copied back; the rest of the patched object is thrown away.
    kept = copy.deepcopy(obj)
    new_spec = _get_path(result, spec_path)
    parent = kept
    for part in spec_path[:-1]:
        parent = parent.setdefault(part, {})
    if new_spec is _MISSING:
        parent.pop(spec_path[-1], None)
    else:
        parent[spec_path[-1]] = new_spec
    return kept


def _decode_base64_json(raw: Any, field: str) -> Any:
    if not isinstance(raw, str):
        raise EmulatorError(f"{field}.patch: must be a base64 string, got {type(raw).__name__}")
    try:
        # Go's []byte JSON decoding accepts only standard, padded base64 (RFC 4648 §4).
        data = base64.b64decode(raw.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError) as exc:
        raise EmulatorError(f"{field}.patch: not standard padded base64: {exc}") from exc
    try:
        return json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise EmulatorError(f"{field}.patch: decoded bytes are not JSON: {exc}") from exc


# --- RFC 6902 with evanphx/json-patch v5 default options --------------------------------------------------


def apply_json_patch(doc: Any, ops: Any) -> Any:
    """Apply an RFC 6902 document strictly: missing targets, missing parents and failed tests are errors."""
    if not isinstance(ops, list):
        raise EmulatorError("JSONPatch document is not an array")
    result = copy.deepcopy(doc)
    for index, op in enumerate(ops):
        try:
            result = _apply_op(result, op)
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise EmulatorError(f"JSONPatch op {index} ({_op_summary(op)}) failed: {exc}") from exc
    return result


def _op_summary(op: Any) -> str:
    if isinstance(op, Mapping):
        return f"{op.get('op')} {op.get('path')}"
    return "not an object"


def _apply_op(doc: Any, op: Any) -> Any:
    if not isinstance(op, Mapping):
        raise TypeError("operation is not an object")
    kind = op.get("op")
    path = _parse_pointer(op.get("path"))
    if kind == "add":
        return _add(doc, path, copy.deepcopy(_required(op, "value")))
    if kind == "remove":
        return _remove(doc, path)[0]
    if kind == "replace":
        doc, _ = _remove(doc, path)
        return _add(doc, path, copy.deepcopy(_required(op, "value")))
    if kind == "move":
        source = _parse_pointer(op.get("from"))
        if path[: len(source)] == source and len(path) > len(source):
            raise ValueError("cannot move a value into one of its children")
        doc, value = _remove(doc, source)
        return _add(doc, path, value)
    if kind == "copy":
        return _add(doc, path, copy.deepcopy(_resolve(doc, _parse_pointer(op.get("from")))))
    if kind == "test":
        if not json_equal(_resolve(doc, path), _required(op, "value")):
            raise ValueError("test op: value differs")
        return doc
    raise ValueError(f"unknown op {kind!r}")


def _required(op: Mapping[str, Any], key: str) -> Any:
    if key not in op:
        raise KeyError(f"missing {key!r}")
    return op[key]


def _parse_pointer(pointer: Any) -> list[str]:
    if not isinstance(pointer, str):
        raise TypeError("path is not a string")
    if pointer == "":
        return []
    if not pointer.startswith("/"):
        raise ValueError(f"pointer {pointer!r} does not start with '/'")
    return [part.replace("~1", "/").replace("~0", "~") for part in pointer[1:].split("/")]


def _array_index(container: list[Any], token: str, *, for_add: bool) -> int:
    if for_add and token == "-":
        return len(container)
    # Stricter than evanphx in one place: it accepts negative indices by default; producers never need them.
    if not token.isdigit() or (len(token) > 1 and token.startswith("0")):
        raise ValueError(f"bad array index {token!r}")
    index = int(token)
    limit = len(container) if for_add else len(container) - 1
    if index > limit:
        raise IndexError(f"array index {index} out of range")
    return index


def _resolve(doc: Any, path: list[str]) -> Any:
    node = doc
    for token in path:
        if isinstance(node, dict):
            if token not in node:
                raise KeyError(f"missing key {token!r}")
            node = node[token]
        elif isinstance(node, list):
            node = node[_array_index(node, token, for_add=False)]
        else:
            raise TypeError(f"cannot descend into a {type(node).__name__}")
    return node


def _add(doc: Any, path: list[str], value: Any) -> Any:
    if not path:
        return value
    parent = _resolve(doc, path[:-1])  # a missing parent is an error (no EnsurePathExistsOnAdd)
    token = path[-1]
    if isinstance(parent, dict):
        parent[token] = value
    elif isinstance(parent, list):
        parent.insert(_array_index(parent, token, for_add=True), value)
    else:
        raise TypeError(f"cannot add into a {type(parent).__name__}")
    return doc


def _remove(doc: Any, path: list[str]) -> tuple[Any, Any]:
    if not path:
        raise ValueError("cannot remove the whole document")
    parent = _resolve(doc, path[:-1])
    token = path[-1]
    if isinstance(parent, dict):
        if token not in parent:
            raise KeyError(f"missing key {token!r}")  # no AllowMissingPathOnRemove
        return doc, parent.pop(token)
    if isinstance(parent, list):
        return doc, parent.pop(_array_index(parent, token, for_add=False))
    raise TypeError(f"cannot remove from a {type(parent).__name__}")


# --- RFC 7386 -----------------------------------------------------------------------------------------------


def apply_merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge recursively, ``null`` deletes a key, anything else (arrays too) replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = apply_merge_patch(result.get(key), value)
    return result


# --- comparison ---------------------------------------------------------------------------------------------


def _get_path(obj: Any, path: tuple[str, ...]) -> Any:
    node = obj
    for part in path:
        if not isinstance(node, Mapping) or part not in node:
            return _MISSING
        node = node[part]
    return node


def _cleanup_machine_spec(spec: Any) -> Any:
    """CleanupMachineSpecForDiff, on JSON: ignored fields removed, typed zero values made equal to absence."""
    if not isinstance(spec, Mapping):
        return spec
    cleaned = {k: v for k, v in spec.items() if k not in _IGNORED_MACHINE_FIELDS + _IGNORED_MACHINE_LISTS}
    deletion = cleaned.get("deletion")
    if isinstance(deletion, Mapping):
        rest = {k: v for k, v in deletion.items() if k not in _IGNORED_DELETION_FIELDS}
        if rest:
            cleaned["deletion"] = rest
        else:
            del cleaned["deletion"]
    # The Machine spec is a typed Go struct: "" and null are its zero values, the same as an absent field.
    return {k: v for k, v in cleaned.items() if v is not None and v != ""}


def json_equal(a: Any, b: Any) -> bool:
    """Structural JSON equality: bool is not a number, [] / {} / null / absent all differ (go-cmp, §7.3)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(json_equal(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(json_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b
    return type(a) is type(b) and a == b


def _diff_pointers(got: Any, want: Any, prefix: str) -> list[str]:
    """Pointers where ``got`` and ``want`` differ; descends only where both sides are objects."""
    if isinstance(got, dict) and isinstance(want, dict):
        found: list[str] = []
        for key in sorted(got.keys() | want.keys()):
            child = prefix + "/" + key.replace("~", "~0").replace("/", "~1")
            found.extend(_diff_pointers(got.get(key, _MISSING), want.get(key, _MISSING), child))
        return found
    if got is _MISSING and want is _MISSING:
        return []
    if got is _MISSING or want is _MISSING or not json_equal(got, want):
        return [prefix]
    return []
