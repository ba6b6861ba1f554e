"""JSON pointers (RFC 6901) and structural equality over plain JSON values, as CAPI compares them.

Used by the patch builder and the decision code; knows nothing about Kubernetes kinds.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final, TypeGuard


class _Missing:
    """The absence of a key, not ``None`` (JSON null): absent, null, [] and {} all differ for CAPI."""

    _instance: _Missing | None = None

    def __new__(cls) -> _Missing:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "MISSING"

    def __bool__(self) -> bool:
        return False


MISSING: Final = _Missing()


def parse_pointer(pointer: str) -> tuple[str, ...]:
    """``"/a/b~1c"`` -> ``("a", "b/c")``; ``""`` is the whole document."""
    if pointer == "":
        return ()
    if not pointer.startswith("/"):
        raise ValueError(f"JSON pointer must start with '/': {pointer!r}")
    return tuple(part.replace("~1", "/").replace("~0", "~") for part in pointer[1:].split("/"))


def join_pointer(tokens: tuple[str, ...] | list[str]) -> str:
    return "".join("/" + token.replace("~", "~0").replace("/", "~1") for token in tokens)


def is_object(value: Any) -> TypeGuard[Mapping[str, Any]]:
    """A JSON object (any Mapping); plain dicts and common scalars are answered without the ABC check."""
    kind = type(value)
    return kind is dict or (kind not in _NOT_MAPPINGS and isinstance(value, Mapping))


# types that are never a Mapping, answered without the (slow, Python-level) ABC instance check
_NOT_MAPPINGS: Final = frozenset({str, int, float, bool, list, type(None), _Missing})


def get_in(doc: Any, tokens: tuple[str, ...]) -> Any:
    """The value at ``tokens`` descending through objects only, or ``MISSING``."""
    node = doc
    for token in tokens:
        if (type(node) is not dict and not is_object(node)) or token not in node:
            return MISSING
        node = node[token]
    return node


def json_equal(a: Any, b: Any) -> bool:
    """Exact JSON equality (go-cmp on decoded JSON): ``True`` is not ``1``; [], {}, null, absent differ."""
    kind = type(a)
    if kind is type(b):  # fast paths for the plain JSON types; the general rules below give the same answers
        if kind in _SCALARS:
            return bool(a == b)
        if kind is dict:
            return a.keys() == b.keys() and _all_equal(a.values(), map(b.__getitem__, a))
        if kind is list:
            return len(a) == len(b) and _all_equal(a, b)
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if is_object(a) and is_object(b):
        return a.keys() == b.keys() and all(json_equal(a[key], b[key]) for key in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(json_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, int | float) and isinstance(b, int | float):
        return bool(a == b)
    return type(a) is type(b) and bool(a == b)


_SCALARS: Final = frozenset({str, int, float, bool, type(None)})


def _all_equal(values: Iterable[Any], others: Iterable[Any]) -> bool:
    """json_equal for every pair, with same-typed scalars (the common case) compared inline."""
    for value, other in zip(values, others, strict=True):  # callers checked the lengths
        kind = type(value)
        if kind is type(other) and kind in _SCALARS:
            if value != other:
                return False
        elif not json_equal(value, other):
            return False
    return True


def changed_pointers(current: Any, desired: Any, prefix: str = "") -> list[str]:
    """Pointers (under ``prefix``) where two JSON values differ, finest where both sides are objects.

    An object on one side and absence on the other is descended into, so a new subtree reports its
    leaves; an empty object against absence is reported at its own pointer (they differ for CAPI).
    Pointers come in sorted key order, depth first.
    """
    found: list[str] = []
    _diff(current, desired, prefix, found)
    return found


def _diff(current: Any, desired: Any, prefix: str, found: list[str]) -> None:
    current_is_object, desired_is_object = is_object(current), is_object(desired)
    if current_is_object and desired_is_object:
        keys = current.keys()
        for key in sorted(keys if keys == desired.keys() else keys | desired.keys()):
            old, new = current.get(key, MISSING), desired.get(key, MISSING)
            kind = type(old)
            if kind is type(new) and kind in _SCALARS:  # the common leaf: json_equal is == here
                if old != new:
                    found.append(_child(prefix, key))
            else:
                _diff(old, new, _child(prefix, key), found)
    elif current is MISSING:
        if desired is MISSING:
            return
        if desired_is_object and desired:
            _diff({}, desired, prefix, found)
        else:
            found.append(prefix)
    elif desired is MISSING:
        if current_is_object and current:
            _diff(current, {}, prefix, found)
        else:
            found.append(prefix)
    elif not json_equal(current, desired):
        found.append(prefix)


def _child(prefix: str, key: str) -> str:
    if "~" in key or "/" in key:
        key = key.replace("~", "~0").replace("/", "~1")
    return f"{prefix}/{key}"


def is_under(pointer: str, ancestor: str) -> bool:
    """``pointer`` equals ``ancestor`` or lies inside its subtree."""
    return pointer == ancestor or pointer.startswith(ancestor + "/")
