"""Logging setup: text or JSON lines through one root handler, uvicorn's loggers included."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest

from inplace_extension.logs import configure_logging


@pytest.fixture
def restore_root() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for handler in list(root.handlers):
        root.removeHandler(handler)
    for handler in handlers:
        root.addHandler(handler)
    root.setLevel(level)


def test_json_format_writes_one_object_per_line(restore_root: None) -> None:
    stream = io.StringIO()
    configure_logging("json", "info", stream=stream)
    logging.getLogger("inplace_extension.hooks.can_update").info(
        "hook=%s decision=%s", "CanUpdateMachine", "rollout"
    )
    logging.getLogger("uvicorn.error").info("Started server process")
    logging.getLogger("inplace_extension").debug("not at INFO")
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [line["message"] for line in lines] == [
        "hook=CanUpdateMachine decision=rollout",
        "Started server process",
    ]
    assert lines[0]["level"] == "INFO"
    assert lines[0]["logger"] == "inplace_extension.hooks.can_update"


def test_json_format_carries_the_traceback(restore_root: None) -> None:
    stream = io.StringIO()
    configure_logging("json", "INFO", stream=stream)
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        logging.getLogger("inplace_extension.app").exception(
            "hook=UpdateMachine decision=failure reason=InternalError"
        )
    line = json.loads(stream.getvalue())
    assert "RuntimeError: boom" in line["exception"]


def test_unknown_format_is_refused() -> None:
    with pytest.raises(ValueError, match="text, json"):
        configure_logging("xml", "INFO")
