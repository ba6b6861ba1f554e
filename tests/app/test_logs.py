"""Logging setup: text or JSON lines through one root handler, uvicorn's loggers included."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest

from inplace_extension.logs import JsonFormatter, TextFormatter, configure_logging


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


@pytest.mark.parametrize("created", [1_700_000_000.0, 1_700_000_000.999, 1_700_000_001.25, 1_700_003_600.5])
def test_the_formatters_write_the_same_times_as_the_standard_one(created: float) -> None:
    text, json_lines, standard = TextFormatter(_TEXT), JsonFormatter(), logging.Formatter(_TEXT)
    for moment in (created, created + 0.001, created + 1.0, created):  # same second, next one, back
        record = logging.makeLogRecord({"msg": "hook=x", "created": moment, "msecs": (moment % 1) * 1000})
        assert text.format(record) == standard.format(record)
        iso = json.loads(json_lines.format(record))["time"]
        assert iso == standard.formatTime(record, "%Y-%m-%dT%H:%M:%S")


_TEXT = "%(asctime)s %(levelname)s %(name)s %(message)s"
