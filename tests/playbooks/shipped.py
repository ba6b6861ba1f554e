"""Helpers for the shipped capabilities' lab tests (os_update, kubelet_credentials).

``install_os_update_standin`` puts a STAND-IN OS update command (/usr/local/sbin/os-update) and version
reader (/usr/local/bin/os-version) on a lab host: the command stages ``--version V`` for the next boot
and exits 100 (the capabilities file's ``reboot_exit_code``), or fails as its mode file says
(``retriable:N`` = exit 75 "temporary failure" N times, ``terminal`` = exit 1 "incompatible",
``rollback`` = the staged version is dropped at the next boot). The staged version becomes the booted
one when the host's boot id has changed (``hostlab`` reboot): that is the stand-in's "boot".
``plan_for`` plans an UpdateMachine request through a capabilities file, as the service does.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hostlab.lab import Host, Lab

from inplace_extension.capabilities_file import parse_capabilities
from inplace_extension.inplace.plan import Plan, plan_update

from .support import RunResult, RunSpec, host_root, run_update

STANDIN = "/var/lib/os-update-standin"
FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "capi" / "update_machine" / "6B.request.json"

OS_UPDATE_SCRIPT = r"""#!/bin/sh
# STAND-IN OS update command (tests/playbooks/shipped.py): stages --version V for the next boot
set -eu
s=/var/lib/os-update-standin
usage="usage: os-update --image URL --version V"
[ "${1:-}" = --image ] && [ "${3:-}" = --version ] || { echo "$usage" >&2; exit 2; }
printf '%s\n' "$*" >>"$s/calls"
mode=$(cat "$s/mode")
case $mode in
  retriable:*)
    n=${mode#retriable:}
    if [ "$n" -gt 0 ]; then
      echo "retriable:$((n - 1))" >"$s/mode"
      echo "temporary failure: image pull timed out" >&2
      exit 75
    fi ;;
  terminal) echo "incompatible: this image is refused on this hardware" >&2; exit 1 ;;
esac
printf '%s\n' "$4" >"$s/staged"
cat /proc/sys/kernel/random/boot_id >"$s/staged_boot"
if [ "$mode" = rollback ]; then : >"$s/rollback"; fi
exit 100
"""

OS_VERSION_SCRIPT = r"""#!/bin/sh
# STAND-IN booted-OS-version reader (tests/playbooks/shipped.py): a staged version boots at the next boot
set -eu
s=/var/lib/os-update-standin
if [ -f "$s/staged" ] && [ "$(cat "$s/staged_boot")" != "$(cat /proc/sys/kernel/random/boot_id)" ]; then
  if [ -f "$s/rollback" ]; then rm -f "$s/rollback"; else mv "$s/staged" "$s/booted"; fi
  rm -f "$s/staged" "$s/staged_boot"
fi
cat "$s/booted"
"""

CAPABILITIES_FILE = """
os_update:
  claim: {kind: Metal3Machine, pointer: /image/url}
  command: /usr/local/sbin/os-update
  args: ["--image", "{target}", "--version", "{version}"]
  version_pattern: "os-(?P<version>[0-9]+[.][0-9]+[.][0-9]+)[.]qcow2$"
  version_command: [/usr/local/bin/os-version]
  retriable_exit_codes: [75]
  retriable_patterns: ["temporary failure"]
  terminal_patterns: ["incompatible"]
  retries: %(retries)d
  retry_delay_seconds: 0
  reboot_exit_code: 100
  reboot_timeout_seconds: 120
kubelet_credentials:
  annotation: example.com/rotate-kubelet-credentials
"""
ANNOTATION = "example.com/rotate-kubelet-credentials"


def install_os_update_standin(lab: Lab, host: Host, booted: str = "1.0.0", mode: str = "ok") -> None:
    host_root(lab, host, ["mkdir", "-p", STANDIN])
    host_root(lab, host, ["sh", "-c", f"cat >{STANDIN}/booted"], stdin=booted + "\n")
    set_mode(lab, host, mode)
    for path, script in (
        ("/usr/local/sbin/os-update", OS_UPDATE_SCRIPT),
        ("/usr/local/bin/os-version", OS_VERSION_SCRIPT),
    ):
        host_root(lab, host, ["sh", "-c", f"cat >{path} && chmod 755 {path}"], stdin=script)


def set_mode(lab: Lab, host: Host, mode: str) -> None:
    host_root(lab, host, ["sh", "-c", f"cat >{STANDIN}/mode"], stdin=mode + "\n")


def standin_calls(lab: Lab, host: Host) -> list[str]:
    return host_root(lab, host, ["sh", "-c", f"cat {STANDIN}/calls 2>/dev/null || true"]).splitlines()


def desired(image_url: str | None = None, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    """An UpdateMachine ``desired`` for a Metal3 worker: only the shipped capabilities' fields."""
    body = json.loads(FIXTURE.read_text())
    objects: dict[str, Any] = body["desired"]
    objects["bootstrapConfig"]["spec"] = {}
    objects["machine"]["spec"].pop("version", None)
    infra = objects["infrastructureMachine"]
    infra["apiVersion"], infra["kind"] = "infrastructure.cluster.x-k8s.io/v1beta1", "Metal3Machine"
    infra["spec"] = {} if image_url is None else {"image": {"url": image_url, "checksum": "sha256:00"}}
    objects["machine"]["metadata"].setdefault("annotations", {}).update(annotations or {})
    return objects


def plan_for(objects: dict[str, Any], retries: int = 2) -> Plan:
    return plan_update(objects, parse_capabilities(CAPABILITIES_FILE % {"retries": retries}))


def run_plan(
    lab: Lab, host: Host, workdir: Path, plan: Plan, inputs: dict[str, Any] | None = None
) -> RunResult:
    """Run ``plan`` (or other ``inputs`` under its steps) through the real playbook, as the service does."""
    custom = [{"capability": step.capability, "role": step.role} for step in plan.steps if step.role]
    spec = RunSpec(
        lab,
        host,
        workdir,
        inputs if inputs is not None else plan.inputs,
        capabilities=list(plan.capabilities),
        fingerprint=plan.fingerprint,
        extravars={"update_machine_custom": custom},
    )
    return run_update(spec)


def failed_tasks(result: RunResult) -> list[str]:
    return [e["event_data"]["task"] for e in result.events if e["event"] == "runner_on_failed"]
