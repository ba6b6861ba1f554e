#!/bin/sh
# Supervisor of one lab node. hostlab.nodes starts it through
#   unshare --mount --net --propagation private
# so it runs in the node's own network and mount namespaces (its PID is the one the lab records). It
# waits until the controller has plugged eth0 into that network namespace, builds the node's root
# (overlay: the shared read-only node root filesystem below, a size-limited tmpfs above), personalises
# it (the steps it shares with host_init.sh are in root_init.sh), then boots it with systemd-nspawn:
# systemd is the container's PID 1, and the container shares this network namespace. A reboot inside
# the node ends systemd-nspawn with status 133: the node boots again on the same root (its disk survives
# the reboot). Any other end of systemd-nspawn (a poweroff, the controller's SIGTERM) ends this script,
# and its mounts and network namespace vanish with it.
set -eu
name=$1 hd=$2 base=$3 ip=$4 gw=$5 port=$6 disk_mb=$7
. "${0%/*}/root_init.sh"

wait_for_go
R=$hd/root
mount_root
personalise
tr -d - </proc/sys/kernel/random/uuid >"$R/etc/machine-id"
# containerd's state on the node's disk (its tmpfs) but outside the overlay root: containerd's overlayfs
# snapshotter cannot stack an overlay on an overlay, nor make whiteouts in one; kept across reboots
mkdir -p "$hd/rw/containerd"

# --capability=all: containerd, runc and the kubelet need what a machine's root has, except the clock:
# CAP_SYS_TIME stays with the machine. /dev/kmsg: the kubelet's OOM watcher. API VFS writable: the
# kubelet and kube-proxy write sysctls. --system-call-filter: nspawn's own filter blocks keyctl (runc
# joins a session keyring for every container) and bpf (runc's device cgroup on cgroup v2 machines).
while :; do
  rc=0
  SYSTEMD_NSPAWN_API_VFS_WRITABLE=1 systemd-nspawn --quiet -D "$R" -M "$name" --boot --register=no \
    --keep-unit --capability=all --drop-capability=CAP_SYS_TIME --bind=/dev/kmsg \
    --system-call-filter='@keyring bpf' --bind="$hd/rw/containerd:/var/lib/containerd" || rc=$?
  [ "$rc" -eq 133 ] || exit "$rc"
  echo "hostlab: $name reboots"
done
