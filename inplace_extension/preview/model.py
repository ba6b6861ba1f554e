"""What a preview says (:class:`Preview`), and its one machine-readable shape (:meth:`Preview.document`,
kind ``PlanPreview``, documented in docs/cli.md): the answer of the CanUpdate* hook, each changed field
and whether it is carried out in place, each step with its disruption class and whether the Node is
drained while it runs, and per machine its run, host and maintenance window. Values of fields are never
in it (they may be secrets): only field paths, capability and input names.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final

from inplace_extension.runs.model import RunRequest
from inplace_extension.runs.resolve import HostTarget

API_VERSION: Final = "inplace-extension.io/v1alpha1"
KIND: Final = "PlanPreview"


@dataclass(frozen=True)
class Answer:
    """What the CanUpdate* hook answers (CAPI only)."""

    hook: str  # CanUpdateMachineSet | CanUpdateMachine
    status: str  # Success | Failure
    message: str | None
    patches: tuple[str, ...]  # the answer's patch fields
    affects_availability: bool | None


@dataclass(frozen=True)
class Change:
    """One changed field: carried out in place (by ``capability``), or not (CAPI: a rollout replaces the
    machine; MCM: the running machine keeps the old value)."""

    object: str  # kind of the object it is in
    field: str  # JSON pointer, relative to the machine spec (CAPI) or the MachineClass (MCM)
    in_place: bool
    capability: str | None
    reason: str


@dataclass(frozen=True)
class Step:
    """One step of the update, in run order."""

    capability: str
    role: str  # the Ansible role (a built-in capability is its own role)
    disruption: str  # none | restart-kubelet | reboot
    # a changed field is carried out by it (False: unchanged, converged all the same; None: not known,
    # a saved UpdateMachine request carries no current state)
    changed: bool | None
    drained: bool  # the Node is drained while it runs
    inputs: tuple[str, ...]  # role variable names (never their values)
    # of this step's inputs: a host whose stamp holds it for this step skips the step (plan cannot know)
    fingerprint: str = ""


@dataclass(frozen=True)
class Drain:
    """Who drains the Node and right before which step (None: not drained)."""

    by: str  # service | mcm | none
    before: str | None
    why: str


@dataclass(frozen=True)
class Window:
    """The maintenance window of a machine: open now, or which one opens first and when (UTC)."""

    open: bool
    name: str | None = None
    opens: str | None = None


@dataclass(frozen=True)
class Host:
    """The SSH target a machine resolves to, or why none (the reason and message of the Failure)."""

    address: str | None = None
    port: int | None = None
    user: str | None = None
    source: str | None = None  # annotation | inventory | machine status
    reason: str | None = None
    message: str | None = None


@dataclass(frozen=True)
class MachinePreview:
    name: str  # namespace/name
    run: str | None  # the run ident, when the update runs in place
    host: Host | None  # None: no inventory given
    window: Window | None  # None: no window applies
    # what ``plan --hosts`` checks on the host: the run UpdateMachine would make and the resolved SSH
    # target (None: the update is not in place, or the host did not resolve); not in the document
    request: RunRequest | None = field(default=None, compare=False, repr=False)
    target: HostTarget | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class Preview:
    subject: str  # what is previewed: "MachineDeployment default/md-0", "MachineClass ns/name", ...
    source: str  # capi | mcm
    outcome: str  # in-place | rollout | no-change | disabled | refused | partial | invalid
    answer: Answer | None = None
    changes: tuple[Change, ...] = ()
    steps: tuple[Step, ...] = ()
    fingerprint: str | None = None
    drain: Drain | None = None
    machines: tuple[MachinePreview, ...] = ()
    window: Window | None = None  # of the template's labels, when no machine is named
    failure: str | None = None  # the Failure the service would answer (invalid desired values)
    # work the infrastructure provider does itself, no host work: "tags, no host work (CAPA ...)"
    infrastructure: str | None = None

    def document(self) -> dict[str, Any]:
        """The machine-readable shape (``-o json|yaml``); keys are stable."""
        document: dict[str, Any] = {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "subject": self.subject,
            "source": self.source,
            "outcome": self.outcome,
        }
        if self.failure is not None:
            document["failure"] = self.failure
        if self.answer is not None:
            document["answer"] = {
                "hook": self.answer.hook,
                "status": self.answer.status,
                "message": self.answer.message,
                "patches": list(self.answer.patches),
                "affectsAvailability": self.answer.affects_availability,
            }
        document["changes"] = [
            {
                "object": c.object,
                "field": c.field,
                "inPlace": c.in_place,
                "capability": c.capability,
                "reason": c.reason,
            }
            for c in self.changes
        ]
        document["steps"] = [
            {
                "capability": s.capability,
                "role": s.role,
                "disruption": s.disruption,
                "changed": s.changed,
                "drained": s.drained,
                "inputs": list(s.inputs),
                "fingerprint": s.fingerprint,
            }
            for s in self.steps
        ]
        if self.infrastructure is not None:
            document["infrastructure"] = self.infrastructure
        document["fingerprint"] = self.fingerprint
        document["drain"] = (
            None
            if self.drain is None
            else {"by": self.drain.by, "before": self.drain.before, "why": self.drain.why}
        )
        document["machines"] = [
            {
                "name": m.name,
                "run": m.run,
                "host": None if m.host is None else _host(m.host),
                "window": None if m.window is None else _window(m.window),
            }
            for m in self.machines
        ]
        document["window"] = None if self.window is None else _window(self.window)
        return document


def _host(host: Host) -> dict[str, Any]:
    if host.reason is not None:
        return {"resolved": False, "reason": host.reason, "message": host.message}
    return {
        "resolved": True,
        "address": host.address,
        "port": host.port,
        "user": host.user,
        "source": host.source,
    }


def _window(window: Window) -> dict[str, Any]:
    return {"open": window.open, "name": window.name, "opens": window.opens}
