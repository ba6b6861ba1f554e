"""Can this machine run a lab? A cheap check that names the first missing piece.

Probes run in throw-away namespaces (a fresh network namespace for veth/bridge, a private mount
namespace for tmpfs + overlay), so the check leaves nothing behind even when it is interrupted.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from hostlab.base import base_ready
from hostlab.config import Config
from hostlab.node_base import node_base_dir
from hostlab.state import NODE

CAPS = {
    21: "CAP_SYS_ADMIN (mounts, unshare)",
    12: "CAP_NET_ADMIN (netns, veth, bridge)",
    18: "CAP_SYS_CHROOT",
}
TOOLS = {
    "ip": "iproute2",
    "unshare": "util-linux",
    "nsenter": "util-linux",
    "chroot": "coreutils",
    "mount": "mount",
    "ssh": "openssh-client",
    "ssh-keygen": "openssh-client",
}


def _probe(argv: list[str]) -> str | None:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    if proc.returncode == 0:
        return None
    return (proc.stderr or proc.stdout).strip() or f"exit {proc.returncode}"


def missing(cfg: Config, kind: str = "host") -> str | None:
    """None if a lab of ``kind`` can start here, else one line saying what is missing and how to get it."""
    if os.geteuid() != 0:
        return "needs root (network namespaces, overlay mounts, chroot)"
    for tool, package in TOOLS.items():
        if shutil.which(tool) is None:
            return f"missing command {tool} (apt-get install {package})"
    if kind == NODE:
        if shutil.which("systemd-nspawn") is None:
            return "missing command systemd-nspawn to boot the nodes (apt-get install systemd-container)"
        if not base_ready(node_base_dir(cfg)) and shutil.which("mmdebstrap") is None:
            return f"no node root at {node_base_dir(cfg)} and no mmdebstrap (apt-get install mmdebstrap)"
    if not base_ready(cfg.base_dir):
        tool = cfg.bootstrap or ("mmdebstrap" if shutil.which("mmdebstrap") else "debootstrap")
        if shutil.which(tool) is None:
            return f"no cached base at {cfg.base_dir} and no {tool} to build it (apt-get install {tool})"
    filesystems = Path("/proc/filesystems").read_text()
    for fs in ("overlay", "tmpfs"):
        if fs not in filesystems.split():
            return f"kernel has no {fs} filesystem"
    status = Path("/proc/self/status").read_text()
    cap_eff = int(next(line.split()[1] for line in status.splitlines() if line.startswith("CapEff:")), 16)
    for bit, what in CAPS.items():
        if not cap_eff >> bit & 1:
            return f"no {what}"
    why = _probe(
        [
            "unshare",
            "--net",
            "sh",
            "-c",
            "ip link add hlpa type veth peer name hlpb && ip link add hlpc type bridge",
        ]
    )
    if why:
        return f"cannot create veth/bridge in a network namespace: {why}"
    with tempfile.TemporaryDirectory(prefix="hostlab-probe-") as tmp:
        script = (
            'mount -t tmpfs -o size=1m t "$1" && mkdir "$1/l" "$1/u" "$1/w" "$1/m" && '
            'mount -t overlay o -o "lowerdir=$1/l,upperdir=$1/u,workdir=$1/w" "$1/m"'
        )
        why = _probe(["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", tmp])
    if why:
        return f"overlay mount over tmpfs refused (nested container?): {why}"
    return None
