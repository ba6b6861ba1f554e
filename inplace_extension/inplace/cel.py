"""CEL expressions over one Kubernetes object, the language of the ``kubernetes`` health checks
(docs/capabilities.md): compiled once when the capabilities file is read, evaluated against the object as
the API server sent it (a plain dict), bound to the one name ``object``.

Built on cel-python (``celpy``, pure Python). It checks syntax when compiling but finds undeclared names
only when evaluating, so :func:`compile_expression` also refuses names other than ``object`` (and the
variables a macro such as ``exists(c, ...)`` binds): a typo must stop the start, not leave a rollout
waiting for an expression that can never hold. Evaluation never raises: a missing field or a wrong type
is an :class:`Evaluation` that does not hold, with CEL's error in one short line.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    import celpy

ROOT: Final = "object"
# macros whose first argument is a variable bound in the others: list.exists(c, c.type == "Ready")
MACROS: Final = frozenset({"all", "exists", "exists_one", "map", "filter"})
# type names CEL expressions may use as values: type(object.spec.replicas) == int
TYPE_NAMES: Final = frozenset(
    {"bool", "bytes", "double", "duration", "int", "list", "map", "null_type", "string", "timestamp"}
    | {"type", "uint"}
)
MAX_ERROR: Final = 200  # characters of a CEL error kept in a message (one line, no object content)


@functools.cache
def _environment() -> celpy.Environment:
    """Built on first use, celpy imported with it: both cost about half a second of CPU (its parser), which a
    process that never compiles an expression (the ``attempt`` command in a Job) does not pay."""
    import celpy
    from celpy import celtypes

    return celpy.Environment(annotations={ROOT: celtypes.MapType})


class ExpressionError(ValueError):
    """Not a CEL expression this service can evaluate; the message says why in one line."""


@dataclass(frozen=True)
class Evaluation:
    """One evaluation: ``holds`` only when the expression gave ``true``; ``error`` is CEL's when it failed."""

    holds: bool
    error: str | None = None


@dataclass(frozen=True)
class Expression:
    """A compiled expression; ``text`` is what the user wrote (messages quote it)."""

    text: str
    _program: Any = field(repr=False, compare=False)
    # the run service evaluates from worker threads; celpy does not say its programs are thread-safe
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def evaluate(self, obj: Mapping[str, Any]) -> Evaluation:
        """``true`` holds; ``false``, another value or an error does not (never raises)."""
        from celpy import celtypes
        from celpy.adapter import json_to_cel
        from celpy.evaluation import CELEvalError

        try:
            with self._lock:
                result = self._program.evaluate({ROOT: json_to_cel(dict(obj))})
        except CELEvalError as exc:
            return Evaluation(False, _short(exc))
        except Exception as exc:  # the library's own failures must not stop the health gate either
            return Evaluation(False, _short(exc))
        if isinstance(result, CELEvalError):  # an error can come back as a value, too
            return Evaluation(False, _short(result))
        if not isinstance(result, celtypes.BoolType):
            return Evaluation(False, f"the value is of type {_type_name(result)}, not bool")
        return Evaluation(bool(result))


def compile_expression(text: str) -> Expression:
    """Compile ``text``; :class:`ExpressionError` when it is not CEL or names more than ``object``."""
    from celpy.celparser import CELParseError

    try:
        tree = _environment().compile(text)
    except CELParseError as exc:
        where = f" at column {exc.column}" if exc.column else ""
        raise ExpressionError(f"not a CEL expression: syntax error{where}") from None
    unknown = sorted(_free_names(tree) - {ROOT} - TYPE_NAMES)
    if unknown:
        raise ExpressionError(
            f"unknown name {unknown[0]!r}: the expression sees the object as {ROOT!r} (object.status...)"
        )
    return Expression(text, _environment().program(tree))


def _free_names(tree: Any) -> set[str]:
    """Identifiers the expression reads, less the variables its macros bind (anywhere in it)."""
    names: set[str] = set()
    bound: set[str] = set()
    for subtree in tree.iter_subtrees():
        if subtree.data == "ident":
            names.add(str(subtree.children[0]))
        elif subtree.data == "member_dot_arg" and str(subtree.children[1]) in MACROS:
            arguments = subtree.children[2] if len(subtree.children) > 2 else None
            first = arguments.children[0] if arguments is not None and arguments.children else None
            idents = [t for t in first.iter_subtrees() if t.data == "ident"] if first is not None else []
            if len(idents) == 1:
                bound.add(str(idents[0].children[0]))
    return names - bound


def _short(error: BaseException) -> str:
    """CEL's message, one line: the first argument, without the evaluation context it may append."""
    message = str(error.args[0]) if error.args else type(error).__name__
    message = message.split(" (in activation", 1)[0].replace("\n", " ")
    return message if len(message) <= MAX_ERROR else message[: MAX_ERROR - 3] + "..."


def _type_name(value: Any) -> str:
    name = type(value).__name__
    return name.removesuffix("Type").lower() if name.endswith("Type") else name
