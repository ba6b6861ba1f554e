"""``inplace-extension check-host``: check one host inside a dry-run Job of the ``kubernetes`` executor.

Internal: ``plan --hosts`` with ``--executor kubernetes`` creates the Job, with the spec in a Secret the
Job owns (``--spec``; kubejobs/dry_run.py). The command plays the update in Ansible check mode with diff
against that one host, as the ``local`` executor's dry run does (plays/dry_run.py: it changes nothing,
takes no lock), and writes the check as the container's termination message. Its exit status is 0
whenever a check was written (a host that would change, or could not be reached, is a check).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from inplace_extension.cli.command import Command
from inplace_extension.cli.flags import Option, Parser
from inplace_extension.kubejobs.dry_run import CHECK_COMMAND, encode_check
from inplace_extension.kubejobs.manifest import TERMINATION_LOG
from inplace_extension.kubejobs.spec import AttemptSpec
from inplace_extension.logs import configure_logging
from inplace_extension.plays.batch import PlayConfig
from inplace_extension.plays.dry_run import DryRun, check_hosts
from inplace_extension.settings import Settings

OPTIONS = (
    Option(
        "--spec",
        "INPLACE_CHECK_SPEC",
        "the check's spec: the file of the Secret the Job owns",
        kind=Path,
        required=True,
        metavar="FILE",
    ),
    Option(
        "--termination-log",
        "INPLACE_TERMINATION_LOG",
        "where the check is written: the container's termination message",
        kind=Path,
        default=Path(TERMINATION_LOG),
        metavar="FILE",
    ),
)


def configure(parser: Parser) -> None:
    for option in OPTIONS:
        parser.add_option(option)


def run(args: argparse.Namespace) -> int:
    spec = AttemptSpec.decode(args.spec.read_text(encoding="utf-8"))
    settings = Settings(**spec.settings)
    configure_logging(settings.log_format, settings.log_level)
    play = PlayConfig(
        roles_paths=tuple(Path(path) for path in spec.roles_paths), host_checks=(), role_vars=spec.role_vars
    )
    [check] = check_hosts(
        [DryRun(spec.request, spec.target)], play, playbooks_dir=settings.playbooks_dir, max_parallel=1
    )
    args.termination_log.write_text(encode_check(check), encoding="utf-8")
    return 0


COMMAND = Command(
    CHECK_COMMAND,
    "check one host in check mode (inside a dry-run Job of the kubernetes executor)",
    configure,
    run,
)
