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

from extension.errors import InvalidRequest

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


def _check_tree(document: Any) -> None:
    # iterative walk: the depth bound and the non-finite check must not themselves recurse
    stack: list[tuple[Any, tuple[int | str, ...]]] = [(document, ())]
    while stack:
        value, loc = stack.pop()
        if isinstance(value, dict):
            if len(loc) >= MAX_DEPTH:
                raise InvalidRequest(field_path(loc), f"nested deeper than {MAX_DEPTH} levels")
            stack.extend((item, (*loc, key)) for key, item in value.items())
        elif isinstance(value, list):
            if len(loc) >= MAX_DEPTH:
                raise InvalidRequest(field_path(loc), f"nested deeper than {MAX_DEPTH} levels")
            stack.extend((item, (*loc, index)) for index, item in enumerate(value))
        elif isinstance(value, float) and not math.isfinite(value):
            raise InvalidRequest(field_path(loc), "number out of range")


def to_invalid_request(exc: ValidationError) -> InvalidRequest:
    """The first validation error as ``InvalidRequest`` naming its field path (+ how many more there are)."""
    errors = exc.errors(include_url=False, include_input=False, include_context=False)
    first = errors[0]
    problem = "missing" if first["type"] == "missing" else first["msg"]
    if len(errors) > 1:
        problem += f" (and {len(errors) - 1} more problem{'s' if len(errors) > 2 else ''})"
    return InvalidRequest(field_path(tuple(first["loc"])), problem)


def parse_request(model: type[ModelT], body: bytes) -> ModelT:
    """Bytes -> validated ``model``; any problem is an ``InvalidRequest`` naming the failing field path."""
    document = parse_json(body)
    try:
        return model.model_validate(document)
    except ValidationError as exc:
        raise to_invalid_request(exc) from None
