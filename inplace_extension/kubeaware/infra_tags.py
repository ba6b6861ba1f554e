"""UpdateMachine's wait for the infrastructure provider to apply the desired tags (Kubernetes-aware mode).

A claimed tags change (``inplace_extension.inplace.infra_tags``) needs no host work: CAPI applies the
desired infrastructure machine onto the live one and the provider's controller tags the instance. This
module reads the live infrastructure machine from the management cluster and answers done once the
provider's last-applied annotation holds every desired tag, in progress until then, and past
``timeout_seconds`` a Failure naming the provider and the tags still missing (the same message on every
later call for that desired state, as every UpdateMachine failure).

When the wait began is remembered by this process only, bounded (like ``runs/memo.py``): a restarted
replica starts the clock again, so a restart can only lengthen a wait, never fail one early.

A tags-only change needs nothing on the host either: UpdateMachine plans ``kubernetes_version`` whenever
the Machine carries a version (CAPI sends no current state), so :meth:`InfraTagsWait.host_idle` says
when that is the only host step and the Node already reports the version: then no play runs, no SSH,
and the Machine needs no inventory entry.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Final

import anyio.to_thread

from inplace_extension.inplace.infra_tags import DesiredTags, missing_tags
from inplace_extension.kube.errors import KubeError
from inplace_extension.kube.port import ClusterObjects, ObjectQuery
from inplace_extension.kubeaware.cluster_side import VERSION_INPUT, VERSION_STEP
from inplace_extension.runs.model import Progress, ProgressState, RunRequest

# CAPA re-applies tags on every reconcile of the AWSMachine, which the in-place trigger's change of its
# spec starts at once; ten minutes leaves room for EC2 throttling and a controller restart
DEFAULT_TIMEOUT_SECONDS: Final = 600.0
RETRY_AFTER_SECONDS: Final = 5
_BOUND: Final = 4096  # far more waits than one rollout polls at once; each entry is a float or a string

Key = tuple[str, str, str, tuple[tuple[str, str], ...]]


class InfraTagsWait:
    """:class:`~inplace_extension.hooks.context.InfraTagsPoller` over the management cluster's objects."""

    def __init__(
        self,
        objects: ClusterObjects,
        reported_version: Callable[[RunRequest], str | None],
        timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._objects = objects
        self._reported_version = reported_version  # the kubelet version the machine's Node reports
        self._timeout = timeout_seconds
        self._clock = clock
        self._since: OrderedDict[Key, float] = OrderedDict()  # when this process first waited
        self._failed: OrderedDict[Key, str] = OrderedDict()  # the Failure once answered: stays
        self._lock = threading.Lock()

    async def poll(self, desired: DesiredTags) -> Progress:
        tags_wanted = tuple(sorted(desired.tags.items()))
        key: Key = (desired.namespace, desired.name, desired.provider.kind, tags_wanted)
        with self._lock:
            failed = self._failed.get(key)
        if failed is not None:
            return Progress(ProgressState.FAILED, failed)
        try:
            missing, why = await anyio.to_thread.run_sync(self._missing, desired), ""
        except KubeError as exc:  # an outage or a denial: tags unknown, waited for like missing ones
            missing, why = tuple(sorted(desired.tags)), f" (cannot read it: {exc})"
        provider = desired.provider.provider
        subject = f"{desired.provider.kind} {desired.namespace}/{desired.name}"
        if not missing:
            with self._lock:
                self._since.pop(key, None)
            return Progress(ProgressState.DONE, f"infrastructure: {provider} applied the tags")
        now = self._clock()
        with self._lock:
            since = self._since.setdefault(key, now)
            self._since.move_to_end(key)
            _trim(self._since)
        tags = ", ".join(missing)
        if now - since < self._timeout:
            message = f"infrastructure: waiting for {provider} to apply tags {tags} to {subject}"
            return Progress(ProgressState.IN_PROGRESS, message + why, RETRY_AFTER_SECONDS)
        message = (
            f"InfrastructureTagsNotApplied: {provider} did not apply tags {tags} to "
            f"{subject} within {self._timeout:g}s (its annotation {desired.provider.annotation} lacks them)"
        )
        message += why
        with self._lock:
            self._failed[key] = message
            _trim(self._failed)
        return Progress(ProgressState.FAILED, message)

    async def host_idle(self, run: RunRequest) -> bool:
        """True when the host has nothing to do for ``run``: its only step is ``kubernetes_version`` and
        the Node reports that version already (a Node that cannot be read: not known, the play runs)."""
        target = run.inputs.get(VERSION_STEP, {}).get(VERSION_INPUT)
        if tuple(run.capabilities) != (VERSION_STEP,) or target is None:
            return False
        try:
            reported = await anyio.to_thread.run_sync(self._reported_version, run)
        except KubeError:
            return False
        return bool(reported == target)

    def _missing(self, desired: DesiredTags) -> tuple[str, ...]:
        """The desired tags the live infrastructure machine's annotation does not hold yet (blocking)."""
        query = ObjectQuery(desired.api_version, desired.provider.kind, desired.namespace, desired.name)
        found = self._objects.objects(query)
        if not found:
            return tuple(sorted(desired.tags))
        metadata = found[0].get("metadata") or {}
        annotations = metadata.get("annotations") or {}
        annotation = annotations.get(desired.provider.annotation)
        return missing_tags(desired.tags, annotation if isinstance(annotation, str) else None)


def _trim(entries: OrderedDict[Key, float] | OrderedDict[Key, str]) -> None:
    while len(entries) > _BOUND:
        entries.popitem(last=False)
