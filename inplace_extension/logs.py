"""Logging setup for the service: one handler on the root logger, ``text`` or ``json`` lines.

Modules log with ``logging.getLogger(__name__)`` and one ``key=value`` line per decision
(``hook=CanUpdateMachine machine=default/m1 decision=in-place``). Request bodies are never logged:
KubeadmConfig ``joinConfiguration.discovery`` carries bootstrap tokens (docs/capi-hooks.md §6.4).
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import TextIO

LOG_FORMATS = ("text", "json")
_TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"


class TextFormatter(logging.Formatter):
    """The standard formatter, with the date and time part of a timestamp made once per second.

    Every hook answer logs a line; ``time.localtime`` + ``strftime`` for each was a visible share of it.
    """

    def __init__(self, fmt: str | None = None) -> None:
        super().__init__(fmt)
        self._stamp: tuple[int, str | None, str] = (-1, None, "")  # (second, datefmt, formatted)

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        second = int(record.created)
        cached_second, cached_datefmt, stamp = self._stamp
        if second != cached_second or datefmt != cached_datefmt:
            stamp = time.strftime(datefmt or self.default_time_format, self.converter(record.created))
            self._stamp = (second, datefmt, stamp)
        if datefmt or not self.default_msec_format:
            return stamp
        return self.default_msec_format % (stamp, record.msecs)


class JsonFormatter(TextFormatter):
    """One JSON object per line: time, level, logger, message (+ exception text when there is one)."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, str] = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False)


def configure_logging(log_format: str, level: str, stream: TextIO | None = None) -> None:
    """Route every logger (ours and uvicorn's) through one handler in the chosen format."""
    if log_format not in LOG_FORMATS:
        raise ValueError(f"log format must be one of {', '.join(LOG_FORMATS)}")
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter(_TEXT_FORMAT))
    # neither format shows thread or process names: do not look them up for every record
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    # uvicorn installs its own handlers and levels unless told otherwise (a Config with log_level sets
    # them for the whole process): make its loggers propagate to ours and follow the root's level
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logger = logging.getLogger(name)
        logger.handlers.clear()
        logger.setLevel(logging.NOTSET)
        logger.propagate = True
    # the Kubernetes client's transport logs one INFO line per API request (drains poll every second),
    # and its connection layer half a dozen DEBUG lines more: --log-level debug is for our decisions
    for name in ("httpx", "httpx2", "httpcore", "httpcore2"):
        logging.getLogger(name).setLevel(max(logging.WARNING, root.level))
    # the AWS SDK's DEBUG lines carry each signed request's headers (the access key id, the signature)
    # and its bodies: never below INFO, whatever --log-level says
    for name in ("boto3", "botocore", "s3transfer", "urllib3"):
        logging.getLogger(name).setLevel(max(logging.INFO, root.level))
