"""STAND-IN ``shutdown``/``reboot`` of a lab host (installed as /usr/sbin/shutdown and /usr/sbin/reboot).

Lab hosts have no systemd and no kernel of their own: ``shutdown -r [now|0|+0] [message]`` and ``reboot``
ask the host's PID 1 (hostlab-init) for the lab's reboot, which restarts the host's processes, keeps its
disk and changes the boot id the host sees (see guest_init.py). That is what Ansible's
``ansible.builtin.reboot`` needs: it runs ``shutdown -r 0 "<msg>"`` and waits for a new boot id. Powering
off, delayed reboots and cancelling are refused (exit 1) rather than faked. Standard library only.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

REBOOT_SIGNAL = signal.SIGRTMIN + 5  # the same number as guest_init.REBOOT_SIGNAL
IMMEDIATE = {"now", "0", "+0"}


def main(argv: list[str]) -> int:
    program = Path(argv[0]).name
    args = argv[1:]
    if program == "reboot":
        wanted = not [a for a in args if a not in ("-f", "--force")]
        time_spec = "now"
    else:
        wanted = "-r" in args or "--reboot" in args
        rest = [a for a in args if a not in ("-r", "--reboot")]
        time_spec = rest[0] if rest else "+1"  # shutdown's own default delay is one minute
    if not wanted:
        print(f"{program}: only reboots are supported on lab hosts (hostlab stand-in)", file=sys.stderr)
        return 1
    if time_spec not in IMMEDIATE:
        print(
            f"{program}: only an immediate reboot (now, 0) is supported (hostlab stand-in)", file=sys.stderr
        )
        return 1
    try:
        os.kill(1, REBOOT_SIGNAL)
    except PermissionError:
        print(f"{program}: must be root", file=sys.stderr)
        return 1
    print("hostlab: reboot scheduled (stand-in shutdown: processes restart, the disk stays)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
