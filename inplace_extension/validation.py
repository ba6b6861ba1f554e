"""Pydantic's validation errors in words for people: the one place that turns them into messages.

Every model the package validates (the settings, the capabilities file, the inventory, a hook request,
an MCM MachineClass's ``inPlaceUpdate``) has its errors worded here, so that no message shows a raw
regular expression or pydantic's own phrasing of a Python type:

- a value that does not match a pattern says what is expected, with an example: each pattern is
  declared with :func:`described` where it is defined (an undescribed one says only "does not have the
  expected form", and ``tests/test_validation.py`` fails on it);
- an unknown key lists the valid keys at that place, with a "did you mean" when one is close (difflib);
- a wrong type says which type is wanted, in the words of the document (YAML or JSON).

Inputs are never part of a message (they may hold addresses, keys or request data); the location is
returned apart, for the caller to place (a YAML line, a request field path, a flag or a variable).
"""

from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

Document = Literal["yaml", "json"]

# pattern (as given to Field(pattern=...)) -> what it asks for, e.g. "an http(s) URL ..., e.g. ..."
_MEANINGS: dict[str, str] = {}


def described(pattern: str, meaning: str) -> str:
    """Declare what ``pattern`` asks for in words ("a kind: a capital letter, then letters and digits,
    e.g. Metal3Machine"); returns the pattern, so it is declared where it is defined."""
    _MEANINGS[pattern] = meaning
    return pattern


def meaning_of(pattern: str) -> str | None:
    """The words declared for ``pattern`` with :func:`described`, or None."""
    return _MEANINGS.get(pattern)


@dataclass(frozen=True)
class Problem:
    """One validation problem: where (pydantic's location: keys and list indexes) and what, in words."""

    loc: tuple[int | str, ...]
    message: str


# the type errors, in the words of each kind of document
_TYPES: dict[str, tuple[str, str]] = {  # error type -> (YAML words, JSON words)
    "model_type": ("must be a mapping (key: value)", "must be a JSON object"),
    "model_attributes_type": ("must be a mapping (key: value)", "must be a JSON object"),
    "dict_type": ("must be a mapping (key: value)", "must be a JSON object"),
    "list_type": ("must be a list", "must be a JSON array"),
    "string_type": ("must be a string", "must be a string"),
    "int_type": ("must be an integer", "must be an integer"),
    "int_parsing": ("must be an integer", "must be an integer"),
    "int_from_float": ("must be a whole number", "must be an integer"),
    "float_type": ("must be a number", "must be a number"),
    "float_parsing": ("must be a number", "must be a number"),
    "bool_type": ("must be true or false", "must be a boolean"),
    "bool_parsing": ("must be true or false", "must be a boolean"),
    "missing": ("missing: this key is required", "missing"),
}


# the range errors: error type -> (words, the ctx key of the bound)
_BOUNDS: dict[str, tuple[str, str]] = {
    "greater_than_equal": ("must be at least", "ge"),
    "greater_than": ("must be more than", "gt"),
    "less_than_equal": ("must be at most", "le"),
    "less_than": ("must be less than", "lt"),
    "too_short": ("must have at least this many items:", "min_length"),
    "too_long": ("must have at most this many items:", "max_length"),
    "string_too_short": ("must have at least this many characters:", "min_length"),
    "string_too_long": ("must have at most this many characters:", "max_length"),
}


def problems(
    exc: ValidationError, model: type[BaseModel] | None = None, document: Document = "yaml"
) -> list[Problem]:
    """Every error of ``exc`` worded for people; ``model`` (the validated class) lets an unknown key list
    the valid ones."""
    return [
        Problem(tuple(error["loc"]), message(error, model, document))
        for error in exc.errors(include_url=False, include_input=False)
    ]


def message(error: ErrorDetails, model: type[BaseModel] | None = None, document: Document = "yaml") -> str:
    """One pydantic error in words (its location not included)."""
    kind = error["type"]
    context = error.get("ctx") or {}
    if kind == "extra_forbidden":
        return unknown_key(str(error["loc"][-1]), _keys_at(model, tuple(error["loc"])[:-1]))
    if kind == "string_pattern_mismatch":
        meaning = meaning_of(str(context.get("pattern", "")))
        return f"must be {meaning}" if meaning else "does not have the expected form"
    if kind == "literal_error":
        return f"must be one of {context.get('expected', '')}"
    if kind in _BOUNDS:
        words, bound = _BOUNDS[kind]
        return f"{words} {context.get(bound)}"
    if kind in _TYPES:
        yaml_words, json_words = _TYPES[kind]
        return yaml_words if document == "yaml" else json_words
    if kind == "value_error":
        # a validator's own ValueError: pydantic prefixes "Value error, "
        return str(error["msg"]).removeprefix("Value error, ")
    if kind == "assertion_error":
        return str(error["msg"]).removeprefix("Assertion failed, ")
    return _lowercase_first(str(error["msg"]))


def unknown_key(key: str, valid: Sequence[str]) -> str:
    """``not a known key; did you mean "x"? The keys here: a, b, c`` (without the list when none is known)."""
    if not valid:
        return "not a known key"
    close = difflib.get_close_matches(key, valid, n=1, cutoff=0.6)
    guess = f' (did you mean "{close[0]}"?)' if close else ""
    return f"not a known key{guess}; the keys here: {', '.join(valid)}"


def close_match(word: str, valid: Sequence[str]) -> str | None:
    """The one name of ``valid`` that ``word`` is most likely a misspelling of, or None (difflib)."""
    close = difflib.get_close_matches(word, valid, n=1, cutoff=0.6)
    return close[0] if close else None


def keys_at(model: type[BaseModel], loc: Sequence[int | str]) -> list[str]:
    """The keys ``model`` accepts at ``loc`` (a mapping's place in the document; none known: ``[]``)."""
    return _keys_at(model, tuple(loc))


def _lowercase_first(text: str) -> str:
    # pydantic's "Input should be ..." reads "input should be ..." after "field: "
    return text[:1].lower() + text[1:]


def _keys_at(model: type[BaseModel] | None, loc: tuple[int | str, ...]) -> list[str]:
    """The keys the model accepts at ``loc`` (a mapping's place in the document), in declaration order."""
    found = _model_at(model, loc) if model is not None else None
    if found is None:
        return []
    return [field.alias or name for name, field in found.model_fields.items()]


def _model_at(model: type[BaseModel], loc: tuple[int | str, ...]) -> type[BaseModel] | None:
    annotation: Any = model
    for part in loc:
        annotation = _unwrap(annotation)
        origin = typing.get_origin(annotation)
        if isinstance(part, int) and origin is list:
            annotation = typing.get_args(annotation)[0]
        elif isinstance(annotation, type) and issubclass(annotation, BaseModel):
            field = annotation.model_fields.get(str(part)) or next(
                (f for f in annotation.model_fields.values() if f.alias == part), None
            )
            if field is None:
                return None
            annotation = field.annotation
        elif origin is dict:
            annotation = typing.get_args(annotation)[1]
        else:
            return None
    annotation = _unwrap(annotation)
    return annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None


def _unwrap(annotation: Any) -> Any:
    """``X | None`` and ``Annotated[X, ...]`` -> ``X`` (a union of several models is left as it is)."""
    while True:
        origin = typing.get_origin(annotation)
        if origin is typing.Annotated:
            annotation = typing.get_args(annotation)[0]
        elif origin is typing.Union or isinstance(annotation, types.UnionType):
            kinds = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
            if len(kinds) != 1:
                return annotation
            annotation = kinds[0]
        else:
            return annotation
