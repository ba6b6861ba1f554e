"""The operator's pause annotation (docs/operator-controls.md): its key, its values, and the hold an
object carrying it puts on the updates of its machines.

One rule for both callers: the CAPI side reads it on a Machine's MachineDeployment, control plane and
Cluster (``inplace_extension.kubeaware``), the MCM agent on the MachineDeployment of a Node's Machine
(``inplace_extension.mcm``); the messages come from the one table (:mod:`inplace_extension.runs.progress`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from inplace_extension.runs import progress
from inplace_extension.runs.model import Hold

PAUSE_ANNOTATION: Final = "inplace-extension.io/pause"
CANCEL: Final = "cancel"  # the one value that cancels; any other value pauses


def hold_of(owner: str, annotations: Mapping[str, str] | None) -> Hold | None:
    """The hold ``owner`` (``MachineDeployment default/md-0``) puts on its machines' updates, by its
    ``annotations``; None when it has no pause annotation."""
    value = (annotations or {}).get(PAUSE_ANNOTATION)
    if value is None:
        return None
    if value == CANCEL:
        return Hold(progress.cancelled(owner, PAUSE_ANNOTATION, CANCEL), cancel=True)
    return Hold(progress.paused(owner, PAUSE_ANNOTATION))


def unreadable(owner: str, problem: str) -> Hold:
    """Whether ``owner`` holds cannot be told: hold all the same (a pause must not be missed because the
    API server did not answer)."""
    return Hold(progress.pause_unreadable(owner, problem))
