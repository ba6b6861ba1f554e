"""``inplace-extension status``: where each Machine of a rollout stands, read from the record the service
keeps (read-only): of a MachineDeployment, MachineSet, KubeadmControlPlane or Cluster from the
management cluster (``status md/NAME``; :mod:`inplace_extension.rollout.cluster`), or of every machine
of the ``local`` executor's runs dir (``status`` alone; :mod:`inplace_extension.rollout.local`). A table
laid out as ``clusterctl describe cluster`` lays one out, or ``-o json``; ``--watch`` redraws as the
rollout moves.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Final, TextIO

from inplace_extension.cli.command import Command, kubeconfig_from_env
from inplace_extension.cli.flags import Option, Parser, add_settings_flags, given_as, settings_from_args
from inplace_extension.kube.rollout import Owner, RolloutReader, connect_rollout
from inplace_extension.rollout.cluster import read_cluster
from inplace_extension.rollout.local import read_runs_dir
from inplace_extension.rollout.model import Rollout
from inplace_extension.rollout.render import render
from inplace_extension.settings import Settings

SETTINGS = ("runs_dir", "kubeconfig", "retry_after_seconds", "max_failed_attempts")
# what a user may call each owner kind (kubectl's short names too)
KINDS: Final = {
    "machinedeployment": "MachineDeployment",
    "machinedeployments": "MachineDeployment",
    "md": "MachineDeployment",
    "machineset": "MachineSet",
    "machinesets": "MachineSet",
    "ms": "MachineSet",
    "kubeadmcontrolplane": "KubeadmControlPlane",
    "kubeadmcontrolplanes": "KubeadmControlPlane",
    "kcp": "KubeadmControlPlane",
    "cluster": "Cluster",
    "clusters": "Cluster",
}
# the runs dir has no change feed: --watch reads it again this often, and redraws only on a change
RUNS_DIR_INTERVAL_SECONDS: Final = 2.0
CLEAR: Final = "\x1b[H\x1b[2J"  # cursor home, clear the screen: a terminal redraws in place


def clock() -> float:
    """Now, in wall-clock seconds: what ages are counted to (a test fixes it)."""
    return time.time()


OPTIONS = (
    Option("--namespace", "INPLACE_STATUS_NAMESPACE", "the owner's namespace", default="default", short="-n"),
    Option(
        "--output",
        "INPLACE_STATUS_OUTPUT",
        "table, or the RolloutStatus document as json",
        default="table",
        choices=("table", "json"),
        short="-o",
    ),
    Option(
        "--watch",
        "INPLACE_STATUS_WATCH",
        "redraw as the rollout moves (the cluster: a watch of its Machines and Events; the runs dir: read "
        "again every 2 s) until interrupted",
        default=False,
        boolean=True,
    ),
)


def configure(parser: Parser) -> None:
    parser.add_argument(
        "owner",
        nargs="?",
        metavar="KIND/NAME",
        help="md/NAME, ms/NAME, kcp/NAME or cluster/NAME: its Machines from the management cluster "
        "(--kubeconfig, else $KUBECONFIG); without it, every machine of the local executor's --runs-dir",
    )
    for option in OPTIONS:
        parser.add_option(option)
    add_settings_flags(parser, SETTINGS)
    parser.epilog = (
        "Read-only: it reads Machines and Events (get, list, watch) or the runs dir, and writes nothing. "
        "States: pending, waiting, paused, queued, running, retrying, done, failed, blocked. Exit 0."
    )


def owner_of(text: str, namespace: str) -> Owner:
    kind, slash, name = text.partition("/")
    known = KINDS.get(kind.lower())
    if not slash or not name or known is None:
        raise ValueError(f"{text}: give KIND/NAME, KIND one of md, ms, kcp, cluster")
    return Owner(known, namespace, name)


def run(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    out: Callable[[Rollout, float], None] = Screen(sys.stdout, args.output, args.watch).draw
    if args.owner is None:
        runs_dir = settings.runs_dir.expanduser()
        if not runs_dir.is_dir():
            raise ValueError(f"{given_as(args, 'runs_dir', runs_dir)}: no such directory (no run recorded)")
        return (
            watch_runs_dir(runs_dir, settings, out) if args.watch else draw_runs_dir(runs_dir, settings, out)
        )
    owner = owner_of(args.owner, args.namespace)
    reader = connect_rollout(settings.kubeconfig or kubeconfig_from_env())
    try:
        return asyncio.run(show_cluster(reader, owner, settings, out, args.watch))
    except KeyboardInterrupt:
        return 0


def draw_runs_dir(runs_dir: Path, settings: Settings, out: Callable[[Rollout, float], None]) -> int:
    now = clock()
    out(read_runs_dir(runs_dir, now, settings.retry_after_seconds, settings.max_failed_attempts), now)
    return 0


def watch_runs_dir(runs_dir: Path, settings: Settings, out: Callable[[Rollout, float], None]) -> int:
    shown: Rollout | None = None
    try:
        while True:
            now = clock()
            rollout = read_runs_dir(runs_dir, now, settings.retry_after_seconds, settings.max_failed_attempts)
            if rollout != shown:
                out(rollout, now)
                shown = rollout
            time.sleep(RUNS_DIR_INTERVAL_SECONDS)
    except KeyboardInterrupt:
        return 0


async def show_cluster(
    reader: RolloutReader,
    owner: Owner,
    settings: Settings,
    out: Callable[[Rollout, float], None],
    watch: bool,
) -> int:
    """Draw the owner's rollout once, or (``watch``) after each change the watch brings."""
    try:
        if not await reader.owner_exists(owner):
            raise LookupError(f"{owner}: not found")
        if not watch:
            now = clock()
            snapshot = await reader.snapshot(owner)
            out(
                read_cluster(
                    owner, snapshot, now, settings.retry_after_seconds, settings.max_failed_attempts
                ),
                now,
            )
            return 0
        async for snapshot in reader.watch(owner):
            now = clock()
            out(
                read_cluster(
                    owner, snapshot, now, settings.retry_after_seconds, settings.max_failed_attempts
                ),
                now,
            )
        return 0
    finally:
        await reader.close()


class Screen:
    """Where the rollout is drawn: once; or, watching, again in place on a terminal (else one after the
    other, a blank line between, for a log or a pipe)."""

    def __init__(self, stream: TextIO, output: str, watch: bool) -> None:
        self._stream = stream
        self._output = output
        self._watch = watch
        self._drawn = 0

    def draw(self, rollout: Rollout, now: float) -> None:
        text = render(rollout, self._output, now)
        if self._watch and self._drawn and self._output == "table":
            text = (CLEAR if self._stream.isatty() else "\n") + text
        elif self._watch and self._stream.isatty() and self._output == "table":
            text = CLEAR + text
        print(text, file=self._stream, flush=True)
        self._drawn += 1


COMMAND = Command(
    "status",
    "where each Machine of a rollout stands (a MachineDeployment, KubeadmControlPlane, Cluster, or the "
    "runs dir), once or --watch (read-only)",
    configure,
    run,
)
