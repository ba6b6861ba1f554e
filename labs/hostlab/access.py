"""Reaching a lab's hosts from the controller: SSH (pinned host keys), nsenter, and Ansible settings.

:class:`LabAccess` is mixed into :class:`hostlab.lab.Lab`; it needs only the lab's directory and its
``host()`` lookup, and owns the paths of the lab's client key, known_hosts and ControlPath directory.
"""

from __future__ import annotations

import shlex
import subprocess
from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path

from hostlab.config import LOGIN_USER
from hostlab.errors import LabError
from hostlab.state import Host


class LabAccess(ABC):
    """SSH and nsenter access to the hosts of the lab in ``dir``."""

    dir: Path

    @abstractmethod
    def host(self, ref: str | int) -> Host:
        """The host ``ref`` (name or index) of this lab; :class:`hostlab.lab.Lab` provides it."""

    @property
    def private_key(self) -> Path:
        return self.dir / "id_ed25519"

    @property
    def known_hosts(self) -> Path:
        return self.dir / "known_hosts"

    @property
    def control_path_dir(self) -> Path:
        """Use as ANSIBLE_SSH_CONTROL_PATH_DIR so ``down`` can close Ansible's SSH masters first."""
        return self.dir / "cp"

    def known_hosts_line(self, host: Host) -> str:
        key = (host.dir / "ssh_host_ed25519_key.pub").read_text().split()
        return f"{host.address} {key[0]} {key[1]}"

    def ssh_argv(self, host: Host, user: str = LOGIN_USER, *, connect_timeout: int = 5) -> list[str]:
        """ssh client arguments for ``host`` with host-key verification ON (pinned known_hosts)."""
        return ["ssh", "-i", str(self.private_key), "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
                "-o", f"UserKnownHostsFile={self.known_hosts}", "-o", "StrictHostKeyChecking=yes",
                "-o", "GlobalKnownHostsFile=/dev/null", "-o", "ControlMaster=no", "-o", "ControlPath=none",
                "-o", f"ConnectTimeout={connect_timeout}", "-o", "LogLevel=ERROR",
                f"{user}@{host.address}"]  # fmt: skip

    def ssh(
        self,
        host: Host | str | int,
        command: Sequence[str],
        *,
        user: str = LOGIN_USER,
        timeout: float = 60,
        connect_timeout: int = 5,
        input_text: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run ``command`` (an argv, quoted for the remote shell) on ``host`` over SSH; returns any exit."""
        target = host if isinstance(host, Host) else self.host(host)
        argv = [*self.ssh_argv(target, user, connect_timeout=connect_timeout), "--", shlex.join(command)]
        return subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout, input=input_text, check=False
        )

    def read_file(self, host: Host | str | int, path: str) -> str:
        """Read a file on ``host`` over SSH (with sudo, so root-only files work too)."""
        result = self.ssh(host, ["sudo", "-n", "cat", "--", path])
        if result.returncode != 0:
            raise LabError(f"cannot read {path}: {result.stderr.strip()}")
        return result.stdout

    def exec_in(
        self,
        host: Host | str | int,
        argv: Sequence[str],
        *,
        timeout: float = 60,
        input_text: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` as root inside ``host``'s namespaces and root, without SSH (works with no sshd)."""
        target = host if isinstance(host, Host) else self.host(host)
        pid1 = target.pid1
        if pid1 is None:
            raise LabError(f"host {target.name} is not running")
        nsenter = ["nsenter", "-t", str(pid1), "-m", "-u", "-i", "-n", "-p", "-r", "-w"]
        env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
        return subprocess.run(
            [*nsenter, *argv], capture_output=True, text=True, timeout=timeout, input=input_text,
            check=False, env=env,
        )  # fmt: skip

    def ansible_env(self) -> dict[str, str]:
        """Environment for ansible-playbook/ansible-runner runs against this lab."""
        return {"ANSIBLE_SSH_CONTROL_PATH_DIR": str(self.control_path_dir), "ANSIBLE_NOCOLOR": "1"}
