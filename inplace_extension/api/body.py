"""Request bytes -> wire model; JSON and pydantic errors become ``InvalidRequest`` (never echoing values).

JSON is parsed with pydantic-core's parser: strict UTF-8, no NaN/Infinity literals, and a nesting limit
(200), so a body of 10 000 nested arrays fails fast instead of exhausting the stack. Numbers that
overflow to infinity (``1e999``), which Go's decoder rejects too, are refused here with their path.
"""

from __future__ import annotations

import math
from typing import Any, TypeVar

import pydantic_core
from pydantic import BaseModel, ValidationError

from inplace_extension.errors import InvalidRequest
from inplace_extension.validation import problems

ModelT = TypeVar("ModelT", bound=BaseModel)

MAX_DEPTH = 64  # real CAPI objects nest about 12 deep; deeper data would only strain the core's recursion


def field_path(loc: tuple[int | str, ...]) -> str:
    """``("desired", "machine", "spec", "files", 2)`` -> ``desired.machine.spec.files[2]``."""
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path += f".{part}" if path else part
    return path or "(body)"


def parse_json(body: bytes) -> Any:
    """Parse a JSON document, refusing what Go's decoder would refuse and what nests deeper than MAX_DEPTH."""
    try:
        document = pydantic_core.from_json(body, allow_inf_nan=False)
    except ValueError as exc:
        # the parser's message says what and where ("expected value at line 1 column 6"), never the value
        raise InvalidRequest("(body)", f"invalid JSON: {exc}") from None
    _check_tree(document)
    return document


def _fits(value: Any, depth: int) -> bool:
    """Fast check of the whole tree: within MAX_DEPTH, no non-finite number (recursion <= MAX_DEPTH)."""
    if depth >= MAX_DEPTH:
        return False
    items = value.values() if type(value) is dict else value
    for item in items:
        kind = type(item)
        if kind is str:  # most values: nothing to check
            continue
        if kind is dict or kind is list:
            if not _fits(item, depth + 1):
                return False
        elif kind is float and not math.isfinite(item):
            return False
    return True


def _check_tree(document: Any) -> None:
    if type(document) not in (dict, list) or _fits(document, 0):
        return
    # something is wrong: walk again, iteratively, to name the field path of the first problem
    stack: list[tuple[Any, tuple[int | str, ...]]] = [(document, ())]
    while stack:
        value, loc = stack.pop()
        if isinstance(value, dict | list):
            if len(loc) >= MAX_DEPTH:
                raise InvalidRequest(field_path(loc), f"nested deeper than {MAX_DEPTH} levels")
            pairs = value.items() if isinstance(value, dict) else enumerate(value)
            stack.extend((item, (*loc, key)) for key, item in pairs)
        elif isinstance(value, float) and not math.isfinite(value):
            raise InvalidRequest(field_path(loc), "number out of range")


def to_invalid_request(exc: ValidationError, model: type[BaseModel] | None = None) -> InvalidRequest:
    """The first validation error as ``InvalidRequest`` naming its field path (+ how many more there are)."""
    found = problems(exc, model, "json")  # worded in inplace_extension/validation.py, in JSON terms
    first = found[0]
    problem = first.message
    if len(found) > 1:
        problem += f" (and {len(found) - 1} more problem{'s' if len(found) > 2 else ''})"
    return InvalidRequest(field_path(first.loc), problem)


def parse_request(model: type[ModelT], body: bytes) -> ModelT:
    """Bytes -> validated ``model``; any problem is an ``InvalidRequest`` naming the failing field path."""
    document = parse_json(body)
    try:
        return model.model_validate(document)
    except ValidationError as exc:
        raise to_invalid_request(exc, model) from None
