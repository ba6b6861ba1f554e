"""The program the lab provider runs on a node (as root: ``sudo python3 -c <this file>``); standard library.

It reads one JSON request on stdin and writes one JSON answer on stdout; the request's strings are data
here, never a command line. Two operations:

- ``provision``: what cloud-init does with CABPK's cloud-config, in cloud-init's order: the ``bootcmd``
  script, then the files of ``write_files`` (parents made, content written or appended, mode and owner
  set), then the ``runcmd`` script; both scripts run by ``/bin/sh`` with their output in
  :data:`OUTPUT_LOG` (where cloud-init keeps ``cloud-init-output.log``); then whether CABPK's sentinel
  file exists. The written paths are recorded in :data:`STATE_DIR` for ``reset``.
- ``reset``: the node back to the pool: the scripts of an earlier ``provision`` still running ended (their
  process groups), ``kubeadm reset -f`` when kubeadm is installed, then every file
  ``provision`` wrote and the directories it made (when empty), CABPK's directories (``/run/cluster-api``,
  ``/run/kubeadm``), the scripts, the log and the record removed.
"""

from __future__ import annotations

import base64
import contextlib
import grp
import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

STATE_DIR = Path("/var/lib/hostlab-lab-provider")
WRITTEN = STATE_DIR / "written.json"
OUTPUT_LOG = Path("/var/log/hostlab-lab-provider-output.log")
CABPK_DIRS = (Path("/run/cluster-api"), Path("/run/kubeadm"))
TAIL = 2000  # characters of a failed script's output in the answer
SCRIPT_TIMEOUT = 900  # kubeadm init/join take minutes on a busy machine; a hung command must not hang us


def main() -> None:
    request = json.load(sys.stdin)
    try:
        answer = provision(request) if request["op"] == "provision" else reset()
    except (OSError, KeyError, ValueError, subprocess.SubprocessError) as exc:
        answer = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    json.dump(answer, sys.stdout)


def provision(request: dict[str, Any]) -> dict[str, Any]:
    STATE_DIR.mkdir(mode=0o700, parents=True, exist_ok=True)
    steps: list[dict[str, Any]] = []
    if request.get("bootcmd"):
        steps.append(run_script("bootcmd", request["bootcmd"]))
        if steps[-1]["exit"] != 0:
            return {"ok": False, "steps": steps, "error": "bootcmd failed"}
    written = _load_written()
    for entry in request["files"]:
        path = Path(entry["path"])
        written.append(str(path))
        written += [
            f"{parent}/" for parent in path.parents if not parent.exists()
        ]  # the directories it makes
        WRITTEN.write_text(json.dumps(sorted(set(written))))  # before the write: reset undoes a half-done one
        write_file(
            path, base64.b64decode(entry["content"]), entry["permissions"], entry["owner"], entry["append"]
        )
    if request.get("runcmd"):
        steps.append(run_script("runcmd", request["runcmd"]))
    sentinel = Path(request["sentinel"]).is_file()
    return {"ok": True, "steps": steps, "sentinel": sentinel}


def write_file(path: Path, content: bytes, permissions: int, owner: str, append: bool) -> None:
    user, _, group = owner.partition(":")
    uid = pwd.getpwnam(user).pw_uid
    gid = grp.getgrnam(group).gr_gid if group else pwd.getpwnam(user).pw_gid
    path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else os.O_TRUNC)
    fd = os.open(path, flags, permissions)
    try:
        os.write(fd, content)
        os.fchmod(fd, permissions)  # the mode of an existing file too (open's mode applies only on create)
        os.fchown(fd, uid, gid)
    finally:
        os.close(fd)


def run_script(name: str, text: str) -> dict[str, Any]:
    """Run the script in a session of its own, its group recorded (``<name>.pgid``) so that a ``reset``
    after a lost controller ends it and whatever it started (a kubeadm still running)."""
    script = STATE_DIR / name
    script.write_text(text)
    script.chmod(0o700)
    group = STATE_DIR / f"{name}.pgid"
    with OUTPUT_LOG.open("ab") as log:
        log.write(f"--- {name}\n".encode())
        log.flush()
        with subprocess.Popen(
            ["/bin/sh", str(script)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        ) as proc:
            group.write_text(str(proc.pid))
            try:
                output, _ = proc.communicate(timeout=SCRIPT_TIMEOUT)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                output, _ = proc.communicate()
        group.unlink(missing_ok=True)
        log.write(output)
    return {"name": name, "exit": proc.returncode, "output": output.decode(errors="replace")[-TAIL:]}


def end_scripts() -> None:
    """End the process groups of scripts an earlier ``provision`` left running (its controller was lost)."""
    for group in STATE_DIR.glob("*.pgid"):
        pgid = int(group.read_text())
        script = str(group.with_suffix(""))
        try:
            leader = Path(f"/proc/{pgid}/cmdline").read_bytes().split(b"\0")[:2]
        except FileNotFoundError:
            leader = None  # the script ended; what it started may still run in its group
        if leader is None or leader == [b"/bin/sh", script.encode()]:  # not a PID reused by another
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)


def reset() -> dict[str, Any]:
    steps: list[dict[str, Any]] = []
    if STATE_DIR.is_dir():
        end_scripts()
    kubeadm = shutil.which("kubeadm")
    if kubeadm:
        result = subprocess.run(
            [kubeadm, "reset", "-f"], capture_output=True, text=True, timeout=SCRIPT_TIMEOUT, check=False
        )
        steps.append({"name": "kubeadm reset", "exit": result.returncode, "output": result.stdout[-TAIL:]})
    written = _load_written()
    for path in written:
        if not path.endswith("/"):
            Path(path).unlink(missing_ok=True)
    for made in sorted((p for p in written if p.endswith("/")), key=len, reverse=True):
        with contextlib.suppress(OSError):  # not empty: something else lives there now, it stays
            Path(made).rmdir()
    for directory in (*CABPK_DIRS, STATE_DIR):
        shutil.rmtree(directory, ignore_errors=True)
    OUTPUT_LOG.unlink(missing_ok=True)
    failed = [s["name"] for s in steps if s["exit"] != 0]
    return {"ok": not failed, "steps": steps, **({"error": f"{', '.join(failed)} failed"} if failed else {})}


def _load_written() -> list[str]:
    """The paths ``provision`` wrote: files, and the directories it made (ending in ``/``)."""
    try:
        return [str(p) for p in json.loads(WRITTEN.read_text())]
    except FileNotFoundError:
        return []


if __name__ == "__main__":
    main()
