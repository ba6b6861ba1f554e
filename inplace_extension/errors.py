"""The error model of the service and the one place that maps an error to what CAPI sees.

```
ExtensionError            .reason (stable CamelCase), .message (deterministic, secret-free)
├── RequestTooLarge       transport: the body passes the cap -> HTTP 413
└── InvalidRequest        hook: the body is not JSON or does not fit the hook's model -> 200 Failure
anything else             a bug: logged with its traceback -> 200 Failure "InternalError: see extension logs"
```

Host errors are not exceptions here: the run engine reports them as values (``runs.model.Progress``):
an unreachable host as "in progress, retry later", a failed task as a remembered ``Failure`` message
("not yet" and "can't do it" are values, not errors).

Unknown paths (404) and wrong methods (405) are answered by the router itself (docs/capi-hooks.md §1.2: any
non-200 is a transport error for CAPI, so only these three transport cases may leave 200).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

INTERNAL_ERROR_MESSAGE = "InternalError: see extension logs"


class ExtensionError(Exception):
    """Base of every error we raise on purpose. ``message`` never contains request values."""

    reason: ClassVar[str] = "ExtensionError"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return f"{self.reason}: {self.message}"


class RequestTooLarge(ExtensionError):
    reason = "RequestTooLarge"

    def __init__(self, limit: int) -> None:
        super().__init__(f"request body exceeds {limit} bytes")
        self.limit = limit


class InvalidRequest(ExtensionError):
    """The request does not fit the hook: ``field_path`` names where (``desired.machine.metadata.name``)."""

    reason = "InvalidRequest"

    def __init__(self, field_path: str, problem: str) -> None:
        super().__init__(f"{field_path}: {problem}")
        self.field_path = field_path
        self.problem = problem


@dataclass(frozen=True)
class ErrorAnswer:
    """How the edge answers an exception: HTTP status, the ``message`` CAPI sees, and whether it is a bug."""

    http_status: int
    message: str
    is_bug: bool


def answer_for(exc: BaseException) -> ErrorAnswer:
    """The single mapping from an exception to the answer: transport, hook and bug errors."""
    if isinstance(exc, RequestTooLarge):
        return ErrorAnswer(413, str(exc), is_bug=False)
    if isinstance(exc, ExtensionError):
        return ErrorAnswer(200, str(exc), is_bug=False)
    return ErrorAnswer(200, INTERNAL_ERROR_MESSAGE, is_bug=True)
