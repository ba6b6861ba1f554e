"""YAML configuration files read into pydantic models, with errors that say where: ``line N: field: why``.

Used by the inventory (``--inventory``, inplace_extension/runs/inventory.py) and the capabilities file
(``--capabilities-file``, capabilities_file.py). File content never appears in a message: it may
hold addresses, keys or anything a user wrote.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from inplace_extension.validation import problems

ModelT = TypeVar("ModelT", bound=BaseModel)


def read_file(path: Path, what: str, error: type[Exception]) -> str:
    """The UTF-8 text of ``path``; an unreadable file raises ``error("<what>: cannot read it (why)")``
    (the command line checked it could be opened, naming its flag: this is the later reload's, or a
    race's)."""
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise error(f"{what}: cannot read it ({exc.strerror or exc})") from None
    except UnicodeDecodeError as exc:
        raise error(f"{what}: not UTF-8 text (byte {exc.start})") from None


def load_model(path: Path, model: type[ModelT], what: str, error: type[Exception]) -> ModelT:
    """Read ``path`` and validate it as ``model``; any problem raises ``error("<what>: ...")``."""
    return parse_model(read_file(path, what, error), model, what, error)[0]


def parse_model(
    text: str, model: type[ModelT], what: str, error: type[Exception]
) -> tuple[ModelT, yaml.Node | None]:
    """Validate YAML ``text`` as ``model``; also return the composed node, for :func:`locate` later checks."""
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise error(f"{what}: {syntax_problem(exc)}") from None
    try:
        return model.model_validate({} if data is None else data), node
    except ValidationError as exc:
        raise error(f"{what}: " + "; ".join(yaml_problems(exc, node, model))) from None


def syntax_problem(exc: yaml.YAMLError) -> str:
    """A YAML syntax error as ``line N, column M: not valid YAML: <what>``: the place in the file the
    caller names, not PyYAML's ``in "<unicode string>"`` (the text was parsed from a string)."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or "cannot be parsed"
    context = getattr(exc, "context", None)
    what = f"{context}, {problem}" if context else str(problem)
    if mark is None:
        return f"not valid YAML: {what}"
    return f"line {mark.line + 1}, column {mark.column + 1}: not valid YAML: {what}"


def yaml_problems(exc: ValidationError, node: yaml.Node | None, model: type[BaseModel]) -> list[str]:
    """pydantic's errors as ``line N: field.path: message`` (lines from the composed YAML ``node``, the
    words from inplace_extension/validation.py: no raw pattern, the valid keys for an unknown one).

    Inputs are left out: they would echo file content into logs.
    """
    return [locate(node, problem.loc, problem.message) for problem in problems(exc, model, "yaml")]


def locate(node: yaml.Node | None, loc: tuple[Any, ...], message: str) -> str:
    """One problem at ``loc`` (a pydantic-style location) as ``line N: field.path: message``."""
    where = _line_of(node, loc)
    field = _dotted(loc) or "(top level)"
    return f"line {where}: {field}: {message}" if where else f"{field}: {message}"


def _dotted(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _line_of(node: yaml.Node | None, loc: tuple[Any, ...]) -> int | None:
    """1-based line of the deepest YAML node on the path ``loc`` (pydantic's error location)."""
    best: yaml.Node | None = node
    for part in loc:
        if isinstance(best, yaml.MappingNode) and isinstance(part, str):
            nxt = next((v for k, v in best.value if getattr(k, "value", None) == part), None)
        elif isinstance(best, yaml.SequenceNode) and isinstance(part, int) and part < len(best.value):
            nxt = best.value[part]
        else:
            nxt = None  # model-level validators add loc parts that are not YAML keys
        if nxt is None:
            break
        best = nxt
    return best.start_mark.line + 1 if best is not None else None
