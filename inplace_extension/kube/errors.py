"""The adapter's own errors: what a caller of ``inplace_extension.kube`` catches, never the client
library's (lightkube's ``ApiError``) nor its transport's (httpx2's connection errors).

```
KubeError        a call failed; the message names the object and the HTTP status, never a response body
├── Unreachable  the API server away or busy: no answer at all (connection refused, reset, timed out),
│                or 429 Too Many Requests, or a 5xx: try again later, never a verdict
├── NotFound     404: the object does not exist
├── Conflict     409: the object changed since it was read; read it again and decide again
└── Forbidden    403: our ServiceAccount may not do this (an RBAC problem, not a transient one)
```

:func:`inplace_extension.kube.client.translate` is the one place a library error becomes one of these.
"""

from __future__ import annotations

from inplace_extension.errors import ExtensionError, Unavailable


class KubeError(ExtensionError):
    """A Kubernetes API call failed. ``status``: the HTTP status (None when there was no answer)."""

    reason = "KubeError"

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class Unreachable(KubeError, Unavailable):
    """The API server gave no answer, or answered that it cannot now (429, 5xx: overloaded, restarting,
    etcd away); callers treat it as "try again later", never as a verdict about the object."""


class NotFound(KubeError):
    pass


class Conflict(KubeError):
    pass


class Forbidden(KubeError):
    pass
