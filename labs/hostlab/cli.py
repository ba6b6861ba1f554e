"""The ``hostlab`` command: bring a lab up and down, inspect it, reset or reboot hosts, inject faults, print
inventory.

Every subcommand acts on one named lab (``--name``, env ``HOSTLAB_NAME``, default ``default``).
Exit status: 0 on success, 1 on a lab error (message on stderr), 77 when this machine cannot run a lab.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from hostlab import faults, prereqs
from hostlab.base import ensure_base
from hostlab.config import DEFAULT_DISK_MB, Config
from hostlab.errors import LabError, LabUnavailable
from hostlab.inventory import FORMATS, render
from hostlab.lab import Lab, all_labs, reap_stale
from hostlab.nodes import DEFAULT_NODE_DISK_MB
from hostlab.state import HOST, NODE

EXIT_UNAVAILABLE = 77


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hostlab", description="Isolated Debian SSH test hosts (see docs/development.md)."
    )
    parser.add_argument("--name", default=os.environ.get("HOSTLAB_NAME", "default"), help="lab name")
    sub = parser.add_subparsers(dest="command", required=True)

    up = sub.add_parser("up", help="start N hosts (building the Debian base first if needed)")
    up.add_argument("count", type=int)
    up.add_argument("--slot", type=int, help="use 10.77.SLOT.0/24 (default: the first free one)")
    disk_help = f"MB of each host's writable layer (default {DEFAULT_DISK_MB}, nodes {DEFAULT_NODE_DISK_MB})"
    up.add_argument("--disk-mb", type=int, help=disk_help)
    up.add_argument(
        "--kind",
        choices=[HOST, NODE],
        default=HOST,
        help="chroot hosts (sshd only, fast) or nodes that boot systemd with systemd-nspawn (real services)",
    )
    down = sub.add_parser("down", help="stop the lab and remove everything it created")
    down.add_argument("--stale", action="store_true", help="instead: down every lab whose owner process died")
    status = sub.add_parser("status", help="show the lab (or every lab with --all)")
    status.add_argument("--all", action="store_true")
    status.add_argument("--json", action="store_true")
    reset = sub.add_parser("reset", help="restart a host from a clean writable layer (undoes all faults)")
    reset.add_argument("host", help="host name or 1-based index")
    reboot = sub.add_parser("reboot", help="reboot a host: processes restart, the disk stays, a new boot id")
    reboot.add_argument("host", help="host name or 1-based index")
    inv = sub.add_parser("inventory", help="print an inventory for the lab")
    inv.add_argument("--format", choices=FORMATS, default="service")
    inv.add_argument(
        "--machine-names", default="", help="comma-separated Machine names, mapped to hosts in order"
    )
    inv.add_argument("-o", "--output", type=Path, help="write to this file instead of stdout")
    ssh = sub.add_parser("ssh", help="ssh into a host as the login user (or run a command)")
    ssh.add_argument("host")
    ssh.add_argument("cmd", nargs=argparse.REMAINDER)
    sub.add_parser("check", help="say whether this machine can run a lab")
    sub.add_parser("base", help="build the cached Debian base now (normally done by the first 'up')")

    fault = sub.add_parser("fault", help="inject or undo a fault").add_subparsers(dest="fault", required=True)
    f_link = fault.add_parser("link", help="link down|up HOST")
    f_link.add_argument("action", choices=["down", "up"])
    f_link.add_argument("host")
    f_sshd = fault.add_parser("sshd", help="sshd stop|start HOST")
    f_sshd.add_argument("action", choices=["stop", "start"])
    f_sshd.add_argument("host")
    f_disk = fault.add_parser("disk", help="disk fill|free HOST")
    f_disk.add_argument("action", choices=["fill", "free"])
    f_disk.add_argument("host")
    f_fail = fault.add_parser("fail-next", help="fail-next HOST CMD: the next run of CMD on HOST fails")
    f_fail.add_argument("host")
    f_fail.add_argument("cmd")
    f_slow = fault.add_parser("slow", help="slow HOST DELAY_MS|off (tc netem)")
    f_slow.add_argument("host")
    f_slow.add_argument("delay", help="milliseconds, or 'off'")
    return parser


def _print_status(info: dict[str, object]) -> None:
    print(f"lab {info['name']}: {info['network']} on {info['bridge']}, apt proxy {info['proxy']}")
    print(f"  key {info['private_key']}, known_hosts {info['known_hosts']}")
    hosts = info["hosts"]
    assert isinstance(hosts, list)  # noqa: S101 - shape produced by Lab.status
    for host in hosts:
        state = "ssh ok" if host["ssh"] else ("running, no ssh" if host["running"] else "DOWN")
        print(f"  {host['name']:<10} {host['address']:<15} {state}")


def _fault(lab: Lab, args: argparse.Namespace) -> None:
    if args.fault == "link":
        faults.link(lab, args.host, up=args.action == "up")
    elif args.fault == "sshd":
        faults.sshd(lab, args.host, running=args.action == "start")
    elif args.fault == "disk":
        if args.action == "fill":
            print(f"filled {faults.disk_fill(lab, args.host)} bytes")
        else:
            faults.disk_free(lab, args.host)
    elif args.fault == "fail-next":
        print(f"next run of {faults.fail_next(lab, args.host, args.cmd)} will fail")
    elif args.fault == "slow":
        if args.delay == "off":
            faults.slow(lab, args.host, None)
        elif args.delay.isdigit():
            faults.slow(lab, args.host, int(args.delay))
        else:
            raise LabError(f"delay must be milliseconds or 'off', got {args.delay!r}")


def _run(args: argparse.Namespace) -> int:
    cfg = Config.from_env()
    lab = Lab(args.name, cfg)
    if args.command == "up":
        started = time.monotonic()
        owner = os.environ.get("HOSTLAB_OWNER_PID", "")
        if owner and not owner.isdigit():
            raise LabError(f"HOSTLAB_OWNER_PID must be a process ID, got {owner!r}")
        # with an owner, 'hostlab down --stale' (and every test session) reaps the lab once the owner is gone
        hosts = lab.up(
            args.count,
            slot=args.slot,
            disk_mb=args.disk_mb,
            owner_pid=int(owner) if owner else None,
            log=print,
            kind=args.kind,
        )
        print(f"hostlab: lab {lab.name} with {len(hosts)} hosts up in {time.monotonic() - started:.1f}s")
        _print_status(lab.status())
    elif args.command == "down":
        if args.stale:
            print(f"reaped: {', '.join(reap_stale(cfg, print)) or 'nothing'}")
        elif not lab.dir.exists():
            print(f"hostlab: lab {lab.name} is not up")
        else:
            lab.down(print)
    elif args.command == "status":
        labs = all_labs(cfg) if args.all else [lab]
        infos = [one.status() for one in labs if one.exists()]
        if not args.all and not infos:
            raise LabError(f"lab {lab.name!r} is not up")
        if args.json:
            print(json.dumps(infos if args.all else infos[0], indent=2))
        else:
            for info in infos:
                _print_status(info)
    elif args.command == "reset":
        lab.reset(args.host, log=print)
    elif args.command == "reboot":
        lab.reboot(args.host, log=print)
    elif args.command == "inventory":
        names = [n.strip() for n in args.machine_names.split(",") if n.strip()]
        text = render(lab, args.format, names)
        if args.output:
            args.output.write_text(text)
        else:
            sys.stdout.write(text)
    elif args.command == "ssh":
        argv = lab.ssh_argv(lab.host(args.host), connect_timeout=10)
        if args.cmd:
            argv += ["--", *args.cmd]
        os.execvp(argv[0], argv)  # noqa: S606 - replaces this process with ssh, argv list
    elif args.command == "check":
        why = prereqs.missing(cfg)
        if why:
            raise LabUnavailable(why)
        print("hostlab: this machine can run a lab")
    elif args.command == "base":
        print(ensure_base(cfg, print))
    elif args.command == "fault":
        _fault(lab, args)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return _run(args)
    except LabUnavailable as exc:
        print(f"hostlab: cannot run a lab here: {exc}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    except LabError as exc:
        print(f"hostlab: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
