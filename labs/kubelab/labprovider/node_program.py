"""The program the lab provider runs on a node (as root: ``sudo python3 -c <this file>``); standard library.

It reads one JSON request on stdin and writes one JSON answer on stdout; the request's strings are data
here, never a command line. Two operations:

- ``provision``: first the machine image: the node's own kubelet and kubeadm (:data:`IMAGE_BINARIES`,
  the pool's image) kept in :data:`POOL_IMAGE`, and, when the LabMachine names an ``image``, that
  version's kubelet and kubeadm (carried by every pool node in :data:`IMAGES`) put in their place, as a
  bare-metal provider writes the image it was asked for. Then what cloud-init does with CABPK's
  cloud-config, in cloud-init's order: the ``bootcmd`` script, the files of ``write_files`` (parents
  made, content written or appended, mode and owner set), the ``users`` (missing groups and users
  created with ``useradd``, the password locked unless ``lock_passwd`` is false, an ``inactive`` account
  expired, the keys added to ``~/.ssh/authorized_keys``, the sudo rules in :data:`SUDOERS`, checked by
  ``visudo`` first; a user that exists already is not created again, as cloud-init skips it), the
  ``ntp`` servers (:data:`TIMESYNCD_DROPIN`, cloud-init's file for systemd-timesyncd, which is
  restarted), then the ``runcmd`` script; both scripts run by ``/bin/sh`` with their output in
  :data:`OUTPUT_LOG` (where cloud-init keeps ``cloud-init-output.log``); then whether CABPK's sentinel
  file exists. The written paths, and the users and groups created, are recorded in :data:`STATE_DIR`
  for ``reset``.
- ``reset``: the node back to the pool: the scripts of an earlier ``provision`` still running ended (their
  process groups), ``kubeadm reset -f`` when kubeadm is installed, the users and groups ``provision``
  created deleted (with their homes), then every file ``provision`` wrote and the directories it made
  (when empty) removed (systemd-timesyncd restarted when its drop-in went), the pool's kubelet and
  kubeadm put back, CABPK's directories (``/run/cluster-api``, ``/run/kubeadm``), the scripts, the log
  and the record removed. What else changed the node while a Machine held it (an in-place update's
  users or files) stays: the lab re-images nothing but the kubelet and kubeadm.
"""

from __future__ import annotations

import base64
import contextlib
import grp
import json
import os
import pwd
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

STATE_DIR = Path("/var/lib/hostlab-lab-provider")
WRITTEN = STATE_DIR / "written.json"
OUTPUT_LOG = Path("/var/log/hostlab-lab-provider-output.log")
CREATED = STATE_DIR / "created.json"  # {"users": [...], "groups": [...]} that provision created
CABPK_DIRS = (Path("/run/cluster-api"), Path("/run/kubeadm"))
IMAGES = Path("/opt/lab-kubernetes")  # <version>/kubelet and <version>/kubeadm: the images a node carries
IMAGE_BINARIES = (Path("/usr/bin/kubelet"), Path("/usr/bin/kubeadm"))
POOL_IMAGE = STATE_DIR / "pool-image"  # the node's own kubelet and kubeadm, put back by reset
VERSION = re.compile(r"v[0-9]+\.[0-9]+\.[0-9]+")
SUDOERS = Path("/etc/sudoers.d/90-cloud-init-users")  # cloud-init's file for the users' sudo rules
TIMESYNCD_DROPIN = Path("/etc/systemd/timesyncd.conf.d/cloud-init.conf")  # cloud-init's, for timesyncd
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
    image_error = install_image(request.get("image"))
    if image_error:
        return {"ok": False, "steps": steps, "error": image_error}
    if request.get("bootcmd"):
        steps.append(run_script("bootcmd", request["bootcmd"]))
        if steps[-1]["exit"] != 0:
            return {"ok": False, "steps": steps, "error": "bootcmd failed"}
    for entry in request["files"]:
        recorded_write(
            Path(entry["path"]),
            base64.b64decode(entry["content"]),
            entry["permissions"],
            entry["owner"],
            entry["append"],
        )
    for user in request.get("users", []):
        steps += add_user(user)
    if failure := failed(steps):
        return failure
    sudo_error = write_sudoers(request.get("users", []))
    if sudo_error:
        return {"ok": False, "steps": steps, "error": sudo_error}
    if request.get("ntp_servers"):
        servers = " ".join(request["ntp_servers"])
        content = (
            f"# the lab provider, from the bootstrap data's ntp (cloud-init's file)\n[Time]\nNTP={servers}\n"
        )
        recorded_write(TIMESYNCD_DROPIN, content.encode(), 0o644, "root:root", False)
        steps.append(run_command("restart systemd-timesyncd", ["systemctl", "restart", "systemd-timesyncd"]))
    if failure := failed(steps):
        return failure
    if request.get("runcmd"):
        steps.append(run_script("runcmd", request["runcmd"]))
    sentinel = Path(request["sentinel"]).is_file()
    return {"ok": True, "steps": steps, "sentinel": sentinel}


def failed(steps: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The provision's failed answer when a step of ``steps`` exited non-zero, naming those steps."""
    names = [s["name"] for s in steps if s["exit"] != 0]
    return {"ok": False, "steps": steps, "error": f"{', '.join(names)} failed"} if names else None


def recorded_write(path: Path, content: bytes, permissions: int, owner: str, append: bool) -> None:
    """:func:`write_file`, the path and the directories it makes recorded first for ``reset``."""
    written = _load_written()
    written.append(str(path))
    written += [f"{parent}/" for parent in path.parents if not parent.exists()]  # the directories it makes
    WRITTEN.write_text(json.dumps(sorted(set(written))))  # before the write: reset undoes a half-done one
    write_file(path, content, permissions, owner, append)


def install_image(version: str | None) -> str | None:
    """The pool's kubelet and kubeadm kept (once per claim), and ``version``'s put in their place; an
    error message when the node carries no such image."""
    if not POOL_IMAGE.is_dir():
        kept = POOL_IMAGE.with_name("pool-image.partial")
        shutil.rmtree(kept, ignore_errors=True)
        kept.mkdir(mode=0o700)
        for binary in IMAGE_BINARIES:
            if binary.exists():
                shutil.copy2(binary, kept / binary.name)
        kept.rename(POOL_IMAGE)  # complete or absent: reset never puts back half an image
    if not version:
        return None
    source = IMAGES / version
    if not VERSION.fullmatch(version) or not all((source / b.name).is_file() for b in IMAGE_BINARIES):
        return f"image {version!r}: the node carries no such image ({IMAGES}/<version>/kubelet and kubeadm)"
    for binary in IMAGE_BINARIES:
        _replace(source / binary.name, binary)
    return None


def _replace(source: Path, target: Path) -> None:
    """``source`` copied to ``target`` through a rename: a running kubelet keeps its old binary."""
    partial = target.with_name(f".{target.name}.lab-provider")
    shutil.copy2(source, partial)
    partial.replace(target)


def add_user(user: dict[str, Any]) -> list[dict[str, Any]]:
    """One user as cloud-init's users_groups module makes it (the module's docstring); the steps run."""
    created = _load_created()
    steps = []
    name = user["name"]
    for group in [*user["groups"], *([user["primary_group"]] if user["primary_group"] else [])]:
        if not _exists(grp.getgrnam, group):
            steps.append(run_command(f"groupadd {group}", ["groupadd", group]))
            created["groups"].append(group)
    if not _exists(pwd.getpwnam, name):
        argv = ["useradd", "--create-home"]
        for option, key in (
            ("--comment", "gecos"),
            ("--home-dir", "homedir"),
            ("--shell", "shell"),
            ("--gid", "primary_group"),
            ("--password", "passwd"),
        ):
            argv += [option, user[key]] if user[key] else []
        argv += ["--groups", ",".join(user["groups"])] if user["groups"] else []
        steps.append(run_command(f"useradd {name}", [*argv, name]))
        created["users"].append(name)
    CREATED.write_text(json.dumps(created))
    if steps and steps[-1]["exit"] != 0:
        return steps
    if user["lock_passwd"]:
        steps.append(run_command(f"lock {name}", ["usermod", "--lock", name]))
    if user["inactive"]:
        steps.append(run_command(f"expire {name}", ["usermod", "--expiredate", "1", name]))
    if user["ssh_authorized_keys"]:
        add_keys(name, user["ssh_authorized_keys"])
    return steps


def add_keys(name: str, keys: list[str]) -> None:
    """The keys added to the user's ``~/.ssh/authorized_keys`` (those it holds kept), mode 0600, theirs."""
    account = pwd.getpwnam(name)
    ssh = Path(account.pw_dir) / ".ssh"
    ssh.mkdir(mode=0o700, exist_ok=True)
    os.chown(ssh, account.pw_uid, account.pw_gid)
    path = ssh / "authorized_keys"
    held = path.read_text().splitlines() if path.exists() else []
    path.write_text("".join(f"{k}\n" for k in [*held, *(k for k in keys if k not in held)]))
    path.chmod(0o600)
    os.chown(path, account.pw_uid, account.pw_gid)


def write_sudoers(users: list[dict[str, Any]]) -> str | None:
    """The users' sudo rules in :data:`SUDOERS`, checked by ``visudo`` first (a bad file would stop every
    sudo on the node, the provider's own included); an error message when it refuses them."""
    lines = [f"# User rules for {u['name']}\n{u['name']} {rule}\n" for u in users for rule in u["sudo"]]
    if not lines:
        return None
    candidate = STATE_DIR / "sudoers.candidate"
    candidate.write_text("".join(lines))
    check = run_command("visudo -c", ["visudo", "-c", "-q", "-f", str(candidate)])
    if check["exit"] != 0:
        return f"the users' sudo rules are not valid sudoers: {check['output'].strip()}"
    recorded_write(SUDOERS, candidate.read_bytes(), 0o440, "root:root", False)
    return None


def run_command(name: str, argv: list[str]) -> dict[str, Any]:
    """``argv`` run without a shell (its items are data), its exit and the end of its output."""
    result = subprocess.run(argv, capture_output=True, text=True, timeout=SCRIPT_TIMEOUT, check=False)
    return {"name": name, "exit": result.returncode, "output": (result.stdout + result.stderr)[-TAIL:]}


def _exists(lookup: Any, name: str) -> bool:
    try:
        lookup(name)
    except KeyError:
        return False
    return True


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
        steps.append(run_command("kubeadm reset", [kubeadm, "reset", "-f"]))
    created = _load_created()
    for name in created["users"]:
        if _exists(pwd.getpwnam, name):  # --force: a login of the user's may still run
            steps.append(run_command(f"userdel {name}", ["userdel", "--force", "--remove", name]))
    for group in created["groups"]:
        if _exists(grp.getgrnam, group):
            steps.append(run_command(f"groupdel {group}", ["groupdel", group]))
    written = _load_written()
    for path in written:
        if not path.endswith("/"):
            Path(path).unlink(missing_ok=True)
    for made in sorted((p for p in written if p.endswith("/")), key=len, reverse=True):
        with contextlib.suppress(OSError):  # not empty: something else lives there now, it stays
            Path(made).rmdir()
    if str(TIMESYNCD_DROPIN) in written:
        restart = ["systemctl", "try-restart", "systemd-timesyncd"]
        steps.append(run_command("restart systemd-timesyncd", restart))
    if POOL_IMAGE.is_dir():  # the pool's kubelet and kubeadm back; one the node did not have, removed
        for binary in IMAGE_BINARIES:
            if (POOL_IMAGE / binary.name).is_file():
                _replace(POOL_IMAGE / binary.name, binary)
            else:
                binary.unlink(missing_ok=True)
    for directory in (*CABPK_DIRS, STATE_DIR):
        shutil.rmtree(directory, ignore_errors=True)
    OUTPUT_LOG.unlink(missing_ok=True)
    failed = [s["name"] for s in steps if s["exit"] != 0]
    return {"ok": not failed, "steps": steps, **({"error": f"{', '.join(failed)} failed"} if failed else {})}


def _load_created() -> dict[str, list[str]]:
    try:
        loaded: dict[str, list[str]] = json.loads(CREATED.read_text())
    except FileNotFoundError:
        return {"users": [], "groups": []}
    return loaded


def _load_written() -> list[str]:
    """The paths ``provision`` wrote: files, and the directories it made (ending in ``/``)."""
    try:
        return [str(p) for p in json.loads(WRITTEN.read_text())]
    except FileNotFoundError:
        return []


if __name__ == "__main__":
    main()
