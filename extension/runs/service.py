"""RunService: the UpdateMachine executor. ``await poll(request)`` answers at once and never blocks.

Each poll: a run in flight here -> queued/running; else the attempts on disk decide (policy.py): done,
remembered failure, backoff wait, or resolve the host and queue a new attempt. Attempts run in worker
threads (registry.py) through the ansible-runner adapter (runner.py); their outcome is summarised into
the attempt directory, so a restarted service answers from disk. Built by ``extension.cli serve``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import anyio.to_thread

import extension
from extension.metrics import Metrics
from extension.runs import runner
from extension.runs.artifacts import (
    Attempt,
    BatchRef,
    Outcome,
    OutcomeKind,
    classify,
    load_attempts,
    new_attempt_dir,
    prune_batches,
    write_json,
)
from extension.runs.inventory import Inventory, InventoryError, load_inventory
from extension.runs.model import Progress, ProgressState, RunRequest
from extension.runs.policy import RETRY_ANNOTATION, Verdict, decide, retry_token
from extension.runs.registry import Job, RunRegistry
from extension.runs.resolve import HostTarget, ResolveError, parse_cidrs, resolve_host
from extension.settings import Settings

log = logging.getLogger(__name__)

# Kubernetes naming rules (DNS-1123); they also keep the run ident safe as a directory and Ansible name
_NAMESPACE_RE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
_FINGERPRINT_RE = re.compile(r"^[0-9a-f]{64}$")
_CAPABILITY_RE = re.compile(r"^[a-z][a-z0-9_]{0,62}$")
MAX_IDENT_LEN = 200  # a directory name; file systems allow 255 bytes
CLOSE_WAIT_SECONDS = 15.0
# How long a poll for a run in flight may wait for it to end before answering "running". Well inside
# UpdateMachine's timeoutSeconds (10 in the hook table); it turns "done" around without waiting for
# CAPI's next retryAfterSeconds (at least 1 s) to pass.
LONG_POLL_SECONDS = 2.0
# Runs queued within this window share one ansible-playbook (one start-up, forks; design.md §7): CAPI
# polls the Machines of a rollout in quick succession.
BATCH_WINDOW_SECONDS = 0.15
# Finished plays' ansible-runner artifacts (events, stdout) are kept this long for operators to read.
BATCH_RETENTION_SECONDS = 7 * 24 * 3600


class RunConfigError(ValueError):
    """The service cannot run updates as configured (no playbook). Raised at start-up only."""


def default_playbooks_dir() -> Path:
    """The repository's ``playbooks/`` beside the ``extension`` package."""
    return Path(extension.__file__).resolve().parent.parent / "playbooks"


def _invalid(request: RunRequest) -> str | None:
    if not _NAMESPACE_RE.match(request.namespace):
        return "namespace is not a valid Kubernetes namespace name"
    if not _NAME_RE.match(request.name):
        return "name is not a valid Kubernetes object name"
    if not _FINGERPRINT_RE.match(request.fingerprint):
        return "fingerprint is not a sha256 hex digest"
    if len(request.ident) > MAX_IDENT_LEN:
        return "namespace and name are too long for a run ident"
    for cap in request.capabilities:
        if not _CAPABILITY_RE.match(cap):
            return "a capability name is not a valid role name"
    for cap, role in request.roles.items():
        if cap not in request.capabilities or not _CAPABILITY_RE.match(role):
            return "a user-defined step does not name a valid role"
    return None


@dataclass(frozen=True)
class _Pending:
    """What a queued job needs to run: the request, where it goes, the retry token it started with."""

    request: RunRequest
    target: HostTarget
    token: str


class _InventorySource:
    """The inventory file, read at start-up and again whenever its mtime changes."""

    def __init__(self, path: Path | None) -> None:
        self._path = path
        self._lock = threading.Lock()
        self._mtime: float | None = None
        self._inventory = Inventory()
        if path is not None:
            self._inventory = load_inventory(path)  # a bad file at start-up stops the service
            self._mtime = path.stat().st_mtime

    def current(self) -> Inventory:
        if self._path is None:
            return self._inventory
        try:
            mtime = self._path.stat().st_mtime
        except OSError as exc:
            log.error("inventory %s: cannot stat (%s); keeping the last good one", self._path, exc)
            return self._inventory
        with self._lock:
            if mtime != self._mtime:
                try:
                    self._inventory = load_inventory(self._path)
                    log.info("inventory %s reloaded: %d entries", self._path, len(self._inventory.hosts))
                except InventoryError as exc:
                    log.error("%s; keeping the last good one", exc)
                self._mtime = mtime
            return self._inventory


class RunService:
    """Implements ``UpdateExecutor`` (extension/hooks/update_machine.py): fast, durable, bounded."""

    def __init__(
        self, settings: Settings, metrics: Metrics | None = None, roles_paths: Sequence[Path | str] = ()
    ) -> None:
        """``roles_paths``: directories of user-defined capabilities' roles (loaded by the CLI)."""
        self._runs_dir = settings.runs_dir.expanduser().resolve()
        self._runs_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._allowed = parse_cidrs(settings.allowed_cidrs)
        self._inventory = _InventorySource(settings.inventory)
        playbooks = (settings.playbooks_dir or default_playbooks_dir()).resolve()
        self._playbook = playbooks / "update_machine.yml"
        if not self._playbook.is_file():
            raise RunConfigError(f"playbook {self._playbook} not found (set --playbooks-dir)")
        cfg = playbooks / "ansible.cfg"
        self._ansible_cfg = cfg if cfg.is_file() else None
        self._wrapper = runner.install_wrapper(self._runs_dir)
        self._roles_paths = tuple(Path(path) for path in roles_paths)
        self._prune()
        self._retry_after = settings.retry_after_seconds
        self._registry: RunRegistry[_Pending] = RunRegistry(
            settings.max_parallel_runs, self._run_batch, window=BATCH_WINDOW_SECONDS
        )
        self._metrics = metrics
        if metrics is not None:
            metrics.bind_run_gauges(self._registry.running_count, self._registry.queued_count)
        self._cache_lock = threading.Lock()
        self._attempts: dict[str, list[Attempt]] = {}  # ident -> attempts on disk (cache)
        self._waiters: dict[str, list[tuple[asyncio.AbstractEventLoop, asyncio.Event]]] = {}

    async def poll(self, request: RunRequest) -> Progress:
        problem = _invalid(request)
        if problem is not None:
            return Progress(ProgressState.FAILED, f"InvalidRequest: {problem}")
        view = self._registry.view(request.ident)
        if view is not None:
            # hold the call briefly: a run ending meanwhile is answered now, not a retryAfterSeconds later
            await self._hold(request.ident, LONG_POLL_SECONDS)
            view = self._registry.view(request.ident)
            if view is not None:
                return self._in_progress(view.message())
        attempts = self._cached(request.ident)
        if attempts is None:
            attempts = await anyio.to_thread.run_sync(self._load, request)
        token = retry_token(request.annotations.get(RETRY_ANNOTATION))
        decision = decide(attempts, token, time.time(), self._retry_after)
        if decision.verdict is Verdict.DONE:
            return Progress(ProgressState.DONE, "update applied")
        if decision.verdict is Verdict.FAILED:
            return Progress(ProgressState.FAILED, decision.message)
        if decision.verdict is Verdict.WAIT:
            return Progress(ProgressState.IN_PROGRESS, decision.message, decision.wait_seconds)
        return self._start(request, token)

    def close(self, timeout: float = CLOSE_WAIT_SECONDS) -> None:
        """Admit no more runs and give the running ones ``timeout`` seconds to end.

        Runs are never killed: one still going when the process exits finishes on its own (detach.py),
        and the next service's attempt waits for its host lock and finds the stamp.
        """
        deadline = time.monotonic() + timeout
        threads = self._registry.close()
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        if not any(thread.is_alive() for thread in threads):
            runner.close_control_masters(self._runs_dir)  # a run still going needs its master

    async def _hold(self, ident: str, seconds: float) -> None:
        """Wait until the job ``ident`` leaves the registry, or ``seconds`` pass; never blocks the loop."""
        loop = asyncio.get_running_loop()
        ended = asyncio.Event()
        waiter = (loop, ended)
        with self._cache_lock:
            self._waiters.setdefault(ident, []).append(waiter)
        try:
            if self._registry.view(ident) is None:
                return  # it ended between the caller's look and our registration
            with anyio.move_on_after(seconds):
                await ended.wait()
        finally:
            with self._cache_lock:
                waiters = self._waiters.get(ident, [])
                if waiter in waiters:
                    waiters.remove(waiter)
                if not waiters:
                    self._waiters.pop(ident, None)

    def _job_ended(self, ident: str) -> None:
        """Worker thread, after the job left the registry: wake the calls held in _hold()."""
        with self._cache_lock:
            waiters = list(self._waiters.get(ident, []))
        for loop, ended in waiters:
            if not loop.is_closed():
                loop.call_soon_threadsafe(ended.set)

    def _in_progress(self, message: str) -> Progress:
        return Progress(ProgressState.IN_PROGRESS, message, self._retry_after)

    def _cached(self, ident: str) -> list[Attempt] | None:
        with self._cache_lock:
            return self._attempts.get(ident)

    def _load(self, request: RunRequest) -> list[Attempt]:
        attempts = load_attempts(self._runs_dir / request.ident, request.fingerprint)
        with self._cache_lock:
            self._attempts[request.ident] = attempts
        return attempts

    def _start(self, request: RunRequest, token: str) -> Progress:
        try:
            target = resolve_host(
                request.namespace,
                request.name,
                request.labels,
                request.annotations,
                self._inventory.current(),
                self._allowed,
            )
        except ResolveError as exc:
            log.warning("machine=%s run=%s: %s", request.machine, request.ident, exc)
            return Progress(ProgressState.FAILED, str(exc))
        job = Job(
            request.ident,
            request.machine,
            _Pending(request, target, token),
            on_done=lambda: self._job_ended(request.ident),
        )
        self._registry.submit(job)
        view = self._registry.view(request.ident)
        if view is None:  # it already ended (or the service is closing): the next poll reads the result
            return self._in_progress("running: starting")
        return self._in_progress(view.message())

    def _run_batch(self, jobs: list[Job[_Pending]]) -> None:
        """Worker thread: one play for the admitted jobs, from attempt directories to outcomes."""
        batch_ident = f"batch-{uuid.uuid4().hex[:12]}"
        batch_dir = self._runs_dir / ".batches" / batch_ident
        batch_dir.mkdir(mode=0o700, parents=True)
        hosts: list[runner.HostRun] = []
        for job in jobs:
            request, target = job.payload.request, job.payload.target
            number, attempt_dir = new_attempt_dir(self._runs_dir / request.ident)
            job.attempt = number
            ref = BatchRef(batch_dir, batch_ident, request.ident)  # the ident is the inventory host name
            meta = {"attempt": number, "retry_token": job.payload.token, "machine": request.machine}
            write_json(attempt_dir / "meta.json", {**meta, "pid": os.getpid(), **ref.to_meta()})
            log.info(
                "machine=%s run=%s state=started attempt=%d host=%s source=%s batch=%s",
                request.machine, request.ident, number, target.address, target.source, batch_ident,
            )  # fmt: skip
            hosts.append(
                runner.HostRun(
                    ident=request.ident,
                    host_name=request.ident,
                    fingerprint=request.fingerprint,
                    capabilities=request.capabilities,
                    inputs=request.inputs,
                    target=target,
                    attempt_dir=attempt_dir,
                    roles=request.roles,
                )
            )
        spec = runner.BatchSpec(
            ident=batch_ident,
            batch_dir=batch_dir,
            hosts=tuple(hosts),
            playbook=self._playbook,
            ansible_cfg=self._ansible_cfg,
            state_dir=self._runs_dir,
            wrapper=self._wrapper,
            roles_paths=self._roles_paths,
        )
        capabilities = {job.ident: job.payload.request.capabilities for job in jobs}
        # task events name the role; a user-defined step's role maps back to its capability for the phase
        step_of_role = {job.ident: {r: c for c, r in job.payload.request.roles.items()} for job in jobs}
        seen_capability: set[str] = set()

        def on_task(host: str, role: str | None, task: str) -> None:
            if host not in capabilities:
                return
            step = step_of_role[host].get(role or "", role)
            if step in capabilities[host]:
                seen_capability.add(host)
                self._registry.set_phase(host, step)
            else:
                self._registry.set_phase(host, "finishing" if host in seen_capability else "starting")

        started = time.monotonic()
        try:
            status = runner.start(spec, on_task).wait()
            ended = time.time()
            outcomes = {
                run.ident: classify(BatchRef(batch_dir, batch_ident, run.host_name), run.fingerprint, ended)
                for run in hosts
            }
        except runner.RunStartError as exc:
            status, ended = "not started", time.time()
            outcomes = {
                run.ident: Outcome(OutcomeKind.INTERRUPTED, detail=str(exc), finished=ended) for run in hosts
            }
        seconds = time.monotonic() - started
        for job, run in zip(jobs, hosts, strict=True):
            self._finish(job, run, outcomes[run.ident], status)
            if self._metrics is not None:
                self._metrics.run_finished(outcomes[run.ident].kind.value, seconds)
        self._prune()

    def _prune(self) -> None:
        for removed in prune_batches(self._runs_dir / ".batches", BATCH_RETENTION_SECONDS, time.time()):
            log.info("removed the artifacts of %s (older than the retention)", removed.name)

    def _finish(self, job: Job[_Pending], run: runner.HostRun, outcome: Outcome, status: str) -> None:
        request = job.payload.request
        write_json(run.attempt_dir / "outcome.json", outcome.to_json())
        log.info(
            "machine=%s run=%s state=%s attempt=%d runner_status=%s %s",
            request.machine, request.ident, outcome.kind.value, job.attempt, status, outcome.detail,
        )  # fmt: skip
        if outcome.kind is OutcomeKind.TASK_FAILED:
            log.warning(
                "machine=%s run=%s failed: capability=%s task=%r (artifacts: %s)",
                request.machine, request.ident, outcome.capability, outcome.task, run.attempt_dir,
            )  # fmt: skip
        self._load(request)
