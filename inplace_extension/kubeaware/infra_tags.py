"""UpdateMachine's wait for the infrastructure provider to apply the desired tags (Kubernetes-aware mode).

A claimed tags change (``inplace_extension.inplace.infra_tags``) needs no host work: CAPI applies the
desired infrastructure machine onto the live one and the provider's controller tags the instance. This
module reads the live infrastructure machine from the management cluster and answers done once the
provider's last-applied annotation holds every desired tag, in progress until then, and past
``timeout_seconds`` a Failure naming the provider and the tags still missing (the same message on every
later call for that desired state, as every UpdateMachine failure).

When the wait began, and the Failure once answered, are kept on the Machine (the annotation
:data:`WAIT_ANNOTATION`, written only if the Machine is unchanged since read), never in a replica: every
replica, a fresh one too, answers the same. The wait is keyed by the infrastructure machine, the desired
tags and the live infrastructure machine's ``metadata.generation``: CAPI's apply of a new desired state
makes a new generation, so the same tags wanted again after a change (a revert) wait afresh; the
annotation is removed once the tags are applied. While the infrastructure machine or the Machine
cannot be read the wait neither begins nor fails: it answers in progress, saying why.

A tags-only change needs nothing on the host either: UpdateMachine plans ``kubernetes_version`` whenever
the Machine carries a version (CAPI sends no current state), so :meth:`InfraTagsWait.host_idle` says
when that is the only host step and the Node already reports the version: then no play runs, no SSH,
and the Machine needs no inventory entry.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Protocol

import anyio.to_thread

from inplace_extension.inplace.infra_tags import DesiredTags, missing_tags
from inplace_extension.kube.errors import Conflict, KubeError
from inplace_extension.kube.port import ClusterObjects, ObjectQuery, RecordRef, RecordStore
from inplace_extension.kubeaware.cluster_side import VERSION_INPUT, VERSION_STEP
from inplace_extension.runs.model import Progress, ProgressState, RunRequest

# CAPA re-applies tags on every reconcile of the AWSMachine, which the in-place trigger's change of its
# spec starts at once; ten minutes leaves room for EC2 throttling and a controller restart
DEFAULT_TIMEOUT_SECONDS: Final = 600.0
RETRY_AFTER_SECONDS: Final = 5
WAIT_ANNOTATION: Final = "inplace-extension.io/infra-tags-wait"
WRITE_TRIES: Final = 5  # conditional writes before a Machine that keeps changing is waited out


class TagsCluster(ClusterObjects, RecordStore, Protocol):
    """The management cluster as the wait uses it: the infrastructure machine read, the Machine's
    annotation kept."""


@dataclass(frozen=True)
class _Clock:
    """The wait as kept on the Machine: its key, when it began, the Failure once answered."""

    key: str
    since: float
    failed: str | None = None

    def encode(self) -> str:
        return json.dumps({"key": self.key, "since": self.since, "failed": self.failed}, sort_keys=True)

    @classmethod
    def decode(cls, value: str | None) -> _Clock | None:
        try:
            data = json.loads(value) if value else None
            if not isinstance(data, dict):
                return None
            failed = data.get("failed")
            return cls(str(data["key"]), float(data["since"]), failed if isinstance(failed, str) else None)
        except (ValueError, KeyError, TypeError):
            return None  # not ours to read: the next write replaces it


class _Unkept(Exception):
    """The Machine that keeps the wait's clock cannot be read or written now."""


class InfraTagsWait:
    """:class:`~inplace_extension.hooks.context.InfraTagsPoller` over the management cluster."""

    def __init__(
        self,
        cluster: TagsCluster,
        reported_version: Callable[[RunRequest], str | None],
        timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """``reported_version``: the kubelet version the machine's Node reports; ``clock``: wall-clock
        seconds (the clock is shared by replicas through the Machine)."""
        self._cluster = cluster
        self._reported_version = reported_version
        self._timeout = timeout_seconds
        self._clock = clock

    async def poll(self, desired: DesiredTags, machine: str) -> Progress:
        """``machine``: the name of the Machine (in ``desired.namespace``) whose tags these are."""
        return await anyio.to_thread.run_sync(self._poll, desired, machine)

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

    def _poll(self, desired: DesiredTags, machine: str) -> Progress:
        provider = desired.provider.provider
        subject = f"{desired.provider.kind} {desired.namespace}/{desired.name}"
        try:
            missing, generation = self._missing(desired)
        except KubeError as exc:  # an outage or a denial: tags unknown, waited out (never a Failure)
            tags = ", ".join(sorted(desired.tags))
            message = f"infrastructure: waiting for {provider} to apply tags {tags} to {subject}"
            return Progress(
                ProgressState.IN_PROGRESS, f"{message} (cannot read it: {exc})", RETRY_AFTER_SECONDS
            )
        ref = RecordRef("Machine", machine, desired.namespace)
        key = _key(desired, generation)
        tags = ", ".join(missing)
        waiting = f"infrastructure: waiting for {provider} to apply tags {tags} to {subject}"
        try:
            clock = self._kept(ref, key, missing)
        except _Unkept as exc:
            return Progress(ProgressState.IN_PROGRESS, f"{waiting} ({exc})", RETRY_AFTER_SECONDS)
        if clock is None:
            return Progress(ProgressState.DONE, f"infrastructure: {provider} applied the tags")
        if clock.failed is not None:
            return Progress(ProgressState.FAILED, clock.failed)
        if self._clock() - clock.since < self._timeout:
            return Progress(ProgressState.IN_PROGRESS, waiting, RETRY_AFTER_SECONDS)
        failure = (
            f"InfrastructureTagsNotApplied: {provider} did not apply tags {tags} to "
            f"{subject} within {self._timeout:g}s (its annotation {desired.provider.annotation} lacks them)"
        )
        try:
            failed = self._fail(ref, clock, failure)
        except _Unkept as exc:  # not answered until every replica will answer it
            return Progress(ProgressState.IN_PROGRESS, f"{waiting} ({exc})", RETRY_AFTER_SECONDS)
        return Progress(ProgressState.FAILED, failed)

    def _missing(self, desired: DesiredTags) -> tuple[tuple[str, ...], int | None]:
        """The desired tags the live infrastructure machine's annotation does not hold yet, and its
        generation (None: no such object yet)."""
        query = ObjectQuery(desired.api_version, desired.provider.kind, desired.namespace, desired.name)
        found = self._cluster.objects(query)
        if not found:
            return tuple(sorted(desired.tags)), None
        metadata = found[0].get("metadata") or {}
        annotations = metadata.get("annotations") or {}
        annotation = annotations.get(desired.provider.annotation)
        generation = metadata.get("generation")
        missing = missing_tags(desired.tags, annotation if isinstance(annotation, str) else None)
        return missing, generation if isinstance(generation, int) else None

    def _kept(self, ref: RecordRef, key: str, missing: tuple[str, ...]) -> _Clock | None:
        """The wait's clock as kept on the Machine (begun now when it holds none of this wait); None once
        nothing is missing (a failure stays: then its clock). Removes a clock no longer wanted."""
        for _ in range(WRITE_TRIES):
            found = self._read(ref)
            clock = _Clock.decode(found.value)
            if clock is not None and clock.key == key and (clock.failed is not None or missing):
                return clock
            if not missing:
                if found.value is None:
                    return None
                changed = None  # applied: nothing of the wait stays on the Machine
            else:
                clock = _Clock(key, self._clock())
                changed = clock.encode()
            if self._write(ref, changed, found.resource_version):
                return clock if missing else None
        raise _Unkept(f"{ref} keeps changing")

    def _fail(self, ref: RecordRef, clock: _Clock, failure: str) -> str:
        """Keep the Failure on the Machine (another replica's, if it kept one first)."""
        for _ in range(WRITE_TRIES):
            found = self._read(ref)
            kept = _Clock.decode(found.value)
            if kept is not None and kept.key == clock.key and kept.failed is not None:
                return kept.failed
            failed = _Clock(clock.key, kept.since if kept and kept.key == clock.key else clock.since, failure)
            if self._write(ref, failed.encode(), found.resource_version):
                return failure
        raise _Unkept(f"{ref} keeps changing")

    def _read(self, ref: RecordRef) -> _Found:
        try:
            found = self._cluster.read(ref, WAIT_ANNOTATION)
        except KubeError as exc:
            raise _Unkept(f"cannot read {ref}: {exc}") from None
        if found is None:
            raise _Unkept(f"{ref} not found, so the wait cannot be kept on it")
        return _Found(found.value, found.resource_version)

    def _write(self, ref: RecordRef, value: str | None, version: str) -> bool:
        """False on a Conflict (read again and decide again)."""
        try:
            self._cluster.write(ref, WAIT_ANNOTATION, value, version)
        except Conflict:
            return False
        except KubeError as exc:
            raise _Unkept(f"cannot annotate {ref}: {exc}") from None
        return True


@dataclass(frozen=True)
class _Found:
    value: str | None
    resource_version: str


def _key(desired: DesiredTags, generation: int | None) -> str:
    """One wait: the infrastructure machine, the desired tags, the generation they were applied at."""
    text = json.dumps(
        [desired.provider.kind, desired.namespace, desired.name, sorted(desired.tags.items()), generation]
    )
    return hashlib.sha256(text.encode()).hexdigest()[:16]
