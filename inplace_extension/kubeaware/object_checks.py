"""The ``kubernetes`` health checks (docs/operator-controls.md): a CEL expression that must hold of
cluster objects before a machine's update starts and after it ends, for the CAPI hooks (the Machine's
workload cluster) and the MCM agent (the target cluster) alike.

A check reads its objects through the Kubernetes adapter's :class:`~inplace_extension.kube.port.
ClusterObjects` and holds when every object it reads satisfies the expression. With a name: the object
must exist. With a selector: at least one object must match, and all that match must satisfy it (an
empty match is a StatefulSet not yet created or a selector with a typo, never "healthy"). Anything else
(false, a CEL error such as a missing field, no object, the API server's refusal) does not hold, with a
stable one-line reason; nothing raises into the run service.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from inplace_extension.inplace.custom import HealthCheck, ObjectCheck
from inplace_extension.kube.errors import Forbidden, KubeError
from inplace_extension.kube.port import ClusterObjects, ObjectQuery
from inplace_extension.runs.model import RunRequest, Unhealthy

log = logging.getLogger(__name__)

RBAC_HINT = "; the service account needs get and list on it (docs/operator-controls.md)"


class ObjectChecks:
    """:class:`~inplace_extension.runs.model.ObjectHealth` over ``checks`` (the capabilities file's
    ``kubernetes`` checks, in file order); ``cluster_of`` gives the cluster a machine's checks read."""

    def __init__(
        self, checks: Sequence[HealthCheck], cluster_of: Callable[[RunRequest], ClusterObjects]
    ) -> None:
        self._checks = tuple((c.name, c.kubernetes) for c in checks if c.kubernetes is not None)
        self._cluster_of = cluster_of

    def __bool__(self) -> bool:
        return bool(self._checks)

    def unhealthy(self, request: RunRequest) -> Unhealthy | None:
        for name, check in self._checks:
            try:
                detail = self._detail(check, request)
            except Exception:  # a bug must not become a 500 nor a stuck poll: it does not hold
                log.exception("machine=%s: health check %s failed unexpectedly", request.machine, name)
                detail = "the check failed unexpectedly (see the service log)"
            if detail is not None:
                return Unhealthy(
                    name, check.expression.text, check.target, detail, check.start_timeout_seconds
                )
        return None

    def _detail(self, check: ObjectCheck, request: RunRequest) -> str | None:
        """Why ``check`` does not hold now, or None when it holds."""
        try:
            found = self._cluster_of(request).objects(_query(check))
        except KubeError as exc:
            hint = RBAC_HINT if isinstance(exc, Forbidden) else ""
            return f"cannot read {check.target}: {exc.message}{hint}"
        if not found:
            return f"no {check.target}"
        for obj in found:
            evaluation = check.expression.evaluate(obj)
            if evaluation.holds:
                continue
            where = f"{check.kind} {_name_of(obj)}"
            if evaluation.error is not None:
                return f"{check.expression.text} failed on {where}: {evaluation.error}"
            return f"{check.expression.text} is false on {where}"
        return None


def _query(check: ObjectCheck) -> ObjectQuery:
    return ObjectQuery(
        check.api_version, check.kind, check.namespace, check.name, check.selector, check.resource
    )


def _name_of(obj: Mapping[str, Any]) -> str:
    metadata = obj.get("metadata") or {}
    name = str(metadata.get("name", "?"))
    return f"{metadata['namespace']}/{name}" if metadata.get("namespace") else name
