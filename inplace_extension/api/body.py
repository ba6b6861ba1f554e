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
from inplace_extension.validation import close_match, keys_at, problems

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


# how many problems one answer names (a body with many wrong fields names the first ones and the count)
SHOWN_PROBLEMS = 5


def to_invalid_request(
    exc: ValidationError, model: type[BaseModel] | None = None, document: Any = None
) -> InvalidRequest:
    """The validation errors as one ``InvalidRequest``: the first one's field path, then every problem
    (up to :data:`SHOWN_PROBLEMS`, then how many more), each with its path, so that none is hidden behind
    a count. A required key that is missing where the ``document`` has a close one (``machin`` for
    ``machine``: the wire models ignore unknown keys, as Go's decoder does) says which it most likely
    meant."""
    found = problems(exc, model, "json")  # worded in inplace_extension/validation.py, in JSON terms
    worded = [_with_guess(problem.loc, problem.message, document, model) for problem in found]
    first = worded[0]
    if len(found) == 1:
        return InvalidRequest(field_path(found[0].loc), first)
    shown = [first] + [f"{field_path(p.loc)}: {w}" for p, w in zip(found[1:], worded[1:], strict=True)]
    rest = len(shown) - SHOWN_PROBLEMS
    text = "; ".join(shown[:SHOWN_PROBLEMS])
    if rest > 0:
        text += f" (and {rest} more problem{'s' if rest > 1 else ''})"
    return InvalidRequest(field_path(found[0].loc), text)


def _with_guess(
    loc: tuple[int | str, ...], message: str, document: Any, model: type[BaseModel] | None
) -> str:
    """``missing`` + the document's unknown key at that place that is most likely a misspelling of it."""
    if message != "missing" or not loc or not isinstance(loc[-1], str):
        return message
    known = set(keys_at(model, loc[:-1])) if model is not None else set()
    parent = document
    for part in loc[:-1]:
        if isinstance(parent, dict) and isinstance(part, str):
            parent = parent.get(part)
        elif isinstance(parent, list) and isinstance(part, int) and part < len(parent):
            parent = parent[part]
        else:
            return message
    if not isinstance(parent, dict):
        return message
    guess = close_match(loc[-1], [key for key in parent if isinstance(key, str) and key not in known])
    return f'{message} (the request has "{guess}": did you mean "{loc[-1]}"?)' if guess else message


def parse_request(model: type[ModelT], body: bytes) -> ModelT:
    """Bytes -> validated ``model``; any problem is an ``InvalidRequest`` naming the failing field path."""
    document = parse_json(body)
    try:
        return model.model_validate(document)
    except ValidationError as exc:
        raise to_invalid_request(exc, model, document) from None
