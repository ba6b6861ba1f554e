#!/bin/sh
# First process (PID 1) of one lab host. hostlab.hosts starts it through
#   unshare --fork --kill-child=SIGKILL --pid --mount --uts --ipc --net --propagation private
# so it already runs in the host's own namespaces, still on the machine's filesystem. It waits until the
# controller has plugged eth0 into its network namespace, builds the host's root (overlay: the shared
# read-only Debian base below, a size-limited tmpfs above), mounts the API filesystems, personalises the
# host (the steps it shares with node_init.sh are in root_init.sh), then chroots and becomes the guest
# supervisor (hostlab-init, which runs sshd).
# Everything mounted here lives in this mount namespace only and vanishes when PID 1 dies.
set -eu
name=$1 hd=$2 base=$3 ip=$4 gw=$5 port=$6 disk_mb=$7 supervisor=$8
. "${0%/*}/root_init.sh"

wait_for_go
R=$hd/root
mount_root
mount -t proc proc "$R/proc"
mount -t sysfs -o ro sysfs "$R/sys"
mount -t tmpfs -o mode=755,size=8m tmpfs "$R/dev"
for d in null zero full random urandom tty; do
  : >"$R/dev/$d"
  mount --bind "/dev/$d" "$R/dev/$d"
done
mkdir -p "$R/dev/pts" "$R/dev/shm"
mount -t devpts -o newinstance,ptmxmode=0666,mode=620,gid=5 devpts "$R/dev/pts"
ln -s pts/ptmx "$R/dev/ptmx"
ln -s /proc/self/fd "$R/dev/fd"
ln -s /proc/self/fd/0 "$R/dev/stdin"
ln -s /proc/self/fd/1 "$R/dev/stdout"
ln -s /proc/self/fd/2 "$R/dev/stderr"
mount -t tmpfs -o mode=1777,size=64m tmpfs "$R/dev/shm"
mount -t tmpfs -o mode=755,size=64m tmpfs "$R/run"
mkdir -p "$R/run/sshd" "$R/run/lock" "$R/run/hostlab"

hostname "$name"
personalise
cp "$supervisor" "$R/usr/local/sbin/hostlab-init"
chmod 755 "$R/usr/local/sbin/hostlab-init"
# the lab's reboot (guest_init.py): a boot id of this host's own, rewritten in place at every reboot
cat /proc/sys/kernel/random/uuid >"$R/run/hostlab/boot_id"
mount --bind "$R/run/hostlab/boot_id" "$R/proc/sys/kernel/random/boot_id"
# STAND-IN shutdown/reboot (guest_shutdown.py): they ask PID 1 for that reboot
{ echo '#!/usr/bin/python3 -I'; cat "${supervisor%/*}/guest_shutdown.py"; } >"$R/usr/sbin/shutdown"
chmod 755 "$R/usr/sbin/shutdown"
ln -sf shutdown "$R/usr/sbin/reboot"
exec chroot "$R" /usr/bin/python3 -I /usr/local/sbin/hostlab-init "$name"
