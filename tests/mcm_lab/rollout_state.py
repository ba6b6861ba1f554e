"""Waiting on the real MCM's in-place rollout of a :class:`Pool`, and what a failed wait reports.

A CI log is all a failed run leaves, so a wait that runs out says what MCM and the agent were doing:
per Node the in-place keys of MCM and ours, per Machine its phase, owner MachineSet and last operation,
the MachineSets' replicas, and the interesting tails of the agent's log and of both MCM controllers'
logs (the lab directory's ``<component>.log``).

A wait also ends (within :data:`LOST_LOOK_SECONDS`), with the same report, when a Machine the pool
started with is deleted: nothing in these tests deletes one during a rollout, so it is MCM replacing a
Machine it should update in place (MCM v0.62.1's old MachineSet can scale down from a Machine cache that
has not seen the Machine move to the new MachineSet yet: docs/install-mcm.md). The static-hosts driver
has no spare host for the replacement, so the rollout would stall for MCM's 10-minute retry instead.
When MCM's log shows that race, the failure names it, and the tests marked :data:`RERUN_ON_MOVE_RACE`
run once more; any other deletion fails them.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from hostlab.errors import LabError
from hostlab.proc import wait_until
from kubelab.flavours import mcm, mcm_objects

from inplace_extension.mcm import node_state as ns

from .agentproc import AgentProcess, Pool

SELECTED_LABEL = "node.machine.sapcloud.io/selected-for-update"  # MCM: the Node is chosen for its update
PREFER_NO_SCHEDULE = "deployment.machine.sapcloud.io/prefer-no-schedule"  # MCM's taint on old Nodes
LOST_LOOK_SECONDS = 5.0  # how often a wait lists the pool's Machines (a kubectl call) for a deleted one
TAIL_LINES = 20
LINE_CHARS = 220
# the messages of each log that tell a rollout's steps; the MCM lines must also name the pool
AGENT_LINES = re.compile(r" INFO inplace_extension\.| (WARNING|ERROR) ")  # not the HTTP server's
CONTROLLER_LINES = re.compile(
    r"Attempting to transfer|transferred to new|selected for drain|Too many replicas|Too few replicas|"
    r"Deleting stale|Error syncing|Dropping|can be selected|removing inplace|scale up the new|scaled down"
)
MACHINE_CONTROLLER_LINES = re.compile(
    r"queue .* after \d|with phase|rror|ResourceExhausted|Drain|[Ii]n-?[Pp]lace|[Tt]erminat|Creating a VM"
)
# MCM v0.62.1's lines of the move and of its old MachineSet's deletion (machineset.go, deployment_inplace.go)
TRANSFER = re.compile(r"Attempting to transfer machine (?P<machine>\S+) to new machine set")
STALE = re.compile(r"Deleting stale machines \[(?P<machines>[^\]]*)\]")
# what a wait's failure says when MCM's log shows that race (1 move in 221 in the lab's logs of
# 2026-11-29: docs/install-mcm.md)
MOVE_RACE = "MCM v0.62.1's race at the move deleted a Machine of the pool"
# The MCM modules' tests run once more, from fresh hosts and a fresh pool, when (and only when) a wait
# failed on that race: it is MCM's, no code of ours can prevent it, and a run that meets it says nothing
# about ours. pytest reports the rerun (and the first failure's report) in its summary.
RERUN_ON_MOVE_RACE = pytest.mark.flaky(reruns=1, only_rerun=[re.escape(MOVE_RACE)])
NOISE = re.compile(r"finalizer missing from node|Evicting pod|Attempting to evict|eviction of pods")
KLOG_HEADER = re.compile(r"^[IWEF]\d{4} (\d\d:\d\d:\d\d\.\d{3})\d* +\d+ ")
# the taints a report names by their last segment (any other by its whole key)
SHORT_TAINTS = (ns.CRITICAL_TAINT[0], PREFER_NO_SCHEDULE)


def wait_on_mcm(
    pool: Pool,
    condition: Callable[[], bool],
    within: float,
    what: str,
    agents: Sequence[AgentProcess] = (),
    poll: float = 0.5,
) -> None:
    """Until ``condition()`` holds; fail with :func:`describe` after ``within`` seconds, or at once when
    MCM deleted a Machine the pool started with (see the module docstring)."""
    lost: list[str] = []
    next_look = 0.0

    def check() -> bool:
        nonlocal lost, next_look
        if condition():
            return True
        if time.monotonic() >= next_look:
            next_look = time.monotonic() + LOST_LOOK_SECONDS
            lost = lost_machines(pool)
        return bool(lost)

    if wait_until(check, within, poll) and not lost:
        return
    if not lost:
        cause = f"not within {within:.0f} s"
    elif evidence := move_race(pool, lost):
        cause = f"{MOVE_RACE}: {evidence}"
    else:
        cause = f"MCM deleted Machine {', '.join(lost)} during the rollout"
    raise AssertionError(f"{what}: {cause}\n{describe(pool, agents)}")


def move_race(pool: Pool, lost: Sequence[str]) -> str:
    """MCM's own log lines that show the race at the move (the module docstring) deleted one of ``lost``:
    the MachineSet controller deleted it as a stale Machine of its old MachineSet after the MachineDeployment
    controller had started moving a Machine of the pool; "" when the log does not show that."""
    try:
        text = (pool.lab.dir / f"{mcm.CONTROLLER}.log").read_text(errors="replace")
    except OSError:
        return ""
    moved = ""
    for line in text.splitlines():
        if (found := TRANSFER.search(line)) and found["machine"] in pool.initial:
            moved = KLOG_HEADER.sub(r"\1 ", line)
        elif moved and (found := STALE.search(line)) and set(lost) & set(found["machines"].split()):
            stale = KLOG_HEADER.sub(r"\1 ", line)
            return f"{moved[:LINE_CHARS]} / {stale[:LINE_CHARS]}"
    return ""


def lost_machines(pool: Pool) -> list[str]:
    """The Machines the pool started with that are gone or being deleted."""
    live = {m["metadata"]["name"] for m in pool.machines() if not m["metadata"].get("deletionTimestamp")}
    return [name for name in pool.initial if name not in live]


def describe(pool: Pool, agents: Sequence[AgentProcess] = ()) -> str:
    """The pool's MCM objects and Nodes as they are now, and the interesting tails of the logs (also when
    the API server does not answer: then its error in place of the objects)."""
    try:
        lines = _objects(pool)
    except LabError as exc:
        lines = [f"the pool's objects could not be read: {exc}"]
    for agent in agents:
        lines += _tail(f"agent {agent.log_path.name}", agent.log_path, AGENT_LINES)
    for component, wanted in (
        (mcm.CONTROLLER, CONTROLLER_LINES),
        (mcm.MACHINE_CONTROLLER, MACHINE_CONTROLLER_LINES),
    ):
        lines += _tail(component, pool.lab.dir / f"{component}.log", wanted, pool.name)
    return "\n".join(lines)


def _objects(pool: Pool) -> list[str]:
    status = pool.deployment().get("status", {})
    machines = pool.machines()
    lines = [
        f"MachineDeployment {pool.name}: "
        + _fields(status, "replicas", "updatedReplicas", "availableReplicas"),
        *(_machine_set(s) for s in pool.machine_sets()),
        *(_machine(m) for m in machines),
    ]
    node_names = dict.fromkeys(
        [*pool.initial, *(m["metadata"].get("labels", {}).get("node") for m in machines)]
    )
    return lines + [_node(name, pool.node(name)) for name in node_names if name]


def _fields(obj: Mapping[str, Any], *keys: str) -> str:
    return " ".join(f"{key}={obj.get(key, 0)}" for key in keys)


def _machine_set(machine_set: Mapping[str, Any]) -> str:
    spec, status = machine_set.get("spec", {}), machine_set.get("status", {})
    class_name = spec.get("template", {}).get("spec", {}).get("class", {}).get("name", "")
    counts = f"spec.replicas={spec.get('replicas', 0)} " + _fields(status, "replicas", "availableReplicas")
    return f"MachineSet {machine_set['metadata']['name']} ({class_name}): {counts}"


def _machine(machine: Mapping[str, Any]) -> str:
    meta = machine["metadata"]
    owner = next((o["name"] for o in meta.get("ownerReferences") or [] if o.get("controller")), "-")
    operation = machine.get("status", {}).get("lastOperation", {})
    said = f"{operation.get('type', '')}/{operation.get('state', '')} {operation.get('description', '')!r}"
    deleting = " DELETING" if meta.get("deletionTimestamp") else ""
    return f"Machine {meta['name']}: phase={mcm_objects.phase(machine)} set={owner}{deleting} {said[:160]}"


def _node(name: str, node: Mapping[str, Any]) -> str:
    if not node:
        return f"Node {name}: gone"
    labels, annotations = ns.node_labels(node), ns.node_annotations(node)
    keys = [
        key.rsplit("/", 1)[1] + (f"={labels[key]}" if key == ns.RESULT_LABEL else "")
        for key in (ns.CANDIDATE_LABEL, SELECTED_LABEL, ns.RESULT_LABEL)
        if key in labels
    ]
    keys_of_taints = [str(t.get("key", "")) for t in node.get("spec", {}).get("taints") or []]
    taints = [key.rsplit("/", 1)[-1] if key in SHORT_TAINTS else key for key in keys_of_taints]
    ours = [
        key.rsplit("/", 1)[1] for key in (ns.CLAIM_ANNOTATION, ns.ANSWERED_ANNOTATION) if key in annotations
    ]
    reason = annotations.get(ns.FAILED_REASON_ANNOTATION)
    parts = [
        f"inplace={ns.in_place_reason(node)}",
        f"ready={ns.is_ready(node)}",
        f"labels={','.join(keys) or '-'}",
        f"taints={','.join(t for t in taints if t) or '-'}",
        f"unschedulable={bool(node.get('spec', {}).get('unschedulable'))}",
        f"ours={','.join(ours) or '-'}",
    ]
    if reason is not None:
        parts.append(f"failed-reason={reason[:120]!r}")
    return f"Node {name}: " + " ".join(parts)


def _tail(title: str, path: Path, wanted: re.Pattern[str], naming: str = "") -> list[str]:
    """The last :data:`TAIL_LINES` messages of ``path`` that match ``wanted`` (and contain ``naming``),
    each shortened (the klog header to its time, the line to :data:`LINE_CHARS`); a run of lines saying
    the same is one, its last, with their count."""
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        return [f"--- {title}: {exc}"]
    picked = [
        KLOG_HEADER.sub(r"\1 ", line)
        for line in text.splitlines()
        if naming in line and wanted.search(line) and not NOISE.search(line)
    ]
    said = _runs(picked)
    return [f"--- {title}: the last {TAIL_LINES} of {len(said)} messages of interest", *said[-TAIL_LINES:]]


def _runs(lines: Iterable[str]) -> list[str]:
    """Consecutive lines with the same message (the text after the time) as the last of them, counted."""
    said: list[str] = []
    last, count = "", 0
    for line in lines:
        message = line.split(" ", 1)[-1]
        if said and message == last:
            count += 1
            said[-1] = f"{line[:LINE_CHARS]} (x{count})"
            continue
        last, count = message, 1
        said.append(line[:LINE_CHARS])
    return said
