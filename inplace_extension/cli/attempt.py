"""``inplace-extension attempt``: run one update attempt inside a Job of the ``kubernetes`` executor.

Internal: the service creates the Job, with the attempt spec in a Secret the Job owns (``--spec``). The
command plays that one attempt as the ``local`` executor would (kubejobs/attempt.py) and writes its
outcome as the container's termination message; its exit status is 0 whenever an outcome was written
(a failed update is an outcome), so the Job's own status says only whether the attempt ran. SIGTERM (the
Pod deleted or evicted) stops the play and writes an interrupted outcome within the grace period; the
status is then 143, and the Job ends Failed.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from inplace_extension.cli.command import Command
from inplace_extension.cli.flags import Option, Parser
from inplace_extension.inplace.custom import NO_CUSTOM
from inplace_extension.kube.cluster import connect_attempts
from inplace_extension.kubeaware.cluster_side import connect_cluster_side
from inplace_extension.kubejobs.attempt import (
    STOPPED_EXIT_STATUS,
    PhasePublisher,
    PlayStop,
    run_attempt,
    stop_on_sigterm,
)
from inplace_extension.kubejobs.manifest import TERMINATION_LOG
from inplace_extension.kubejobs.spec import AttemptSpec
from inplace_extension.logs import configure_logging
from inplace_extension.runs.attempts import OutcomeKind
from inplace_extension.runs.model import NO_CLUSTER_SIDE, ClusterSide
from inplace_extension.settings import Settings

DEADLINE_MARGIN_SECONDS = 30.0


OPTIONS = (
    Option(
        "--spec",
        "INPLACE_ATTEMPT_SPEC",
        "the attempt spec: the file of the Secret the Job owns",
        kind=Path,
        required=True,
        metavar="FILE",
    ),
    Option(
        "--termination-log",
        "INPLACE_TERMINATION_LOG",
        "where the outcome is written: the container's termination message",
        kind=Path,
        default=Path(TERMINATION_LOG),
        metavar="FILE",
    ),
    Option(
        "--runs-dir",
        "INPLACE_RUNS_DIR",
        "the attempt's scratch directory (the Job's emptyDir; default: the service's default runs dir)",
        kind=Path,
        metavar="DIR",
    ),
)


def configure(parser: Parser) -> None:
    for option in OPTIONS:
        parser.add_option(option)


def run(args: argparse.Namespace) -> int:
    spec = AttemptSpec.decode(args.spec.read_text(encoding="utf-8"))
    # the service's settings for the play and the cluster side; the runs dir (scratch) the Job's own
    given = {} if args.runs_dir is None else {"runs_dir": args.runs_dir}
    settings = Settings(**{**spec.settings, **given})
    # first: a Pod deleted while this starts up ends the attempt as one deleted mid-play does
    stop = PlayStop(settings.runs_dir.expanduser().resolve() / ".batches")
    sigterm = stop_on_sigterm(stop)
    configure_logging(settings.log_format, settings.log_level)
    custom = NO_CUSTOM
    if spec.capabilities_file is not None:
        # imported only for a capabilities file: its models and their validators are a tenth of the
        # Job's start-up CPU (bench/README.md, issue 43 item 3)
        from inplace_extension.capabilities_file import parse_file

        custom = parse_file(spec.capabilities_file).custom
    # the Job's own Pod (the downward API): where the phase is published; in-cluster credentials
    namespace, pod = os.environ.get("POD_NAMESPACE"), os.environ.get("POD_NAME")
    jobs = connect_attempts(None) if namespace and pod else None
    cluster: ClusterSide = NO_CLUSTER_SIDE
    side = connect_cluster_side(settings, custom) if settings.kube_aware else None
    if side is not None:
        cluster = side
    publish = PhasePublisher(jobs, namespace, pod) if jobs and namespace and pod else (lambda phase: None)
    try:
        outcome = run_attempt(
            spec,
            settings=settings,
            cluster=cluster,
            publish=publish,
            termination_log=args.termination_log,
            stop=stop,
            # before the Job's activeDeadlineSeconds ends the Pod: the outcome is written by then
            timeout=max(30.0, settings.job_deadline_seconds - DEADLINE_MARGIN_SECONDS),
        )
    finally:
        if side is not None:
            side.close()
        if jobs is not None:
            jobs.close()
    if sigterm.is_set() and outcome.kind is OutcomeKind.INTERRUPTED:
        return STOPPED_EXIT_STATUS
    return 0


COMMAND = Command(
    "attempt", "run one update attempt (inside a Job of the kubernetes executor)", configure, run
)
