"""``plan --hosts``: the host dry run of a preview. Each previewed Machine whose update runs in place and
whose host resolved (as UpdateMachine resolves it: :mod:`preview.judge`) is checked on its host with the
update playbook in check mode, through the configured executor (``local``: a play in this process,
:mod:`plays.dry_run`; ``kubernetes``: a Job per host, :mod:`kubejobs.dry_run`); a Machine whose host did
not resolve is an error of its own, and the others go on. The exit code follows ``terraform plan
-detailed-exitcode`` (:func:`exit_code`).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

from inplace_extension.engine import job_settings
from inplace_extension.kube.port import JobCluster
from inplace_extension.kubejobs.dry_run import DryRunJobs, check_hosts_in_jobs
from inplace_extension.kubejobs.manifest import JobConfig
from inplace_extension.plays.batch import PlayConfig
from inplace_extension.plays.dry_run import CANNOT_TELL, ERROR, WOULD_CHANGE, DryRun, HostCheck, check_hosts
from inplace_extension.preview.model import MachinePreview, Preview
from inplace_extension.settings import Settings

NOTHING_TO_DO: Final = 0
FAILED: Final = 1
CHANGES: Final = 2


class NothingToCheck(ValueError):
    """``plan --hosts`` was given no Machine whose host it can check; the message says what to add."""


@dataclass(frozen=True)
class Checked:
    """A preview and what its Machines' hosts would get (in the order of ``preview.machines``; a
    Machine that is not updated in place has no check)."""

    preview: Preview
    checks: tuple[HostCheck | None, ...]


# checks the runs' hosts (in their order), telling each check as it ends: the local executor's plays
# (plays.dry_run.check_hosts) or the kubernetes executor's Jobs (kubejobs.dry_run.check_hosts_in_jobs)
Checker = Callable[[Sequence[DryRun], Callable[[HostCheck], None]], list[HostCheck]]


def local_checker(settings: Settings, play: PlayConfig) -> Checker:
    """The ``local`` executor's dry run: the check plays run in this process."""

    def check(runs: Sequence[DryRun], on_host: Callable[[HostCheck], None]) -> list[HostCheck]:
        return check_hosts(
            runs,
            play,
            playbooks_dir=settings.playbooks_dir,
            max_parallel=settings.max_parallel_runs,
            on_host=on_host,
        )

    return check


def job_checker(settings: Settings, play: PlayConfig, jobs: JobCluster, image: str) -> Checker:
    """The ``kubernetes`` executor's dry run: each host's check a Job of ``image`` in ``--job-namespace``,
    as the service would run its attempts."""
    where = DryRunJobs(
        jobs=jobs,
        config=JobConfig.of(settings, image),
        settings=job_settings(settings),
        play=play,
        start_seconds=settings.job_start_timeout_seconds,
    )

    def check(runs: Sequence[DryRun], on_host: Callable[[HostCheck], None]) -> list[HostCheck]:
        return check_hosts_in_jobs(runs, where, max_parallel=settings.max_parallel_runs, on_host=on_host)

    return check


def check_preview(
    preview: Preview,
    settings: Settings,
    checker: Checker,
    progress: Callable[[int, int], None] | None = None,
) -> Checked:
    """Check every in-place Machine of ``preview`` on its host with ``checker``. ``progress(done,
    total)`` is told as hosts are checked."""
    if preview.outcome == "invalid":
        return Checked(preview, ())
    if not preview.machines:
        raise NothingToCheck(
            "--hosts: no Machine to check; name them (--machine NAME, or Machine/Node objects in the files)"
        )
    if not any(machine.request is not None for machine in preview.machines):
        return Checked(preview, tuple(None for _ in preview.machines))
    if settings.inventory is None:
        raise NothingToCheck("--hosts: give --inventory (or INPLACE_INVENTORY): it says how to reach hosts")
    runs = [DryRun(m.request, m.target) for m in preview.machines if m.request and m.target]
    total, done = len(runs), 0

    def on_host(_: HostCheck) -> None:
        nonlocal done
        done += 1
        if progress is not None:
            progress(done, total)

    if progress is not None:
        progress(0, total)
    found = {check.machine: check for check in checker(runs, on_host)}
    return Checked(preview, tuple(_check_of(machine, found) for machine in preview.machines))


def _check_of(machine: MachinePreview, found: dict[str, HostCheck]) -> HostCheck | None:
    if machine.request is None:
        return None
    if machine.target is None:  # the host did not resolve: the Failure UpdateMachine would answer
        host = machine.host
        why = "no --inventory" if host is None else f"{host.reason}: {host.message}"
        return HostCheck(machine.name, "", ERROR, f"host not resolved: {why}", ())
    return found[machine.name]


def exit_code(checked: Checked) -> int:
    """0: nothing to do on any host; 2: some host would change (or cannot tell); 1: an error (the
    preview is invalid, or a Machine's host could not be checked)."""
    if checked.preview.outcome == "invalid":
        return FAILED
    results = {check.result for check in checked.checks if check is not None}
    if ERROR in results:
        return FAILED
    if results & {WOULD_CHANGE, CANNOT_TELL}:
        return CHANGES
    return NOTHING_TO_DO


def terminal_progress(done: int, total: int) -> None:
    """A progress bar on standard error while hosts are checked, when it is a terminal."""
    if not sys.stderr.isatty():
        return
    width = 30
    filled = width * done // max(total, 1)
    end = "\n" if done >= total else ""
    bar = "#" * filled + "." * (width - filled)
    print(f"\rchecking hosts [{bar}] {done}/{total}", end=end, file=sys.stderr)
