"""Claims -> RFC 6902 ops: copy desired's subtree over current at each claimed pointer, absence too.

Ops are emitted directly per claim (only ``add``, ``remove`` and ``replace``; whole subtrees, no list-index
ops), rooted at the object (``/spec/...`` or ``/spec/template/spec/...``) because CAPI applies them to the
whole ``current`` object with evanphx/json-patch (docs/capi-hooks.md §3.3). That applier refuses
``replace`` or ``remove`` of a missing path and ``add`` under a missing parent, so absent fields are
added at the highest missing ancestor. The spec is never deep-copied: only the dicts along a written path are.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from inplace_extension.inplace.pointers import MISSING, get_in, is_object, join_pointer, json_equal


class SpecPatch:
    """A current machine spec being brought to desired at claimed pointers, with the ops that do it."""

    def __init__(self, current: Mapping[str, Any], desired: Mapping[str, Any], root: str) -> None:
        self.spec: Mapping[str, Any] = current
        self.ops: list[dict[str, Any]] = []
        self._desired = desired
        self._root = root

    def claim(self, tokens: tuple[str, ...]) -> str | None:
        """Make the spec match desired at ``tokens``; returns why it cannot (non-object parent), else None."""
        if not tokens:
            raise ValueError("a claim needs a pointer below the spec root")
        current = get_in(self.spec, tokens)
        desired = get_in(self._desired, tokens)
        if current is not MISSING and desired is not MISSING and json_equal(current, desired):
            return None
        if current is MISSING and desired is MISSING:
            return None
        missing_at = self._first_missing(tokens)
        if missing_at is None:
            return "a parent of the field is not an object"
        if desired is MISSING:
            self._remove(tokens)
        elif missing_at == len(tokens):
            self._write(tokens, desired)
            self.ops.append({"op": "replace", "path": self._path(tokens), "value": desired})
        else:
            # Build the missing ancestors around the value and add them in one op at the highest one.
            value: Any = desired
            for token in reversed(tokens[missing_at + 1 :]):
                value = {token: value}
            self._write(tokens[: missing_at + 1], value)
            self.ops.append({"op": "add", "path": self._path(tokens[: missing_at + 1]), "value": value})
        return None

    def _first_missing(self, tokens: tuple[str, ...]) -> int | None:
        """Index of the first absent token (len(tokens) if none); None when a parent is not an object."""
        node: Any = self.spec
        for index, token in enumerate(tokens):
            if not is_object(node):
                return None
            if token not in node:
                return index
            node = node[token]
        return len(tokens)

    def _remove(self, tokens: tuple[str, ...]) -> None:
        # Also drop ancestors that only existed to hold this field when desired lacks them, so a claim of a
        # nested field (e.g. /clusterConfiguration/etcd/local/imageTag) does not leave {} behind.
        depth = len(tokens)
        while depth > 1:
            parent = get_in(self.spec, tokens[: depth - 1])
            if (
                not (is_object(parent) and len(parent) == 1)
                or get_in(self._desired, tokens[: depth - 1]) is not MISSING
            ):
                break
            depth -= 1
        self._write(tokens[:depth], MISSING)
        self.ops.append({"op": "remove", "path": self._path(tokens[:depth])})

    def _write(self, tokens: tuple[str, ...], value: Any) -> None:
        """Set (or delete, for MISSING) a value, copying only the dicts along the path."""
        root = dict(self.spec)
        node = root
        for token in tokens[:-1]:
            child = dict(node[token])
            node[token] = child
            node = child
        if value is MISSING:
            del node[tokens[-1]]
        else:
            node[tokens[-1]] = value
        self.spec = root

    def _path(self, tokens: tuple[str, ...]) -> str:
        return self._root + join_pointer(tokens)
