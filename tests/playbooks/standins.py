"""Stand-in Kubernetes commands for lab hosts (tests only).

The lab hosts (hostlab) are plain Debian with sshd under a tiny init: no systemd and no Kubernetes
packages. The kubelet_args and kubernetes_version roles stay real (they run ``systemctl restart
kubelet``, ``kubelet --version``, ``kubeadm upgrade node``, wait on the kubelet healthz endpoint and
download release binaries); on lab hosts these commands are STAND-INS from ``standin_files/``:

* ``/usr/bin/kubelet``   ``--version`` prints the baked-in version; otherwise it serves
  ``http://127.0.0.1:10248/healthz`` (``/usr/local/lib/inplace-standins/healthz.py``).
* ``/usr/bin/kubeadm``   logs ``upgrade node`` / ``upgrade apply vX`` (with its own version).
* ``/usr/bin/kubectl``   answers only kubeadm-config's ClusterConfiguration query.
* ``/usr/local/bin/systemctl``  logs calls; ``restart kubelet`` restarts the health server.

Every call is appended to ``/var/lib/inplace-standins/calls.log`` as ``<name>[@version] <args>``.

Use (``tests/`` is on sys.path under pytest, so this package imports as ``playbooks``)::

    from playbooks.standins import install_standins, lab_run_on_host, standin_binary
    install_standins(lab_run_on_host(lab, host), version="v1.30.2")     # hostlab fixture objects
    install_standins(ssh_run_on_host(address, user, key_file, known_hosts))  # any SSH host

``install_standins(run_on_host, version)`` needs only a callable ``run_on_host(argv, stdin)`` that
runs ``argv`` AS ROOT on the host with ``stdin`` bytes and raises on a non-zero exit, so any lab
fixture can provide it. ``standin_binary(name, version)`` gives the bytes of a stand-in, e.g. to serve
as a "release binary" to the role's binary download.
"""

from __future__ import annotations

import base64
import io
import subprocess
import tarfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hostlab.lab import Host, Lab

STANDINS_DIR = Path(__file__).parent / "standin_files"
CALLS_LOG = "/var/lib/inplace-standins/calls.log"
KUBERNETES_BINARIES = ("kubeadm", "kubelet", "kubectl")

RunOnHost = Callable[[Sequence[str], bytes], None]


def standin_binary(name: str, version: str) -> bytes:
    """The stand-in ``name`` (kubeadm, kubelet, kubectl) reporting ``version``."""
    if name not in KUBERNETES_BINARIES:
        raise ValueError(f"no stand-in named {name!r}; have {', '.join(KUBERNETES_BINARIES)}")
    return (STANDINS_DIR / name).read_bytes().replace(b"@VERSION@", version.encode())


def _archive(version: str) -> bytes:
    files: list[tuple[str, bytes, int]] = [
        *((f"usr/bin/{name}", standin_binary(name, version), 0o755) for name in KUBERNETES_BINARIES),
        ("usr/local/bin/systemctl", (STANDINS_DIR / "systemctl").read_bytes(), 0o755),
        ("usr/local/lib/inplace-standins/healthz.py", (STANDINS_DIR / "healthz.py").read_bytes(), 0o644),
        ("var/lib/inplace-standins/cluster-version", f"{version}\n".encode(), 0o644),
    ]
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for path, data, mode in files:
            info = tarfile.TarInfo(path)
            info.size, info.mode, info.uid, info.gid = len(data), mode, 0, 0
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def install_standins(run_on_host: RunOnHost, version: str = "v1.30.2") -> None:
    """Install the stand-ins at ``version`` on one host and start the kubelet stand-in.

    ``run_on_host(argv, stdin)`` must run ``argv`` as root on the host and raise on failure.
    """
    run_on_host(["tar", "-xf", "-", "-C", "/"], _archive(version))
    run_on_host(["/usr/local/bin/systemctl", "start", "kubelet"], b"")


def ssh_run_on_host(address: str, user: str, key_file: str, known_hosts: str) -> RunOnHost:
    """A ``run_on_host`` for :func:`install_standins` over ssh + passwordless sudo."""

    def run(argv: Sequence[str], stdin: bytes) -> None:
        # argv goes through the remote shell, so only fixed, test-owned words are passed here
        cmd = [
            "ssh",
            "-i",
            key_file,
            "-o",
            f"UserKnownHostsFile={known_hosts}",
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            "BatchMode=yes",
            f"{user}@{address}",
            "sudo",
            "-n",
            *argv,
        ]
        proc = subprocess.run(cmd, input=stdin, capture_output=True, timeout=60, check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} on {address} failed ({proc.returncode}): {proc.stderr!r}")

    return run


def lab_run_on_host(lab: Lab, host: Host) -> RunOnHost:
    """A ``run_on_host`` for :func:`install_standins` through hostlab's ``exec_in`` (root, no SSH)."""

    def run(argv: Sequence[str], stdin: bytes) -> None:
        # exec_in passes text: carry the bytes as base64 and decode them on the host
        wrapped = ["sh", "-c", 'base64 -d | "$@"', "sh", *argv]
        proc = lab.exec_in(host, wrapped, input_text=base64.b64encode(stdin).decode())
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} on {host.name} failed ({proc.returncode}): {proc.stderr}")

    return run
