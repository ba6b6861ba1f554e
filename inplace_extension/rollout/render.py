"""A rollout for people, laid out as ``clusterctl describe cluster`` lays out a cluster (the owner, then
its Machines as a tree, aligned columns, how long ago), with a summary line and a progress bar under it;
or as JSON (:meth:`inplace_extension.rollout.model.Rollout.document`)."""

from __future__ import annotations

import json
from typing import Final

from inplace_extension.rollout.model import Rollout, State

BAR_WIDTH: Final = 30
HEADER: Final = ("NAME", "STATE", "ATTEMPT", "HOST", "SINCE", "MESSAGE")


def render(rollout: Rollout, output: str, now: float) -> str:
    """``output``: table or json; ``now``: the time ages are counted to (wall-clock seconds)."""
    if output == "json":
        return json.dumps(rollout.document(now), indent=2)
    return "\n".join(table(rollout, now))


def table(rollout: Rollout, now: float) -> list[str]:
    rows: list[tuple[str, ...]] = []
    for number, machine in enumerate(rollout.machines, 1):
        branch = "└─" if number == len(rollout.machines) else "├─"
        name = f"{machine.namespace}/{machine.name}" if rollout.namespaced else f"Machine/{machine.name}"
        state = machine.state.value if machine.step is None else f"{machine.state.value} {machine.step}"
        rows.append(
            (
                branch + name,
                state,
                "-" if machine.attempt is None else str(machine.attempt),
                machine.host or "-",
                "-" if machine.since is None else age(now - machine.since),
                machine.message,
            )
        )
    header, *lines = aligned(HEADER, rows)
    # the owner heads its Machines as in ``clusterctl describe``, on a line of its own (not a column's
    # width: a long name or path would push every column right)
    return [header, rollout.owner, *lines, summary(rollout)]


def summary(rollout: Rollout) -> str:
    """``[#########.....................] 1/3 done, 1 running, 1 pending``: the bar counts done Machines;
    after it every other state a Machine is in."""
    total = len(rollout.machines)
    counts = rollout.counts()
    done = counts[State.DONE]
    filled = BAR_WIDTH * done // total if total else 0
    bar = "#" * filled + "." * (BAR_WIDTH - filled)
    others = [
        f"{count} {state.value}" for state, count in counts.items() if count and state is not State.DONE
    ]
    if not total:
        others = ["no Machines recorded"]
    return f"[{bar}] {done}/{total} done" + "".join(f", {other}" for other in others)


def age(seconds: float) -> str:
    """How long ago, as ``kubectl get`` says it: ``45s``, ``3m20s``, ``12m``, ``5h``, ``3d``."""
    whole = max(0, int(seconds))
    minutes, rest = divmod(whole, 60)
    hours = minutes // 60
    if whole < 120:
        return f"{whole}s"
    if minutes < 10:
        return f"{minutes}m{rest}s" if rest else f"{minutes}m"
    if hours < 3:
        return f"{minutes}m"
    if hours < 48:
        return f"{hours}h"
    return f"{hours // 24}d"


def aligned(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    """Columns padded to their widest cell (the last one not: it is free text)."""
    widths = [max(len(row[i]) for row in (header, *rows)) for i in range(len(header) - 1)]
    lines = []
    for row in (header, *rows):
        cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=False)] + [row[-1]]
        lines.append("  ".join(cells).rstrip())
    return lines
