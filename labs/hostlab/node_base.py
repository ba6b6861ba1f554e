"""The root filesystem of the lab's nodes: Debian with systemd, sshd, containerd, runc and the CNI plugins.

Built once per machine with mmdebstrap from Debian packages (``base.build_cached``: locked, renamed into
place when complete) and shared read-only by every node of every lab, each node overlaying its own
writable layer. Its directory name carries a hash of the whole recipe (:func:`node_base_dir`), so a
changed recipe builds a new root and never replaces the lower layer of a running node. Unlike the
chroot hosts' base it keeps its init system: services start and restart as on any Debian machine.

What a Kubernetes node that runs Pods needs beyond the packages is set here:

- containerd's CRI: Debian's CNI plugin directory, the cgroupfs driver, the lab's **stand-in pause
  image** as ``sandbox_image`` (:data:`PAUSE_IMAGE`; the lab has no registry: the node tests import it,
  tests/nodes/images.py) and ``restrict_oom_score_adj`` (the kubelet asks -998 for every
  sandbox, but no process on the lab's machines holds CAP_SYS_RESOURCE to lower a score, so runc would
  fail to start any container);
- one bridge network for Pods, the node their default gateway and masqueraded (``ipMasq``), so a Pod
  reaches the apiserver on the lab's gateway and the other nodes with its node's address (the kubelet
  reports NotReady without a CNI config);
- a unit that makes the cgroup v1 controllers writable before containerd starts, at every boot
  (systemd-nspawn mounts them read-only, and containerd creates a cgroup per container in them);
- systemd-timesyncd allowed to run in a container (its unit skips containers; the node gets no
  CAP_SYS_TIME, so it can never set the machine's clock);
- busybox-static, the one binary of the stand-in pause image (built from this root, not downloaded).
"""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Callable
from pathlib import Path

from hostlab.base import base_ready, build_cached, configure_login
from hostlab.config import NODE_BASE_FORMAT, Config
from hostlab.errors import LabUnavailable

NODE_PACKAGES = (
    *("systemd", "systemd-sysv", "systemd-timesyncd", "dbus", "openssh-server", "python3", "python3-apt"),
    *("containerd", "runc", "containernetworking-plugins", "iptables", "conntrack", "ethtool", "socat"),
    *("sudo", "ca-certificates", "iproute2", "kmod", "mount", "busybox-static"),
)
# containerd's sandbox ("pause") image: a lab-owned name, never pulled (tests/nodes/images.py imports it)
PAUSE_IMAGE = "localhost/hostlab/stand-in-pause:lab"

# containerd 1.6 (bookworm) looks for CNI plugins in /opt/cni/bin; Debian installs them in /usr/lib/cni
CONTAINERD_CONFIG = f"""\
# hostlab node: Debian's CNI plugin directory, cgroupfs (the kubelet's cgroupDriver on this lab), the
# lab's stand-in pause image, and oom_score_adj never lowered (nothing here holds CAP_SYS_RESOURCE);
# the runc runtime named in full (a table of it without its runtime_type leaves containerd none)
version = 2
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  restrict_oom_score_adj = true
[plugins."io.containerd.grpc.v1.cri".cni]
  bin_dir = "/usr/lib/cni"
  conf_dir = "/etc/cni/net.d"
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
  SystemdCgroup = false
"""
CNI_CONFIG = """\
{
  "cniVersion": "1.0.0",
  "name": "hostlab-pods",
  "plugins": [
    {"type": "bridge", "bridge": "cni0", "isDefaultGateway": true, "ipMasq": true,
     "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.244.0.0/24"}]]}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
"""
# systemd-timesyncd.service says ConditionVirtualization=!container; an empty assignment resets the
# conditions so the lab's ntp capability is tested against the real service
TIMESYNCD_DROPIN = "[Unit]\nConditionVirtualization=\n"
# systemd-nspawn mounts the cgroup v1 controllers read-only; containerd (runc) makes a cgroup per
# container in each of them. A unit, not a step of the node's start, so it holds after every reboot.
CGROUPS_RW_SCRIPT = """\
#!/bin/sh
# hostlab node: remount every cgroup v1 controller hierarchy read-write (systemd-nspawn mounted them
# read-only); the named systemd hierarchy and the unified one are systemd's and stay as they are
set -eu
for dir in /sys/fs/cgroup/*; do
  [ -d "$dir" ] && [ ! -L "$dir" ] || continue
  case ${dir##*/} in systemd | unified) continue ;; esac
  [ "$(stat -f -c %T "$dir")" = cgroupfs ] || continue
  mount -o remount,bind,rw "$dir"
done
"""
CGROUPS_RW_UNIT = """\
[Unit]
Description=hostlab: cgroup v1 controllers writable for containerd and the kubelet
DefaultDependencies=no
Before=containerd.service kubelet.service
After=local-fs.target

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/usr/local/sbin/hostlab-cgroups-rw

[Install]
WantedBy=multi-user.target
"""
CGROUPS_RW_NAME = "hostlab-cgroups-rw.service"


def recipe() -> str:
    """Everything the nodes' root filesystem is made from; its hash names the cached root."""
    files = (CONTAINERD_CONFIG, CNI_CONFIG, TIMESYNCD_DROPIN, CGROUPS_RW_SCRIPT, CGROUPS_RW_UNIT)
    return "\n".join((str(NODE_BASE_FORMAT), *NODE_PACKAGES, *files))


def node_base_dir(cfg: Config) -> Path:
    """The nodes' root filesystem for this recipe: shared read-only by every node of every lab."""
    digest = hashlib.sha256(f"{cfg.suite}\n{cfg.mirror}\n{recipe()}".encode()).hexdigest()[:12]
    return cfg.cache_dir / f"node-{cfg.suite}-{digest}"


def _configure_node(root: Path, cfg: Config) -> None:
    configure_login(root, cfg)
    (root / "etc/containerd").mkdir(exist_ok=True)
    (root / "etc/containerd/config.toml").write_text(CONTAINERD_CONFIG)
    (root / "etc/cni/net.d").mkdir(parents=True, exist_ok=True)
    (root / "etc/cni/net.d/10-hostlab.conflist").write_text(CNI_CONFIG)
    dropin = root / "etc/systemd/system/systemd-timesyncd.service.d"
    dropin.mkdir(parents=True, exist_ok=True)
    (dropin / "hostlab.conf").write_text(TIMESYNCD_DROPIN)
    script = root / "usr/local/sbin/hostlab-cgroups-rw"
    script.write_text(CGROUPS_RW_SCRIPT)
    script.chmod(0o755)
    (root / "etc/systemd/system" / CGROUPS_RW_NAME).write_text(CGROUPS_RW_UNIT)
    wants = root / "etc/systemd/system/multi-user.target.wants"
    wants.mkdir(parents=True, exist_ok=True)
    (wants / CGROUPS_RW_NAME).symlink_to(f"/etc/systemd/system/{CGROUPS_RW_NAME}")
    # each node gets its own machine id at start (node_init.sh); the kubelet reports it
    (root / "etc/machine-id").write_text("")


def ensure_node_base(cfg: Config, log: Callable[[str], None] = print) -> Path:
    """Return the nodes' root filesystem, building it first (about 90 s) if this machine has none yet."""
    base = node_base_dir(cfg)
    if base_ready(base):
        return base
    if shutil.which("mmdebstrap") is None:
        raise LabUnavailable("missing mmdebstrap for the nodes' root filesystem (apt-get install mmdebstrap)")
    return build_cached(cfg, base, "mmdebstrap", NODE_PACKAGES, _configure_node, log)
