"""The workload Node's ``DisruptiveInPlaceUpdate`` condition: True while a disruptive step of an
in-place update runs on the Node's host, False after (a MachineHealthCheck can match it, see
docs/kube-aware.md).

Written to the Node's status subresource with a strategic merge patch keyed by the condition type, so
the kubelet's own conditions are untouched, and carrying the resourceVersion read just before (a
precondition): of a run ending and a restarted service cleaning up after a crash, exactly one changes
the condition, and a Node that changed in between (the kubelet's heartbeat) is read again.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Final

from lightkube import Client
from lightkube.resources.core_v1 import Node
from lightkube.types import PatchType

from inplace_extension.kube.client import translated
from inplace_extension.kube.errors import Conflict, NotFound

CONDITION: Final = "DisruptiveInPlaceUpdate"  # not MCM's InPlaceUpdate (mcm/node_state.py): another owner
RUNNING: Final = "DisruptiveStepRunning"  # reason while True
IDLE: Final = "NoDisruptiveStep"  # reason once False again
IDLE_MESSAGE: Final = "no disruptive step of an in-place update runs on this Node"
TRIES: Final = 5  # reads and conditional writes before a Node that keeps changing is an error


def _current(client: Client, node: str) -> tuple[str | None, str | None, str | None] | None:
    """(resourceVersion, status, message) of the condition as the Node says now; None: no such Node."""
    try:
        with translated(f"get Node {node}"):
            obj = client.get(Node, node)
    except NotFound:
        return None
    version = obj.metadata.resourceVersion if obj.metadata else None
    for condition in (obj.status.conditions or []) if obj.status else []:
        if condition.type == CONDITION:
            return version, condition.status, condition.message
    return version, None, None


def _write(client: Client, node: str, version: str | None, status: str, reason: str, message: str) -> None:
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    condition = {
        "type": CONDITION,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": now,
        "lastHeartbeatTime": now,
    }
    patch = {"metadata": {"resourceVersion": version}, "status": {"conditions": [condition]}}
    with translated(f"set condition {CONDITION} of Node {node}"):
        client.patch(Node.Status, node, patch, patch_type=PatchType.STRATEGIC)


def show_updating(client: Client, node: str, message: str) -> bool:
    """``DisruptiveInPlaceUpdate`` True with ``message``; True when this call changed the Node."""
    for _ in range(TRIES):
        current = _current(client, node)
        if current is None:
            return False
        version, status, said = current
        if status == "True" and said == message:
            return False
        try:
            _write(client, node, version, "True", RUNNING, message)
            return True
        except Conflict:
            continue
    raise Conflict(f"set condition {CONDITION} of Node {node}: the Node kept changing", 409)


def clear_updating(client: Client, node: str) -> bool:
    """``DisruptiveInPlaceUpdate`` False if it is True; True when this call did it (exactly one of two
    callers)."""
    for _ in range(TRIES):
        current = _current(client, node)
        if current is None or current[1] != "True":
            return False
        try:
            _write(client, node, current[0], "False", IDLE, IDLE_MESSAGE)
            return True
        except Conflict:
            continue
    raise Conflict(f"set condition {CONDITION} of Node {node}: the Node kept changing", 409)
