"""A preview for people (aligned tables, as ``kubeadm upgrade plan`` prints), or as JSON or YAML (the
shape of :meth:`inplace_extension.preview.model.Preview.document`)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import yaml

from inplace_extension.plays.dry_run import HostCheck
from inplace_extension.preview.hosts import Checked
from inplace_extension.preview.model import Host, Preview, Window

OUTCOMES = {
    "in-place": "in place",
    "rollout": "rollout: CAPI replaces the machines (a change cannot be carried out in place)",
    "no-change": "no change",
    "disabled": "declined: in-place updates are disabled (ExtensionConfig disableInPlaceUpdates)",
    "refused": "refused: requireInPlace and a change cannot be carried out in place",
    "partial": "in place, but some changes are not applied to the running machines",
    "invalid": "the service would answer Failure",
}

# plan runs without the host: whether a step is skipped depends on the host's stamp (docs/playbooks.md)
SKIP_NOTE = "a step the host's stamp shows applied with the same inputs is skipped without touching the host"


def render(preview: Preview, output: str) -> str:
    """``output``: table, json or yaml."""
    if output == "json":
        return json.dumps(preview.document(), indent=2)
    if output == "yaml":
        return yaml.safe_dump(preview.document(), sort_keys=False).rstrip("\n")
    return "\n".join(_table(preview))


def render_checked(checked: Checked, output: str) -> str:
    """A preview with its host dry run (``plan --hosts``): the document's machines each get ``check``;
    the table gets one line per checked Machine, then each Machine's steps and differences."""
    if output in ("json", "yaml"):
        document = checked.preview.document()
        for machine, check in zip(document["machines"], checked.checks, strict=False):
            machine["check"] = None if check is None else check_document(check)
        if output == "json":
            return json.dumps(document, indent=2)
        return yaml.safe_dump(document, sort_keys=False).rstrip("\n")
    lines = _table(checked.preview)
    checks = [check for check in checked.checks if check is not None]
    if not checks:
        if checked.preview.outcome != "invalid":
            lines += ["", "host check: no Machine is updated in place, nothing to check"]
        return "\n".join(lines)
    lines += ["", "Host check (the update playbook in check mode with diff; nothing was changed):"]
    rows = [
        (
            check.machine,
            check.address or "-",
            check.result.upper() if check.result == "error" else check.result,
            check.error or ", ".join(f"{step.capability}: {step.result}" for step in check.steps) or "-",
        )
        for check in checks
    ]
    lines += _aligned(("MACHINE", "HOST", "RESULT", "STEPS"), rows)
    for check in checks:
        if not check.steps:
            continue
        lines += ["", f"{check.machine} ({check.address}):"]
        for step in check.steps:
            lines.append(f"  {step.capability}: {step.result}: {step.why}")
            lines += [f"    {change}" for change in step.changes]
            for diff in step.diffs:
                lines += [f"    {line}" for line in diff.rstrip("\n").splitlines()]
    return "\n".join(lines)


def check_document(check: HostCheck) -> dict[str, Any]:
    """One Machine's host check in the document (``machines[].check``); keys are stable."""
    return {
        "result": check.result,
        "address": check.address or None,
        "error": check.error,
        "steps": [
            {
                "capability": step.capability,
                "result": step.result,
                "why": step.why,
                "changes": list(step.changes),
                "diffs": list(step.diffs),
            }
            for step in check.steps
        ],
    }


def _table(preview: Preview) -> list[str]:
    lines = [f"{preview.subject}: {OUTCOMES.get(preview.outcome, preview.outcome)}"]
    if preview.failure is not None:
        lines.append(f"failure: {preview.failure}")
    answer = preview.answer
    if answer is not None:
        patches = ", ".join(answer.patches) or "none"
        affects = "" if answer.affects_availability is None else "; affectsAvailability: "
        affects += "" if answer.affects_availability is None else str(answer.affects_availability).lower()
        lines.append(f"{answer.hook} answers {answer.status}, patches: {patches}{affects}")
        if answer.message:
            lines.append(f"message: {answer.message}")
    if preview.changes:
        lines.append("")
        rows: list[tuple[str, ...]] = [
            (f"{c.object} {c.field or '/'}", "yes" if c.in_place else "NO", c.capability or "-", c.reason)
            for c in preview.changes
        ]
        lines += _aligned(("CHANGED FIELD", "IN PLACE", "CAPABILITY", "WHY"), rows)
    if preview.steps:
        lines.append("")
        drain = preview.drain
        rows = []
        for number, step in enumerate(preview.steps, 1):
            if drain is not None and drain.before == step.capability:
                who = "MCM" if drain.by == "mcm" else "the service"
                rows.append(("--", f"drain point: {who} cordons and drains the Node", "", "", "", ""))
            rows.append(
                (
                    str(number),
                    step.capability + ("" if step.role == step.capability else f" (role {step.role})"),
                    step.disruption,
                    {True: "yes", False: "no (skipped if stamped)", None: "unknown"}[step.changed],
                    "drained" if step.drained else "schedulable",
                    ", ".join(step.inputs),
                )
            )
        lines += _aligned(("STEP", "CAPABILITY", "DISRUPTION", "CHANGES", "NODE", "INPUTS"), rows)
        lines.append(SKIP_NOTE)
    elif preview.outcome == "in-place" and preview.infrastructure is None:
        lines += ["", "steps: none (nothing to apply)"]
    if preview.infrastructure is not None:
        lines.append(f"infrastructure: {preview.infrastructure}")
    if preview.drain is not None:
        lines.append(f"drain: {preview.drain.why}")
    if preview.fingerprint is not None:
        lines.append(f"fingerprint: {preview.fingerprint}")
    if preview.machines:
        lines.append("")
        rows = [(m.name, m.run or "-", _window(m.window), _host(m.host)) for m in preview.machines]
        lines += _aligned(("MACHINE", "RUN", "MAINTENANCE WINDOW", "HOST"), rows)
    if preview.window is not None:
        lines.append(f"maintenance window: {_window(preview.window)}")
    return lines


def _host(host: Host | None) -> str:
    if host is None:
        return "- (no --inventory)"
    if host.reason is not None:
        return f"none: {host.reason}: {host.message}"
    user = f"{host.user}@" if host.user else ""
    return f"{user}{host.address}:{host.port} ({host.source})"


def _window(window: Window | None) -> str:
    if window is None:
        return "none applies (may start any time)"
    if window.open:
        return "open now"
    return f'closed; "{window.name}" opens {window.opens}'


def _aligned(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """Columns padded to their widest cell; the last column is not padded. A row with empty cells after
    its second (the drain point) is printed as it is."""
    measured = [header, *(row for row in rows if row[0] != "--")]
    widths = [max(len(row[i]) for row in measured) for i in range(len(header) - 1)]
    out = []
    for row in (header, *rows):
        if row[0] == "--":
            out.append(f"{row[0].ljust(widths[0])}  {row[1]}")
            continue
        cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=False)] + [row[-1]]
        out.append("  ".join(cells).rstrip())
    return out
