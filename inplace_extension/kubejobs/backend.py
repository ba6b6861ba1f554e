"""The ``kubernetes`` backend: :class:`~inplace_extension.runs.backend.Backend` over the ``kube`` ports.

The record is an annotation on the object the update is for (record.py), written only if that object
is unchanged since it was read (Conflict: read again, decide again); the attempt in flight is its Job.
A poll reads the record once (:meth:`JobBackend.reconcile` keeps what it read for the :meth:`~JobBackend.
load` that follows it when nothing is in flight); when its last attempt has no outcome it reads that
attempt's Job:

- running: in flight, with the phase the Job's Pod published on itself (``running: ntp``);
- not starting (its Pod unschedulable, its image not pulled, a Secret or ServiceAccount missing): in
  flight, named (``Job inplace-...: Pod cannot be scheduled: 0/3 nodes are available: ...``); once
  ``start_seconds`` have passed since the attempt began, the Job is deleted and the attempt is
  interrupted (retried within the budget, charged once), with one ``JobNotStarted`` Event;
- finished with an outcome in its termination message: that outcome, copied into the record by the
  first replica to see it (once: :meth:`Record.ended` is idempotent); only then is the Job's TTL
  shortened to ``--job-ttl-seconds`` (it is created with a week's: manifest.py), so the outcome outlives
  any pause in the polls;
- finished without one (its Pod deleted, evicted or past its deadline), or gone altogether some time
  after it began: interrupted, recorded once like any outcome, and retried by the policy.

Near a play's expected end, :meth:`JobBackend.wait_end` reads the Job in flight alone (one request)
once a second, and the record and the Job's Pod only once it has finished.

Launching reads the target's private key first (the inventory's ``private_key_file``, on the service's
own SSH mount) and, in the Kubernetes-aware mode, the workload cluster's kubeconfig: the Job gets that
one key (and that kubeconfig) in its own Secret, never the SSH Secret with every host's key, and its
account reads no Secret. A key the service cannot read is a Failure before anything is recorded.
Then it records the attempt (its number, retry token, host lock token), then creates its
Secret, then its Job: two replicas launching at once agree on one attempt (the record's precondition)
and one Job (its name; AlreadyExists is in progress). The name carries the record's episode (record.py):
a Job that exists already under it is of this very attempt, never one of an earlier episode of the same
desired state (A -> B -> A), whose outcome answers nothing. A replica killed after the Secret leaves an
attempt whose Job the next poll creates from that Secret; one killed before it leaves an attempt with
neither, which the next poll finds interrupted after :data:`JOB_APPEARS_SECONDS`. A launch whose Secret
or Job the API server refuses (or does not answer) withdraws its attempt: nothing is charged, and the
next poll launches again.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Final

import anyio.to_thread

from inplace_extension.kube.errors import Conflict, KubeError, NotFound
from inplace_extension.kube.port import JobCluster, JobState, RecordRef, RecordStore
from inplace_extension.kube.workload import FROM_MANAGEMENT, FROM_SECRET, secret_name
from inplace_extension.kubejobs.manifest import (
    WORKLOAD_KUBECONFIG_FILE,
    JobConfig,
    job_manifest,
    job_name,
    labels,
    secret_manifest,
    target_in_job,
)
from inplace_extension.kubejobs.record import RECORD_ANNOTATION, Record, Recorded, WaitClock
from inplace_extension.kubejobs.spec import AttemptSpec, interrupted, outcome_of
from inplace_extension.plays.batch import PlayConfig
from inplace_extension.runs import progress
from inplace_extension.runs.attempts import Attempt, Outcome, OutcomeKind
from inplace_extension.runs.backend import Launch
from inplace_extension.runs.memo import Recent
from inplace_extension.runs.model import ClusterSide, RunRequest
from inplace_extension.runs.resolve import HostTarget, ResolveError

log = logging.getLogger(__name__)

# a recorded attempt whose Job does not exist this long after it began was never created (its replica
# died in between) or was deleted: interrupted. Shorter, a replica could see another's fresh attempt
# before that replica created its Job.
JOB_APPEARS_SECONDS: Final = 60.0
CLUSTER_LABEL: Final = "cluster.x-k8s.io/cluster-name"  # CAPI sets it on every Machine
# how often wait_end looks at the Job in flight, reading the Job alone (one request; the record and the
# Pod only once it has finished): the near-end wait is 3 s (runs/play_time.py), so three looks per poll.
# Not a watch: lightkube's watch reconnects by itself when the server ends it, so a watch bounded by the
# wait could not be ended cleanly from a worker thread. A look every 0.2 s of the record, the Job and its
# Pods was 20 requests per poll (bench/README.md).
JOB_LOOK_SECONDS: Final = 1.0
WRITE_TRIES: Final = 5  # reads and conditional writes before an object that keeps changing is an error


@dataclass(frozen=True)
class _Look:
    """The record as read (and settled: a finished Job's outcome copied in), and the state of the Job of
    its attempt in flight (None: none in flight)."""

    record: Record
    running: JobState | None
    # the Job of an earlier desired state of the same Machine still runs: this one waits for it
    earlier: str | None = None
    # the Job a wait for the end looks at: the earlier one, or the attempt's in flight (None: neither)
    job: str | None = None


class JobBackend:
    """Attempts as Jobs, the record on the Machine or Node; any number of replicas, no shared disk."""

    def __init__(
        self,
        *,
        jobs: JobCluster,
        records: RecordStore,
        where: Callable[[RunRequest], RecordRef],
        config: JobConfig,
        play: PlayConfig,
        job_settings: Mapping[str, Any],
        capabilities_file: str | None,
        clock: Callable[[], float],
        cluster: ClusterSide,
        start_seconds: float,
    ) -> None:
        """``where``: the object each request's record is on; ``job_settings``: the settings the Job runs
        with (spec.JOB_SETTINGS); ``capabilities_file``: the service's, as text (None: none);
        ``cluster``: where a Job that did not start is posted (an Event); ``start_seconds``: how long
        after its attempt began a Job whose Pod cannot start is given up (``--job-start-timeout-seconds``)."""
        self._cluster = cluster
        self._start_seconds = start_seconds
        self._jobs = jobs
        self._records = records
        self._where = where
        self._config = config
        self._play = play
        self._job_settings = dict(job_settings)
        self._capabilities_file = capabilities_file
        self._clock = clock
        # ident -> its attempts as last read, for the status board only (bounded: memo.py)
        self._cache: Recent[str, tuple[Attempt, ...]] = Recent()
        # ident -> the record reconcile read and found nothing in flight in: the poll's attempts() answers
        # from it instead of reading the object again (taken once; bounded, as a poll may end before it)
        self._looked: Recent[str, Record] = Recent()
        # ident -> the Job reconcile found running: the wait_end that follows it in the same poll looks at
        # that Job alone (taken once; bounded as above)
        self._running: Recent[str, str] = Recent()
        # ident -> whether the attempt reconcile last found had not begun its play (bounded as above)
        self._pending: Recent[str, bool] = Recent()

    # the record

    def cached(self, ident: str) -> Sequence[Attempt]:
        return self._cache.get(ident) or ()

    async def attempts(self, request: RunRequest) -> list[Attempt]:
        """The record :meth:`reconcile` read just before, in the same poll; else read now."""
        record = self._looked.pop(request.ident)
        if record is None:
            record = (await anyio.to_thread.run_sync(self._look, request)).record
        return record.to_attempts()

    async def wait_began(self, request: RunRequest, check: str, token: str, now: float) -> float:
        def began() -> float:
            record = self._update(request, lambda r: _with_wait(r, check, token, now))
            wait = record.wait
            return wait.since if wait is not None and (wait.check, wait.token) == (check, token) else now

        return await anyio.to_thread.run_sync(began)

    async def end_wait(self, request: RunRequest) -> None:
        def end() -> None:
            self._update(request, lambda r: r.waiting_for_nothing() if r.wait is not None else None)

        await anyio.to_thread.run_sync(end)

    async def gate_passed(self, request: RunRequest, number: int) -> None:
        """Best effort: a replica that cannot write it runs the gate again on its next poll."""

        def passed() -> None:
            self._update(request, lambda r: r.passed_gate(number))

        try:
            await anyio.to_thread.run_sync(passed)
        except KubeError as exc:
            log.warning(
                "machine=%s run=%s: the gate's pass not recorded: %s", request.machine, request.ident, exc
            )

    # the launcher

    async def reconcile(self, request: RunRequest) -> str | None:
        """Also in progress while the record cannot be written (the object changing under every write):
        no decision is made without it, and the next poll tries again. The API server away or busy
        raises (Unreachable): the service answers ``cluster API unavailable: ...``."""
        try:
            look = await anyio.to_thread.run_sync(self._look, request)
        except Conflict as exc:
            log.warning("machine=%s run=%s: %s", request.machine, request.ident, exc)
            return progress.record_unreadable(str(self._where(request)), "it keeps changing")
        if look.job is not None:
            self._running.set(request.ident, look.job)
        # behind an earlier desired state's Job nothing of this one is launched yet; else its Job's Pod,
        # unless it resumes a play that died past its drain point: nothing holds that back
        attempt = look.record.unfinished
        resumes = attempt is not None and attempt.resumes
        self._pending.set(
            request.ident,
            look.earlier is not None or (look.running is not None and look.running.pending and not resumes),
        )
        if look.earlier is not None:
            return progress.queued(1, 1)
        if look.running is None:
            self._looked.set(request.ident, look.record)
            return None
        if look.running.not_starting is not None and look.job is not None:
            return progress.job_not_starting(look.job, look.running.not_starting)
        return progress.running(look.running.phase or progress.STARTING)

    def pending(self, ident: str) -> bool:
        return self._pending.get(ident) or False

    async def withdraw(self, request: RunRequest) -> bool:
        """The attempt's Job is deleted while its Pod has not started, then the attempt is recorded
        withdrawn (in this order: a Job never plays unwatched). What remains is the moment between the
        look at its Pod and the delete: a Pod that starts in it is stopped at once, at the very start of
        its play, before its drain point (the next attempt takes over its host lock)."""
        self._pending.pop(request.ident)
        return await anyio.to_thread.run_sync(self._take_back, request)

    async def wait_end(self, request: RunRequest, seconds: float) -> bool:
        """Looks at the Job in flight alone every :data:`JOB_LOOK_SECONDS` (one read each) until it has
        finished or ``seconds`` passed; once it has (or is gone), one full look at the record, the Job and
        its Pod copies its outcome into the record. The Job in flight is the one :meth:`reconcile` just
        found (else a full look finds it). An API server away counts as still in flight."""
        deadline = anyio.current_time() + seconds
        job = self._running.pop(request.ident)
        just_seen = job is not None  # reconcile saw it running a moment ago: the first look is a step later
        while True:
            if just_seen:
                just_seen = False
            elif job is None or await self._job_ended(request, job):
                try:
                    look = await anyio.to_thread.run_sync(self._look, request)
                except KubeError as exc:
                    log.debug(
                        "machine=%s run=%s: waiting for the end: %s", request.machine, request.ident, exc
                    )
                else:
                    if look.running is None and look.earlier is None:
                        self._looked.set(request.ident, look.record)  # the poll's load that follows reads it
                        return True
                    job = look.job
            left = deadline - anyio.current_time()
            if left <= 0:
                return False
            await anyio.sleep(min(JOB_LOOK_SECONDS, left))

    async def _job_ended(self, request: RunRequest, job: str) -> bool:
        """Whether ``job`` has finished or is gone (the record then says what to do); False while the API
        server is away."""
        try:
            finished = await anyio.to_thread.run_sync(self._jobs.job_finished, self._config.namespace, job)
        except KubeError as exc:
            log.debug("machine=%s run=%s: waiting for the end: %s", request.machine, request.ident, exc)
            return False
        return finished is not False

    async def launch(self, launch: Launch) -> str:
        return await anyio.to_thread.run_sync(self._launch, launch)

    def close(self, timeout: float) -> None:
        """Nothing runs in this process: the Jobs go on, and any replica answers for them."""

    # in worker threads

    def _read(self, request: RunRequest) -> tuple[Record, str, str | None, str | None]:
        """The record, the object's resourceVersion, its Node and the annotation as read; KubeError when
        there is no object."""
        ref = self._where(request)
        found = self._records.read(ref, RECORD_ANNOTATION)
        if found is None:
            raise KubeError(f"{ref} not found: no record can be kept on it")
        return Record.decode(found.value, request.ident), found.resource_version, found.node, found.value

    def _update(self, request: RunRequest, change: Callable[[Record], Record | None]) -> Record:
        """Apply ``change`` to the record and write it if the object is unchanged since read (Conflict:
        read again and apply again); ``change`` answers None when there is nothing to write. A record
        written for the first time for its desired state opens a new episode (record.py): of the replicas
        writing at once, one wins, and the others read its episode when they read again."""
        ref = self._where(request)
        for _ in range(WRITE_TRIES):
            record, version, _node, _value = self._read(request)
            changed = change(record.opened())
            if changed is None:
                return record
            try:
                self._records.write(ref, RECORD_ANNOTATION, changed.encode(), version)
            except Conflict:
                continue
            return changed
        raise Conflict(f"annotate {ref}: it kept changing", 409)

    def _look(self, request: RunRequest) -> _Look:
        record, _version, node, value = self._read(request)
        earlier = Record.earlier_in_flight(value, request.ident)
        if earlier is not None:
            state = self._jobs.job_state(self._config.namespace, earlier.job)
            if state is not None and not state.finished:
                # as the local executor, one Machine never has two plays at once, even for two desired
                # states: this one starts once that Job has ended (its outcome is no longer of interest)
                return _Look(record, None, earlier.job, earlier.job)
        attempt = record.unfinished
        running: JobState | None = None
        if attempt is not None:
            state = self._jobs.job_state(self._config.namespace, attempt.job)
            now = self._clock()
            if state is not None and not state.finished:
                running = state
                if state.not_starting is not None and now - attempt.started >= self._start_seconds:
                    record = self._not_started(request, attempt, state.not_starting, now)
                    running = None
            elif state is not None:
                # no word from the Job (killed before it wrote one): whether its play had passed its
                # drain point is not known, so it counts as passed, the safe side: its Node may be
                # cordoned and its host half changed, and a resume is a whole play anyway (drain,
                # steps the stamp does not show applied), while a pause or a closed window holding a
                # disrupted machine back would leave it so for as long as the hold lasts
                outcome = outcome_of(state.termination_message) or interrupted(
                    f"Job {attempt.job} ended without an outcome (its Pod was deleted, evicted or timed out)",
                    now,
                    died_past_drain_point=True,
                )
                record = self._end(request, attempt, outcome)
                self._keep_for_logs(request, attempt.job)
            elif self._resume(request, attempt, node, record.episode):
                running = JobState(finished=False, termination_message=None, phase=None)
            elif now - attempt.started >= JOB_APPEARS_SECONDS:
                # not known whether it played at all, nor how far (its Job deleted, or never created):
                # past its drain point, the safe side, as a Job that ended without an outcome above
                outcome = interrupted(
                    f"Job {attempt.job} is gone without an outcome", now, died_past_drain_point=True
                )
                record = self._end(request, attempt, outcome)
            else:
                running = JobState(finished=False, termination_message=None, phase=None)
        self._cache.set(request.ident, tuple(record.to_attempts()))
        return _Look(
            record, running, job=attempt.job if running is not None and attempt is not None else None
        )

    def _take_back(self, request: RunRequest) -> bool:
        look = self._look(request)
        if look.earlier is not None:
            return True  # it waits for an earlier desired state's Job: nothing of it is launched yet
        attempt = look.record.unfinished
        if attempt is None or attempt.resumes or look.running is None or not look.running.pending:
            # its play began, or it ended (the record says how), or its Job is not seen yet, or it
            # resumes a play that died past its drain point (never held back)
            return False
        try:
            self._jobs.delete_job(self._config.namespace, attempt.job, attempt.job)
        except KubeError as exc:  # the Job may be gone with its Secret left (the owner deletes that)
            log.warning(
                "machine=%s run=%s: taking back %s: %s", request.machine, request.ident, attempt.job, exc
            )
            if self._jobs.job_state(self._config.namespace, attempt.job) is not None:
                return False  # still there: in progress, the next poll tries again
        detail = f"Job {attempt.job} deleted before its Pod started: the update is held"
        self._end(request, attempt, Outcome(OutcomeKind.WITHDRAWN, detail=detail, finished=self._clock()))
        return True

    def _resume(self, request: RunRequest, attempt: Recorded, node: str | None, episode: str) -> bool:
        """The Job of a recorded attempt (of ``episode``) whose replica was killed after creating its
        Secret: created now from that Secret (True). False when there is no Secret either (nothing of the
        attempt exists)."""
        job = job_manifest(self._config, request, attempt.number, node, episode=episode)
        try:
            created = self._jobs.create_job(job, None)
        except NotFound:
            return False
        log.info(
            "machine=%s run=%s state=resumed attempt=%d job=%s/%s%s",
            request.machine,
            request.ident,
            attempt.number,
            self._config.namespace,
            attempt.job,
            "" if created else " (the Job existed)",
        )
        return True

    def _not_started(self, request: RunRequest, attempt: Recorded, why: str, now: float) -> Record:
        """The attempt's Pod did not start within ``start_seconds``: its Job is deleted first (so that it
        cannot start later, beside the next attempt), then the attempt is interrupted, and the replica
        whose write recorded it posts one ``JobNotStarted`` Event."""
        self._jobs.delete_job(self._config.namespace, attempt.job, attempt.job)
        detail = f"Job {attempt.job} did not start within {self._start_seconds:.0f}s: {why}"
        ended: list[bool] = []
        # its play never began: the machine is as the attempt before left it (disrupted, if it resumed)
        outcome = interrupted(detail, now, died_past_drain_point=attempt.resumes)
        record = self._end(request, attempt, outcome, ended)
        if ended:
            self._cluster.state(request, "JobNotStarted", detail, warning=True)
        return record

    def _end(
        self, request: RunRequest, attempt: Recorded, outcome: Any, ended: list[bool] | None = None
    ) -> Record:
        """Record ``outcome`` (once: a later caller finds it there); ``ended`` gets True when this call
        wrote it."""

        def end(record: Record) -> Record | None:
            changed = record.ended(attempt.number, outcome)
            if ended is not None:
                ended[:] = [True] if changed is not None else []
            return changed

        log.info(
            "machine=%s run=%s state=%s attempt=%d job=%s %s",
            request.machine,
            request.ident,
            outcome.kind.value,
            attempt.number,
            attempt.job,
            outcome.detail,
        )
        return self._update(request, end)

    def _workload_kubeconfig(self, request: RunRequest) -> bytes | None:
        """The kubeconfig the Job drains the Machine's Node with, as the service reads it (the Machine's
        cluster's ``<cluster>-kubeconfig`` Secret, or the one file ``--workload-kubeconfig`` names); None
        when the Job needs none: not Kubernetes-aware, or the Nodes are in the cluster the Job runs in
        (its own account drains). The Job's account reads no Secret."""
        source = self._job_settings.get("workload_kubeconfig")
        if not self._job_settings.get("kube") or source in (None, FROM_MANAGEMENT):
            return None
        if source != FROM_SECRET:
            try:
                return Path(str(source)).read_bytes()
            except OSError as exc:
                raise KubeError(
                    f"workload kubeconfig {source}: {exc.strerror or type(exc).__name__}"
                ) from None
        cluster = request.labels.get(CLUSTER_LABEL)
        if not cluster:
            return None  # no cluster, no Node to drain: the Job's cluster side says so
        value = self._jobs.secret_value(request.namespace, secret_name(cluster), "value")
        if value is None:
            raise KubeError(f"Secret {request.namespace}/{secret_name(cluster)} has no key 'value'")
        return value

    def _keep_for_logs(self, request: RunRequest, job: str) -> None:
        """The Job's outcome is in the record: the Job stays only for its logs, --job-ttl-seconds after
        it finished (it was created with the long backstop, manifest.py). Best effort: a Job this misses
        goes at the backstop."""
        try:
            self._jobs.set_job_ttl(self._config.namespace, job, self._config.ttl_seconds)
        except KubeError as exc:
            log.warning(
                "machine=%s run=%s: Job %s kept until its TTL backstop: %s",
                request.machine,
                request.ident,
                job,
                exc,
            )

    def _launch(self, launch: Launch) -> str:
        request = launch.request
        private_key = _private_key(launch.target)
        kubeconfig = self._workload_kubeconfig(request)
        begun: list[tuple[Recorded, tuple[str, ...], str]] = []

        def begin(record: Record) -> Record | None:
            begun.clear()
            if record.unfinished is not None:
                return None  # another replica launched it meanwhile: in flight
            number = record.next_number
            attempt = Recorded(
                number=number,
                token=launch.token,
                lock_token=secrets.token_hex(16),
                started=self._clock(),
                address=launch.target.address,
                job=job_name(request.ident, number, episode=record.episode),
                expected=launch.expected,
                resumes=launch.resumes,
            )
            begun.append((attempt, record.takeover_tokens(), record.episode))
            # a started attempt waits no more; the episode is its own (never a Job of an earlier one)
            return record.waiting_for_nothing().begun(attempt)

        self._update(request, begin)
        if not begun:
            return progress.running(progress.STARTING)
        attempt, takeover, episode = begun[0]
        _record, _version, node, _value = self._read(request)
        target = target_in_job(launch.target, private_key)
        spec = AttemptSpec(
            request=request,
            target=target,
            number=attempt.number,
            token=launch.token,
            lock_token=attempt.lock_token,
            takeover_tokens=takeover,
            host_checks=self._play.host_checks,
            role_vars=self._play.role_vars,
            roles_paths=tuple(str(path) for path in self._play.roles_paths),
            settings=self._job_settings
            if kubeconfig is None
            else {**self._job_settings, "workload_kubeconfig": WORKLOAD_KUBECONFIG_FILE},
            capabilities_file=self._capabilities_file,
            resumes=attempt.resumes,
        )
        job = job_manifest(self._config, request, attempt.number, node, episode=episode)
        job_labels = labels(request, attempt.number, episode=episode)
        secret = secret_manifest(
            self._config, attempt.job, spec.encode(), job_labels, private_key, kubeconfig
        )
        try:
            created = self._jobs.create_job(job, secret)
        except KubeError as exc:
            self._withdraw(request, attempt)
            raise exc from None
        log.info(
            "machine=%s run=%s state=launched attempt=%d job=%s/%s host=%s source=%s%s",
            request.machine,
            request.ident,
            attempt.number,
            self._config.namespace,
            attempt.job,
            launch.target.address,
            launch.target.source,
            "" if created else " (the Job existed)",
        )
        return progress.running(progress.STARTING)

    def _withdraw(self, request: RunRequest, attempt: Recorded) -> None:
        """A launch whose Secret or Job was refused or not answered: its Job (which a timed-out create
        may have made all the same) and Secret are deleted, then the attempt is taken out of the record,
        so that it is not charged and the next poll launches again. If the API server does not let it,
        the attempt stays: the next poll finds its Job, makes it from its Secret, or (neither there) ends
        it as interrupted after :data:`JOB_APPEARS_SECONDS`."""

        def without(record: Record) -> Record | None:
            last = record.unfinished
            if last is None or (last.number, last.lock_token) != (attempt.number, attempt.lock_token):
                return None
            return replace(record, attempts=record.attempts[:-1])  # the same episode

        try:
            self._jobs.delete_job(self._config.namespace, attempt.job, attempt.job)
            self._update(request, without)
        except KubeError as exc:
            log.warning(
                "machine=%s run=%s attempt=%d: cannot withdraw it: %s",
                request.machine,
                request.ident,
                attempt.number,
                exc,
            )


def _private_key(target: HostTarget) -> bytes | None:
    """The target's private key as the service reads it (None: the inventory names none)."""
    if target.private_key_file is None:
        return None
    try:
        return target.private_key_file.expanduser().read_bytes()
    except OSError as exc:
        # the inventory's path is the operator's, not request data; the key is never in the message
        raise ResolveError(
            "PrivateKeyUnreadable",
            f"the inventory's private_key_file {target.private_key_file} cannot be read by the service "
            f"({exc.strerror or type(exc).__name__}), so no attempt Job can be given it",
        ) from None


def _with_wait(record: Record, check: str, token: str, now: float) -> Record | None:
    wait = record.wait
    if wait is not None and (wait.check, wait.token) == (check, token):
        return None
    return replace(record, wait=WaitClock(check, token, now))
