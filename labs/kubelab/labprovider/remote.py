"""Carrying out on a pool node over SSH: :mod:`kubelab.labprovider.node_program` run as root with sudo, the
request on its stdin as JSON. The SSH command line is our own program only; the bootstrap data (file
contents, paths, CABPK's scripts) travels as data on stdin, so no string from the cluster reaches a shell
on its way to the node.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import shlex
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hostlab.lab import Host
from hostlab.lab import Lab as HostLab

from kubelab.labprovider import cloudconfig

PROGRAM = (Path(__file__).resolve().parent / "node_program.py").read_text()
TIMEOUT = 1200.0  # above the node program's own script timeout (900 s), plus kubeadm reset
_running: set[subprocess.Popen[str]] = set()  # the SSH clients in flight, for stop_all
_lock = threading.Lock()


@dataclass(frozen=True)
class Outcome:
    ok: bool
    sentinel: bool  # CABPK's success sentinel exists after runcmd (provision only)
    message: str  # what failed, with the end of the failed script's output; "" when ok


def provision(
    lab: HostLab, host: Host, bootstrap: cloudconfig.Bootstrap, image: str | None = None
) -> Outcome:
    """The bootstrap carried out on ``host`` over ``image`` (a Kubernetes version the node carries; None:
    the node's own kubelet and kubeadm)."""
    files = [
        {
            "path": f.path,
            "content": base64.b64encode(f.content).decode(),
            "permissions": f.permissions,
            "owner": f.owner,
            "append": f.append,
        }
        for f in bootstrap.files
    ]
    request = {
        "op": "provision",
        "files": files,
        "bootcmd": bootstrap.bootcmd,
        "runcmd": bootstrap.runcmd,
        "users": [dataclasses.asdict(u) for u in bootstrap.users],
        "ntp_servers": list(bootstrap.ntp_servers),
        "image": image,
        "sentinel": cloudconfig.SENTINEL,
    }
    answer = _run(lab, host, request)
    failed = [s for s in answer.get("steps", []) if s.get("exit") != 0]
    detail = "; ".join(f"{s['name']} exited {s['exit']}: {s['output'].strip()[-500:]}" for s in failed)
    if not answer.get("ok"):
        return Outcome(False, False, f"{answer.get('error', 'failed')}{'; ' + detail if detail else ''}")
    sentinel = bool(answer.get("sentinel"))
    if not sentinel:
        why = detail or "every command exited 0"
        return Outcome(True, False, f"CABPK's success sentinel {cloudconfig.SENTINEL} is missing ({why})")
    return Outcome(True, True, "")


def reset(lab: HostLab, host: Host) -> Outcome:
    answer = _run(lab, host, {"op": "reset"})
    if answer.get("ok"):
        return Outcome(True, False, "")
    steps = "; ".join(f"{s['name']}: {s['output'].strip()[-500:]}" for s in answer.get("steps", []))
    return Outcome(False, False, f"{answer.get('error', 'reset failed')}{'; ' + steps if steps else ''}")


def _run(lab: HostLab, host: Host, request: dict[str, Any]) -> dict[str, Any]:
    argv = [
        *lab.ssh_argv(host, connect_timeout=10),
        "--",
        shlex.join(["sudo", "-n", "python3", "-c", PROGRAM]),
    ]
    with subprocess.Popen(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as proc:
        with _lock:
            _running.add(proc)
        try:
            stdout, stderr = proc.communicate(json.dumps(request), timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            return {"ok": False, "error": f"no answer from {host.name} over SSH within {TIMEOUT:g}s"}
        finally:
            with _lock:
                _running.discard(proc)
    try:
        answer: dict[str, Any] = json.loads(stdout)
    except ValueError:
        why = (stderr or stdout).strip()[-500:]
        return {"ok": False, "error": f"SSH to {host.name} failed (exit {proc.returncode}): {why}"}
    return answer


def stop_all() -> None:
    """End the SSH clients still running (the controller is stopping), by their PIDs, and reap them."""
    with _lock:
        running = list(_running)
    for proc in running:
        proc.terminate()
    for proc in running:
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
