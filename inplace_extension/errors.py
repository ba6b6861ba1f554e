"""The error model of the package: the two bases every deliberate error builds on, and the one place
that maps an error to what CAPI sees (:func:`answer_for`).

Every error class of ``inplace_extension``, by base:

```
ExtensionError            .reason (stable CamelCase), .message (deterministic, secret-free): "reason: message"
├── RequestTooLarge       app: the body passes the cap -> HTTP 413
├── InvalidRequest        api, hooks: the body is not JSON or does not fit the hook's model -> 200 Failure
│                         (also a LocatedError: .where is the request field path)
├── ResolveError          runs.resolve: no usable SSH target (reason per instance: HostNotAllowed, ...)
├── DesiredStateError     mcm.desired: no usable desired state (NoDesiredState, InvalidDesiredState)
├── KubeConfigError       kube.client: no usable client configuration
├── Unavailable           a cluster's API server away or busy: "not now", never a verdict (runs answers
│                         in progress ``cluster API unavailable: ...``, charging and posting nothing)
└── KubeError             kube.errors: a Kubernetes API call failed (what the adapter's callers catch)
    ├── Unreachable       (also an Unavailable) no answer, 429 or 5xx from the API server: try again later
    ├── NotFound          404
    ├── Conflict          409: the object changed since it was read
    └── Forbidden         403
LocatedError              .where (a field path or key), .problem; str "where: problem"
├── InvalidRequest        (above)
├── PlanError             inplace.inputs: a desired value the plan cannot turn into role inputs
├── EntryInvalid          inplace.entries: a malformed list entry (.where relative to the entry)
└── CustomValueError      inplace.custom: a claimed value a shipped capability's rule refuses
ValueError                configuration refused at start-up, the message says which file and where:
├── AuthConfigError       auth
├── CapabilitiesFileError capabilities_file
├── InventoryError        runs.inventory
├── PlanInputError        preview.inputs: a file ``plan --old/--new`` cannot read or compare
└── RunConfigError        plays.runner
Exception                 control flow, caught by the next layer up and turned into an answer:
├── EntrySkipped          inplace.entries: an entry that is not ours to carry out
├── DrainError            kube.port: the drain did not finish (kubeaware turns it into a Blocked)
└── RunStartError         plays.runner: ansible-runner refused to start a play
anything else             a bug: logged with its traceback -> 200 Failure "InternalError: see extension logs"
```

Host errors are not exceptions: the run engine reports them as values (``runs.model.Progress``): an
unreachable host as "in progress, retry later", a failed task as a remembered ``Failure`` message.
"Not yet" and "cannot do it" are answers, not errors.

Unknown paths (404) and wrong methods (405) are answered by the router itself: CAPI treats any status
but 200 as a transport error, so only those two and 413 may leave anything but 200.
"""

from __future__ import annotations

from dataclasses import dataclass

INTERNAL_ERROR_MESSAGE = "InternalError: see extension logs"


class ExtensionError(Exception):
    """Base of every error we answer with on purpose. ``message`` never contains request values.

    ``reason`` is the class's CamelCase name for it; a class whose errors have several reasons passes
    one per instance.
    """

    reason: str = "ExtensionError"

    def __init__(self, message: str, reason: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if reason is not None:
            self.reason = reason

    def __str__(self) -> str:
        return f"{self.reason}: {self.message}"


class Unavailable(ExtensionError):
    """A cluster's API server is away or busy (no answer, 429, a 5xx): whoever meets it answers "in
    progress, try again later" and decides nothing. The base of ``kube.errors.Unreachable``, here so that
    the runs layer can catch it without knowing the Kubernetes adapter."""

    reason = "Unavailable"


class LocatedError(Exception):
    """A problem at a place: ``where`` (a field path, a key; "" for the whole value) and ``problem``
    (what is wrong there, never the value itself, which may be a secret)."""

    def __init__(self, where: str, problem: str) -> None:
        super().__init__(f"{where}: {problem}" if where else problem)
        self.where = where
        self.problem = problem


class RequestTooLarge(ExtensionError):
    reason = "RequestTooLarge"

    def __init__(self, limit: int) -> None:
        super().__init__(f"request body exceeds {limit} bytes")
        self.limit = limit


class InvalidRequest(LocatedError, ExtensionError):
    """The request does not fit the hook: ``where`` names the field (``desired.machine.metadata.name``)."""

    reason = "InvalidRequest"


@dataclass(frozen=True)
class ErrorAnswer:
    """How the edge answers an exception: HTTP status, the ``message`` CAPI sees, and whether it is a bug."""

    http_status: int
    message: str
    is_bug: bool


def answer_for(exc: BaseException) -> ErrorAnswer:
    """The single mapping from an exception to the answer."""
    if isinstance(exc, RequestTooLarge):
        return ErrorAnswer(413, str(exc), is_bug=False)
    if isinstance(exc, ExtensionError):
        return ErrorAnswer(200, str(exc), is_bug=False)
    return ErrorAnswer(200, INTERNAL_ERROR_MESSAGE, is_bug=True)
