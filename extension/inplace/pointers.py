"""JSON pointers (RFC 6901) and structural equality over plain JSON values, as CAPI compares them.

Used by the patch builder and the decision code; knows nothing about Kubernetes kinds.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final


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


def get_in(doc: Any, tokens: tuple[str, ...]) -> Any:
    """The value at ``tokens`` descending through objects only, or ``MISSING``."""
    node = doc
    for token in tokens:
        if not isinstance(node, Mapping) or token not in node:
            return MISSING
        node = node[token]
    return node


def json_equal(a: Any, b: Any) -> bool:
    """Exact JSON equality (go-cmp on decoded JSON): ``True`` is not ``1``; [], {}, null, absent differ."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(json_equal(a[key], b[key]) for key in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(json_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b
    return type(a) is type(b) and a == b


def changed_pointers(current: Any, desired: Any, prefix: str = "") -> list[str]:
    """Pointers (under ``prefix``) where two JSON values differ, finest where both sides are objects.

    An object on one side and absence on the other is descended into, so a new subtree reports its
    leaves; an empty object against absence is reported at its own pointer (they differ for CAPI).
    """
    if isinstance(current, Mapping) and isinstance(desired, Mapping):
        found: list[str] = []
        for key in sorted(current.keys() | desired.keys()):
            found.extend(
                changed_pointers(
                    current.get(key, MISSING), desired.get(key, MISSING), prefix + join_pointer((key,))
                )
            )
        return found
    if current is MISSING and desired is MISSING:
        return []
    if current is MISSING and isinstance(desired, Mapping) and desired:
        return changed_pointers({}, desired, prefix)
    if desired is MISSING and isinstance(current, Mapping) and current:
        return changed_pointers(current, {}, prefix)
    if current is MISSING or desired is MISSING or not json_equal(current, desired):
        return [prefix]
    return []


def is_under(pointer: str, ancestor: str) -> bool:
    """``pointer`` equals ``ancestor`` or lies inside its subtree."""
    return pointer == ancestor or pointer.startswith(ancestor + "/")
