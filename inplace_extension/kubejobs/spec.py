"""What a Job is told and what it answers, both as JSON: the attempt spec (the key ``attempt.json`` of the
Secret the Job owns, mounted read-only: it holds request data that may be secret, so it is never in
env, args, labels or annotations) and the outcome (the container's termination message, bounded by
Kubernetes to 4096 bytes, so it is compact and carries no request data). Pure.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from inplace_extension.runs.attempts import Outcome, OutcomeKind
from inplace_extension.runs.model import CommandCheck, RunRequest
from inplace_extension.runs.resolve import HostTarget

SPEC_KEY: Final = "attempt.json"
TERMINATION_MESSAGE_LIMIT: Final = 4096  # bytes: what the kubelet keeps of a termination message
DETAIL_LIMIT: Final = 512  # an outcome's detail (for logs) is cut to this many characters
# the settings the play and the cluster side inside the Job run with: the service's own values
JOB_SETTINGS: Final = (
    "kube",
    "workload_kubeconfig",
    "address_types",
    "drain",
    "drain_timeout_seconds",
    "drain_grace_seconds",
    "drain_delete_emptydir_data",
    "drain_wait_for_blocking_pdbs",
    "health_gate_timeout_seconds",
    "playbooks_dir",
    "job_deadline_seconds",
    "log_format",
    "log_level",
)


class SpecError(ValueError):
    """The attempt spec cannot be read (the message names what is wrong, never a value)."""


@dataclass(frozen=True)
class AttemptSpec:
    """One attempt, fully decided by the service: the Job runs it and decides nothing."""

    request: RunRequest
    target: HostTarget
    number: int
    token: str
    lock_token: str
    takeover_tokens: tuple[str, ...]
    host_checks: tuple[CommandCheck, ...]
    role_vars: Mapping[str, Any]
    roles_paths: tuple[str, ...]
    settings: Mapping[str, Any] = field(default_factory=dict)  # JOB_SETTINGS' values
    # the service's --capabilities-file, as text: the cluster side in the Job knows the user-defined
    # capabilities' disruption (its drain point, skip-remediation) and health checks as the service does
    capabilities_file: str | None = None
    # it resumes a play whose Job died past its drain point (policy.Standing.resumes): if it dies too,
    # the machine is still as disrupted as that one left it, wherever this play got to
    resumes: bool = False

    def encode(self) -> str:
        r, t = self.request, self.target
        return json.dumps(
            {
                "request": {
                    "namespace": r.namespace,
                    "name": r.name,
                    "fingerprint": r.fingerprint,
                    "capabilities": list(r.capabilities),
                    "inputs": {k: dict(v) for k, v in r.inputs.items()},
                    "annotations": dict(r.annotations),
                    "labels": dict(r.labels),
                    "roles": dict(r.roles),
                    "addresses": None if r.addresses is None else [list(a) for a in r.addresses],
                },
                "target": {
                    "address": t.address,
                    "port": t.port,
                    "user": t.user,
                    "private_key_file": None if t.private_key_file is None else str(t.private_key_file),
                    "become": t.become,
                    "host_keys": list(t.host_keys),
                    "insecure_skip_host_key_check": t.insecure_skip_host_key_check,
                    "python_interpreter": t.python_interpreter,
                    "source": t.source,
                },
                "number": self.number,
                "token": self.token,
                "lock_token": self.lock_token,
                "takeover_tokens": list(self.takeover_tokens),
                "host_checks": [
                    {"name": c.name, "argv": list(c.argv), "timeout_seconds": c.timeout_seconds}
                    for c in self.host_checks
                ],
                "role_vars": dict(self.role_vars),
                "roles_paths": list(self.roles_paths),
                "settings": dict(self.settings),
                "capabilities_file": self.capabilities_file,
                "resumes": self.resumes,
            },
            sort_keys=True,
        )

    @classmethod
    def decode(cls, text: str) -> AttemptSpec:
        try:
            data = json.loads(text)
            r, t = data["request"], data["target"]
            request = RunRequest(
                namespace=str(r["namespace"]),
                name=str(r["name"]),
                fingerprint=str(r["fingerprint"]),
                capabilities=tuple(str(c) for c in r["capabilities"]),
                inputs={str(k): dict(v) for k, v in r["inputs"].items()},
                annotations={str(k): str(v) for k, v in r["annotations"].items()},
                labels={str(k): str(v) for k, v in r["labels"].items()},
                roles={str(k): str(v) for k, v in r["roles"].items()},
                addresses=None
                if r.get("addresses") is None
                else tuple((str(a[0]), str(a[1])) for a in r["addresses"]),
            )
            target = HostTarget(
                address=str(t["address"]),
                port=int(t["port"]),
                user=None if t["user"] is None else str(t["user"]),
                private_key_file=None if t["private_key_file"] is None else Path(t["private_key_file"]),
                become=bool(t["become"]),
                host_keys=tuple(str(k) for k in t["host_keys"]),
                insecure_skip_host_key_check=bool(t["insecure_skip_host_key_check"]),
                python_interpreter=None if t["python_interpreter"] is None else str(t["python_interpreter"]),
                source=str(t["source"]),
            )
            return cls(
                request=request,
                target=target,
                number=int(data["number"]),
                token=str(data["token"]),
                lock_token=str(data["lock_token"]),
                takeover_tokens=tuple(str(x) for x in data["takeover_tokens"]),
                host_checks=tuple(
                    CommandCheck(
                        str(c["name"]), tuple(str(a) for a in c["argv"]), float(c["timeout_seconds"])
                    )
                    for c in data["host_checks"]
                ),
                role_vars=dict(data["role_vars"]),
                roles_paths=tuple(str(p) for p in data["roles_paths"]),
                settings={k: v for k, v in dict(data["settings"]).items() if k in JOB_SETTINGS},
                capabilities_file=None
                if data.get("capabilities_file") is None
                else str(data["capabilities_file"]),
                resumes=data.get("resumes") is True,
            )
        except (ValueError, KeyError, TypeError, AttributeError, IndexError) as exc:
            # the exception's type and, for a missing key, its name: never a value of the spec
            missing = f" {exc.args[0]!r}" if isinstance(exc, KeyError) and exc.args else ""
            raise SpecError(f"the attempt spec is not valid: {type(exc).__name__}{missing}") from None


def termination_message(outcome: Outcome) -> str:
    """The outcome as the container's termination message: compact JSON within the kubelet's limit."""
    data = outcome.to_json()
    data["detail"] = str(data["detail"])[:DETAIL_LIMIT]
    text = json.dumps(data, sort_keys=True, separators=(",", ":"))
    while len(text.encode()) > TERMINATION_MESSAGE_LIMIT and data["detail"]:
        data["detail"] = ""  # the detail is for logs; the kind, task and message are the outcome
        text = json.dumps(data, sort_keys=True, separators=(",", ":"))
    if len(text.encode()) > TERMINATION_MESSAGE_LIMIT:
        data["message"] = str(data.get("message") or "")[:1024]
        data["task"] = str(data.get("task") or "")[:120]
        text = json.dumps(data, sort_keys=True, separators=(",", ":"))
    return text


def outcome_of(message: str | None) -> Outcome | None:
    """The outcome a Job's container wrote as its termination message; None when there is none or it is
    not one (the Pod was killed before, or something else wrote there)."""
    if not message:
        return None
    try:
        data = json.loads(message)
        if not isinstance(data, dict):
            return None
        return Outcome.from_json(data)
    except (ValueError, KeyError, TypeError):
        return None


def interrupted(why: str, now: float, *, died_past_drain_point: bool) -> Outcome:
    """A Job that died mid-play (its Pod deleted, evicted or out of time): retried; the next attempt
    resumes it unchecked when ``died_past_drain_point`` (its play may have disrupted the machine), else it
    is a new start (Outcome.died_past_drain_point)."""
    return Outcome(
        OutcomeKind.INTERRUPTED, detail=why, finished=now, died_past_drain_point=died_past_drain_point
    )
