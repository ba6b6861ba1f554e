"""The host dry run through the ``kubernetes`` executor: each Machine's check (:mod:`plays.dry_run`, the
update playbook in Ansible check mode with diff) played in a Job of its own, as an attempt would be.

The Job is the attempt Job's shape (manifest.py: the service's image, its ServiceAccount, the
"restricted" security context, a Secret it owns with the spec and the one SSH private key of its host)
with three differences: it runs ``check-host`` instead of ``attempt``; it is labelled
``app.kubernetes.io/component: dry-run`` (never taken for an attempt: a drain may evict it, no record
names it); and it has no API access at all (no token mounted: a check publishes no phase and drains
nothing). Its name is random (``inplace-dry-run-<run hash>-<8 hex>``), so dry runs of the same Machine
never meet. The spec is an :class:`AttemptSpec` with no attempt number, retry token or lock token: the
check takes no host lock (its lock task only reads the stamp).

The check comes back as the container's termination message (the only channel that needs no API right
and no log access): the check as JSON, zlib-compressed and base64-encoded, within the kubelet's 4096
bytes. A check whose diffs do not fit even so loses the diffs of its largest steps, each replaced by a
line that says so and how big it was (the step's result, reason and one-line changes stay): the answer
is never cut silently, and ``plan --hosts --executor local`` shows those diffs in full.

The caller deletes each Job (and its Secret) once read, also when it stops early; a Job left behind by a
caller that died is deleted by the TTL controller :data:`DRY_RUN_TTL_SECONDS` after it finished.
"""

from __future__ import annotations

import base64
import json
import logging
import secrets
import time
import zlib
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, replace
from typing import Any, Final

from inplace_extension.kube.errors import KubeError
from inplace_extension.kube.port import JobCluster
from inplace_extension.kubejobs.manifest import (
    APP,
    MACHINE_LABEL,
    NAMESPACE_LABEL,
    RUN_LABEL,
    SPEC_DIR,
    JobConfig,
    job_manifest,
    label_value,
    run_label,
    secret_manifest,
    target_in_job,
)
from inplace_extension.kubejobs.spec import SPEC_KEY, TERMINATION_MESSAGE_LIMIT, AttemptSpec
from inplace_extension.plays.batch import PlayConfig
from inplace_extension.plays.dry_run import ERROR, DryRun, HostCheck, StepCheck

log = logging.getLogger(__name__)

COMPONENT: Final = "dry-run"
CHECK_COMMAND: Final = "check-host"
# a finished dry-run Job the caller did not delete (it died, or lost the API server) goes this long after
DRY_RUN_TTL_SECONDS: Final = 600
LOOK_SECONDS: Final = 1.0  # how often a Job in flight is read (one Job and its Pods per look)
_KUBE_API_VOLUME: Final = "kube-api-access"


@dataclass(frozen=True, kw_only=True)
class DryRunJobs:
    """Where and how the checks' Jobs run: the cluster, the Jobs' config (as the attempts'), the settings
    the check runs with in the Job (spec.JOB_SETTINGS), the play's roles and role settings, and how long
    a Job whose Pod cannot start is waited for."""

    jobs: JobCluster
    config: JobConfig
    settings: Mapping[str, Any]
    play: PlayConfig
    start_seconds: float
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep


def job_name(ident: str) -> str:
    """``inplace-dry-run-<16 hex of the run ident's hash>-<8 random hex>``: a DNS label of 41 characters."""
    return f"inplace-dry-run-{run_label(ident)}-{secrets.token_hex(4)}"


def dry_run_labels(run: DryRun) -> dict[str, str]:
    request = run.request
    return {
        "app.kubernetes.io/name": APP,
        "app.kubernetes.io/component": COMPONENT,
        MACHINE_LABEL: label_value(request.name),
        NAMESPACE_LABEL: label_value(request.namespace),
        RUN_LABEL: run_label(request.ident),
    }


def dry_run_manifests(
    config: JobConfig, run: DryRun, settings: Mapping[str, Any], play: PlayConfig, private_key: bytes | None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The check's Job and its Secret (the spec and the host's private key), named alike."""
    request = run.request
    name = job_name(request.ident)
    job_labels = dry_run_labels(run)
    target = target_in_job(run.target, private_key)
    spec = AttemptSpec(
        request=request,
        target=target,
        number=0,
        token="",
        lock_token="",  # no lock: the check's lock task only reads the stamp
        takeover_tokens=(),
        host_checks=(),  # the health gate's commands cannot run in check mode
        role_vars=play.role_vars,
        roles_paths=tuple(str(path) for path in play.roles_paths),
        settings={**settings, "kube": False},  # the check reaches no cluster
    )
    job = job_manifest(config, request, 0, None, episode="dry-run")
    job["metadata"] = {"name": name, "namespace": config.namespace, "labels": job_labels}
    job["spec"]["ttlSecondsAfterFinished"] = DRY_RUN_TTL_SECONDS
    template = job["spec"]["template"]
    template["metadata"] = {"labels": job_labels}
    pod = template["spec"]
    pod["volumes"] = [v for v in pod["volumes"] if v["name"] != _KUBE_API_VOLUME]
    for volume in pod["volumes"]:
        if "secret" in volume:
            volume["secret"]["secretName"] = name
    [container] = pod["containers"]
    container["name"] = COMPONENT
    container["args"] = [CHECK_COMMAND, "--spec", f"{SPEC_DIR}/{SPEC_KEY}"]
    container["env"] = [e for e in container["env"] if not e["name"].startswith("POD_")]  # no API calls
    container["volumeMounts"] = [m for m in container["volumeMounts"] if m["name"] != _KUBE_API_VOLUME]
    secret = secret_manifest(config, name, spec.encode(), job_labels, private_key)
    return job, secret


# the check, as the termination message


def encode_check(check: HostCheck, limit: int = TERMINATION_MESSAGE_LIMIT) -> str:
    """``check`` as a termination message within ``limit`` bytes: JSON, zlib-compressed, base64. Diffs
    that do not fit go, the largest step's first, each replaced by a line saying so (never silently);
    then the steps' one-line changes the same way."""
    steps = [_step_document(step) for step in check.steps]
    document = {
        "machine": check.machine,
        "address": check.address,
        "result": check.result,
        "error": check.error,
        "steps": steps,
    }
    text = _packed(document)
    for field in ("diffs", "changes"):
        while len(text) > limit:
            biggest = max(
                (s for s in steps if s[field] and not s.get(f"{field}_cut")),
                key=lambda s: len(json.dumps(s[field])),
                default=None,
            )
            if biggest is None:
                break
            size = sum(len(item.encode()) for item in biggest[field])
            what = "diff" if field == "diffs" else "changes"
            biggest[field] = [
                f"({what} of {size} bytes left out: too large for the check Job's termination message of "
                f"{limit} bytes; plan --hosts --executor local shows it)\n"
            ]
            biggest[f"{field}_cut"] = True
            text = _packed(document)
    if len(text) > limit:  # the reasons themselves: cut each to one short line
        for step in steps:
            step["why"] = str(step["why"])[:120]
        document["error"] = None if check.error is None else check.error[:500]
        text = _packed(document)
    return text


def _step_document(step: StepCheck) -> dict[str, Any]:
    return {
        "capability": step.capability,
        "result": step.result,
        "why": step.why,
        "diffs": list(step.diffs),
        "changes": list(step.changes),
    }


def _packed(document: Mapping[str, Any]) -> str:
    raw = json.dumps(document, sort_keys=True, separators=(",", ":")).encode()
    return base64.b64encode(zlib.compress(raw, 9)).decode("ascii")


def decode_check(message: str) -> HostCheck:
    """The check a Job's container wrote; ValueError when the message is not one."""
    try:
        data = json.loads(zlib.decompress(base64.b64decode(message.strip(), validate=True)))
        steps = tuple(
            StepCheck(
                capability=str(s["capability"]),
                result=str(s["result"]),
                why=str(s["why"]),
                diffs=tuple(str(d) for d in s["diffs"]),
                changes=tuple(str(c) for c in s["changes"]),
            )
            for s in data["steps"]
        )
        return HostCheck(
            machine=str(data["machine"]),
            address=str(data["address"]),
            result=str(data["result"]),
            error=None if data["error"] is None else str(data["error"]),
            steps=steps,
        )
    except (ValueError, KeyError, TypeError, zlib.error) as exc:
        raise ValueError(f"not a host check: {type(exc).__name__}") from None


# the caller's side: one Job per Machine, at most max_parallel at once


def check_hosts_in_jobs(
    runs: Sequence[DryRun],
    where: DryRunJobs,
    *,
    max_parallel: int,
    on_host: Callable[[HostCheck], None] | None = None,
) -> list[HostCheck]:
    """Each run's check in a Job of its own, ``max_parallel`` Jobs at once; the checks in the order of
    ``runs``. ``on_host`` is told each check as its Job is read (a progress display). Every Job made is
    deleted before this returns (or raises)."""
    made: list[tuple[str, str]] = []  # (job, secret) to delete, also when interrupted
    checks: dict[str, HostCheck] = {}
    pool = ThreadPoolExecutor(max_workers=max(1, max_parallel), thread_name_prefix="dry-run-job")
    try:
        futures = {pool.submit(_check_in_job, run, where, made): run for run in runs}
        for future in as_completed(futures):
            check = future.result()
            checks[check.machine] = check
            if on_host is not None:
                on_host(check)
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
        for job, secret in list(made):
            _delete(where, job, secret)
    return [checks[run.request.machine] for run in runs]


def _check_in_job(run: DryRun, where: DryRunJobs, made: list[tuple[str, str]]) -> HostCheck:
    machine, address = run.request.machine, run.target.address
    try:
        key = _private_key(run)
    except OSError as exc:
        why = exc.strerror or type(exc).__name__
        return HostCheck(machine, address, ERROR, f"the inventory's private key cannot be read: {why}", ())
    job, secret = dry_run_manifests(where.config, run, where.settings, where.play, key)
    name = str(job["metadata"]["name"])
    namespace = where.config.namespace
    try:
        where.jobs.create_job(job, secret)
    except KubeError as exc:
        _delete(where, name, name)  # a create that timed out may have made it all the same
        return HostCheck(machine, address, ERROR, f"the check Job cannot be created: {exc}", ())
    made.append((name, name))
    log.info("machine=%s check Job %s/%s created (host %s)", machine, namespace, name, address)
    try:
        return _wait(run, where, name)
    finally:
        _delete(where, name, name)
        made.remove((name, name))


def _wait(run: DryRun, where: DryRunJobs, name: str) -> HostCheck:
    """The Job's check once it has finished; an error of the Machine when its Pod cannot start within
    ``start_seconds``, when it ends without a check, is gone, or outlives its deadline (the API server
    away for a moment is looked at again until then)."""
    machine, address = run.request.machine, run.target.address
    job = f"the check Job {where.config.namespace}/{name}"
    started = where.clock()
    deadline = started + where.config.deadline_seconds + where.start_seconds + 60
    while True:
        try:
            state = where.jobs.job_state(where.config.namespace, name)
        except KubeError as exc:
            log.debug("machine=%s %s: %s", machine, job, exc)
        else:
            why: str | None = None
            if state is None:
                why = f"{job} is gone"
            elif state.finished and state.termination_message is None:
                why = f"{job} ended without a result (its Pod killed or out of time)"
            elif state.finished and state.termination_message is not None:
                try:
                    # the Machine is this run's whatever the message says: the answer is keyed by it
                    return replace(decode_check(state.termination_message), machine=machine)
                except ValueError as exc:
                    why = f"{job}: {exc}"
            elif state.not_starting and where.clock() - started > where.start_seconds:
                why = f"{job} did not start: {state.not_starting}"
            if why is not None:
                return HostCheck(machine, address, ERROR, why, ())
        if where.clock() > deadline:
            return HostCheck(machine, address, ERROR, f"{job} did not end", ())
        where.sleep(LOOK_SECONDS)


def _delete(where: DryRunJobs, job: str, secret: str) -> None:
    try:
        where.jobs.delete_job(where.config.namespace, job, secret)
    except KubeError as exc:
        log.warning(
            "check Job %s/%s not deleted (its TTL deletes it %ds after it ends): %s",
            where.config.namespace,
            job,
            DRY_RUN_TTL_SECONDS,
            exc,
        )


def _private_key(run: DryRun) -> bytes | None:
    """The target's private key as this process reads it (None: the inventory names none)."""
    path = run.target.private_key_file
    return None if path is None else path.expanduser().read_bytes()
