"""PID 1 inside a lab host (copied in as /usr/local/sbin/hostlab-init, run by the guest's python3).

It keeps sshd running like an init system would, reaps orphans, and lets the lab controller stop and
start sshd without ending the host (fault injection): SIGUSR1 stops sshd (listener and sessions),
SIGUSR2 starts it again, SIGTERM ends the host. It reports the sshd state in /run/hostlab/sshd.state
("running PID" or "stopped"), which the controller polls. Standard library only: it runs on the guest.

REBOOT_SIGNAL (sent by the controller's ``Lab.reboot`` or the guest's stand-in ``shutdown -r``) is the
lab's reboot: after REBOOT_DELAY (so the ``shutdown`` that asked returns, as a real one does) every
other process of the host ends (SIGTERM, then SIGKILL), /run is emptied except /run/hostlab, the boot
id the host sees (/proc/sys/kernel/random/boot_id, a bind mount of /run/hostlab/boot_id set up by
host_init.sh) changes, and sshd starts again. The disk (the writable layer) is kept; the kernel, the
network namespace and the mounts are not restarted.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

SSHD = "/usr/sbin/sshd"
STATE = Path("/run/hostlab/sshd.state")
BOOT_ID = Path("/run/hostlab/boot_id")
REBOOT_SIGNAL = signal.SIGRTMIN + 5
REBOOT_DELAY = 1.0  # seconds between the request and the processes ending, as "shutdown -r now" returns first
STOP_GRACE = 5.0  # seconds processes get after SIGTERM before SIGKILL, at a reboot
RUN_DIRS = ("sshd", "lock")  # what /run holds after a (re)boot, besides /run/hostlab
SIGNALS: set[int] = {signal.SIGCHLD, signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM, signal.SIGINT}
SIGNALS |= {signal.SIGHUP, REBOOT_SIGNAL}
RESTART_BACKOFF = 1.0  # seconds before restarting an sshd that died on its own
ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}


def log(message: str) -> None:
    print(f"hostlab-init[{sys.argv[1] if len(sys.argv) > 1 else '?'}]: {message}", flush=True)


def write_state(text: str) -> None:
    tmp = STATE.with_suffix(".tmp")
    tmp.write_text(text + "\n")
    tmp.replace(STATE)  # atomic: the controller never reads a half-written state


def _processes_but_init() -> Iterator[Path]:
    """The /proc entry of every process of this PID namespace but PID 1 (it may be gone when read)."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and entry.name != "1":
            yield entry


def sshd_processes() -> list[int]:
    """Every sshd in this PID namespace: the listener and the per-connection session processes."""
    pids = []
    for entry in _processes_but_init():
        try:
            if str((entry / "exe").readlink()) == SSHD:
                pids.append(int(entry.name))
        except OSError:
            continue
    return pids


def signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def other_processes() -> list[int]:
    """Every live process of this PID namespace but PID 1 (zombies are for their parents to reap)."""
    pids = []
    for entry in _processes_but_init():
        try:
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue  # gone meanwhile
        if state != "Z":
            pids.append(int(entry.name))
    return pids


def reap() -> list[int]:
    """Reap every exited child; return their PIDs."""
    reaped: list[int] = []
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return reaped
        if pid == 0:
            return reaped
        reaped.append(pid)


def reboot() -> None:
    """End every other process, empty /run but for /run/hostlab, and change the boot id."""
    time.sleep(REBOOT_DELAY)
    signal_all(other_processes(), signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE
    while other_processes() and time.monotonic() < deadline:
        reap()
        signal.sigtimedwait({signal.SIGCHLD}, 0.1)
    signal_all(other_processes(), signal.SIGKILL)
    deadline = time.monotonic() + STOP_GRACE
    while other_processes() and time.monotonic() < deadline:  # SIGKILL takes effect at once, bar D state
        reap()
        signal.sigtimedwait({signal.SIGCHLD}, 0.1)
    reap()
    for entry in Path("/run").iterdir():
        if entry.name == "hostlab":
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
    for name in RUN_DIRS:
        Path("/run", name).mkdir(exist_ok=True)
    # rewritten in place: the bind mount over /proc/sys/kernel/random/boot_id holds this very inode
    with BOOT_ID.open("r+") as boot_id:
        boot_id.truncate(0)
        boot_id.write(f"{uuid.uuid4()}\n")


def spawn_sshd() -> int:
    # the signals PID 1 blocks must not stay blocked in sshd
    return os.posix_spawn(SSHD, [SSHD, "-D", "-e"], ENV, setsigmask=(), setsigdef=SIGNALS)


def main() -> int:
    # signals are consumed synchronously with sigtimedwait; blocked signals are also never dropped by
    # the kernel's "init ignores default-action signals" rule, so the controller's signals arrive
    signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)
    want_sshd = True
    sshd: int | None = None
    next_start = 0.0
    reported = ""
    while True:
        while True:  # reap every exited child (sshd and orphans re-parented to us)
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            if pid == sshd:
                sshd = None
                if want_sshd:
                    log(f"sshd exited unexpectedly (status {status}); restarting in {RESTART_BACKOFF:g}s")
                    next_start = time.monotonic() + RESTART_BACKOFF
        if want_sshd and sshd is None and time.monotonic() >= next_start:
            sshd = spawn_sshd()
            log(f"sshd started (pid {sshd})")
        state = f"running {sshd}" if sshd is not None else "stopped"
        if state != reported:
            write_state(state)
            reported = state
        info = signal.sigtimedwait(SIGNALS, RESTART_BACKOFF)
        if info is None or info.si_signo == signal.SIGCHLD:
            continue
        if info.si_signo == signal.SIGUSR1:
            log("stopping sshd (fault injection)")
            want_sshd = False
            signal_all(sshd_processes(), signal.SIGTERM)
        elif info.si_signo == signal.SIGUSR2:
            log("starting sshd")
            want_sshd = True
            next_start = 0.0
        elif info.si_signo == signal.SIGHUP and sshd is not None:
            os.kill(sshd, signal.SIGHUP)  # sshd re-reads its configuration
        elif info.si_signo == REBOOT_SIGNAL:
            log("rebooting (hostlab reboot: processes restart, the disk stays)")
            write_state("stopped")
            reported = "stopped"
            reboot()
            sshd = None
            want_sshd = True
            next_start = 0.0
            log(f"rebooted, boot id {BOOT_ID.read_text().strip()}")
        elif info.si_signo in (signal.SIGTERM, signal.SIGINT):
            log("shutting down")
            signal_all(sshd_processes(), signal.SIGTERM)
            return 0


if __name__ == "__main__":
    sys.exit(main())
