"""How a run reaches its host over SSH: the connection's Ansible host variables (address, port, user, key,
host keys pinned in the attempt's own known_hosts), and the directory of ssh's ControlPersist sockets
that plays share and the service closes on shutdown. Used by :mod:`inplace_extension.plays.runner`.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from inplace_extension.runs.resolve import HostTarget

HOST_KEY_ALIAS = "inplace-extension-target"  # known_hosts lines are written for this alias, see _ssh_args
# ssh's ControlPath socket must fit in sun_path (107 bytes and a NUL): the directory, '/', the 40-char %C
# hash and the 17-char suffix ('.' and 16 random characters) of the temporary name ssh binds first
MAX_CONTROL_DIR_LEN = 49


def host_vars(target: HostTarget, attempt_dir: Path) -> dict[str, Any]:
    host: dict[str, Any] = {
        "ansible_host": target.address,
        "ansible_port": target.port,
        "ansible_become": target.become,
        "ansible_host_key_checking": not target.insecure_skip_host_key_check,
        "ansible_ssh_common_args": _ssh_args(target, attempt_dir),
    }
    if target.user:
        host["ansible_user"] = target.user
    if target.private_key_file:
        host["ansible_ssh_private_key_file"] = str(target.private_key_file)
    if target.python_interpreter:
        host["ansible_python_interpreter"] = target.python_interpreter
    return host


def _ssh_args(target: HostTarget, attempt_dir: Path) -> str:
    if target.insecure_skip_host_key_check:
        return "-o UserKnownHostsFile=/dev/null -o StrictHostKeyChecking=no"
    known_hosts = attempt_dir / "known_hosts"
    # the alias pins the key to this target whatever address/port it has; the system files are ignored
    known_hosts.write_text("".join(f"{HOST_KEY_ALIAS} {key}\n" for key in target.host_keys), encoding="utf-8")
    return " ".join(
        [
            "-o",
            shlex.quote(f"UserKnownHostsFile={known_hosts}"),
            "-o GlobalKnownHostsFile=/dev/null",
            "-o StrictHostKeyChecking=yes",
            f"-o HostKeyAlias={HOST_KEY_ALIAS}",
        ]
    )


def control_path_dir(state_dir: Path) -> Path:
    """Where ssh ControlPersist sockets go: under the runs dir unless that path is too long for a socket."""
    wanted = state_dir / "cp"
    if len(str(wanted)) <= MAX_CONTROL_DIR_LEN:
        return wanted
    digest = hashlib.sha256(str(state_dir).encode()).hexdigest()[:10]
    return Path(tempfile.gettempdir()) / f"inplace-cp-{os.getuid()}-{digest}"


def close_control_masters(state_dir: Path) -> None:
    """End the ssh ControlPersist masters our runs left (they would linger up to ControlPersist)."""
    cp_dir = control_path_dir(state_dir)
    if not cp_dir.is_dir():
        return
    for sock in cp_dir.iterdir():
        if sock.is_socket():
            subprocess.run(
                ["ssh", "-O", "exit", "-o", f"ControlPath={sock}", "control-master"],
                capture_output=True,
                timeout=10,
                check=False,
            )
    if cp_dir.parent != state_dir:
        # the fallback under the temp dir: leave nothing behind. A master removes its socket just after
        # "ssh -O exit" returns, so give the directory a moment to become empty.
        deadline = time.monotonic() + 2.0
        while True:
            try:
                cp_dir.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                if time.monotonic() > deadline or any(not p.is_socket() for p in cp_dir.iterdir()):
                    return
                time.sleep(0.05)
