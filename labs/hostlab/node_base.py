"""The root filesystem of the lab's nodes: Debian with systemd, sshd, containerd, runc and the CNI plugins.

Built once per machine with mmdebstrap from Debian packages (``base.build_cached``: locked, renamed into
place when complete) and shared read-only by every node of every lab, each node overlaying its own
writable layer. Unlike the chroot hosts' base it keeps its init system: services start and restart as
on any Debian machine. What a Kubernetes node needs beyond the packages is set here: containerd's CNI
directories and one bridge network (the kubelet reports NotReady without a CNI config), and
systemd-timesyncd allowed to run in a container (its unit skips containers; the node gets no
CAP_SYS_TIME, so it can never set the machine's clock).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

from hostlab.base import base_ready, build_cached, configure_login
from hostlab.config import Config
from hostlab.errors import LabUnavailable

NODE_PACKAGES = (
    *("systemd", "systemd-sysv", "systemd-timesyncd", "dbus", "openssh-server", "python3", "python3-apt"),
    *("containerd", "runc", "containernetworking-plugins", "iptables", "conntrack", "ethtool", "socat"),
    *("sudo", "ca-certificates", "iproute2", "kmod", "mount"),
)

# containerd 1.6 (bookworm) looks for CNI plugins in /opt/cni/bin; Debian installs them in /usr/lib/cni
CONTAINERD_CONFIG = """\
# hostlab node: Debian's CNI plugin directory, cgroupfs (the kubelet's cgroupDriver on this lab)
version = 2
[plugins."io.containerd.grpc.v1.cri".cni]
  bin_dir = "/usr/lib/cni"
  conf_dir = "/etc/cni/net.d"
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
  SystemdCgroup = false
"""
CNI_CONFIG = """\
{
  "cniVersion": "1.0.0",
  "name": "hostlab-pods",
  "plugins": [
    {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false,
     "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.244.0.0/24"}]]}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
"""
# systemd-timesyncd.service says ConditionVirtualization=!container; an empty assignment resets the
# conditions so the lab's ntp capability is tested against the real service
TIMESYNCD_DROPIN = "[Unit]\nConditionVirtualization=\n"


def _configure_node(root: Path, cfg: Config) -> None:
    configure_login(root, cfg)
    (root / "etc/containerd").mkdir(exist_ok=True)
    (root / "etc/containerd/config.toml").write_text(CONTAINERD_CONFIG)
    (root / "etc/cni/net.d").mkdir(parents=True, exist_ok=True)
    (root / "etc/cni/net.d/10-hostlab.conflist").write_text(CNI_CONFIG)
    dropin = root / "etc/systemd/system/systemd-timesyncd.service.d"
    dropin.mkdir(parents=True, exist_ok=True)
    (dropin / "hostlab.conf").write_text(TIMESYNCD_DROPIN)
    # each node gets its own machine id at start (node_init.sh); the kubelet reports it
    (root / "etc/machine-id").write_text("")


def ensure_node_base(cfg: Config, log: Callable[[str], None] = print) -> Path:
    """Return the nodes' root filesystem, building it first (about 90 s) if this machine has none yet."""
    base = cfg.node_base_dir
    if base_ready(base):
        return base
    if shutil.which("mmdebstrap") is None:
        raise LabUnavailable("missing mmdebstrap for the nodes' root filesystem (apt-get install mmdebstrap)")
    return build_cached(cfg, base, "mmdebstrap", NODE_PACKAGES, _configure_node, log)
