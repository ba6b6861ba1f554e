"""The ``kubelab`` command: build the binaries, bring a lab up and down, show it, fault its apiserver.

Every lab subcommand acts on one named lab (``--name``, env ``KUBELAB_NAME``, default ``default``).
Exit status: 0 on success, 1 on a lab error (message on stderr).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence

from hostlab.errors import LabError

from kubelab import build, flavours
from kubelab.config import Config
from kubelab.lab import Lab, all_labs, reap_stale


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kubelab", description="A real Kubernetes control plane for tests (see docs/development.md)."
    )
    parser.add_argument("--name", default=os.environ.get("KUBELAB_NAME", "default"), help="lab name")
    sub = parser.add_subparsers(dest="command", required=True)
    flavour_help = f"also start this flavour (one of: {', '.join(sorted(flavours.FLAVOURS)) or 'none yet'})"
    build_cmd = sub.add_parser("build", help="build the binaries that are missing from the cache")
    build_cmd.add_argument("--flavour", action="append", default=[], help=flavour_help)
    build_cmd.add_argument("--all", action="store_true", help="every binary of every flavour")
    build_cmd.add_argument(
        "--not-built", action="store_true", help="build nothing: print the names of those a build would build"
    )
    up = sub.add_parser(
        "up", help="start etcd, kube-apiserver, kube-controller-manager and kwok (building first)"
    )
    up.add_argument("--flavour", action="append", default=[], help=flavour_help)
    down = sub.add_parser("down", help="stop the lab and remove what it created (logs stay in the cache)")
    down.add_argument("--stale", action="store_true", help="instead: down every lab whose owner process died")
    status = sub.add_parser("status", help="show the lab (or every lab with --all)")
    status.add_argument("--all", action="store_true")
    status.add_argument("--json", action="store_true")
    sub.add_parser("kubeconfig", help="print the path of the lab's admin kubeconfig")
    sub.add_parser("bin", help="print the directory holding the core binaries (kubectl among them)")
    api = sub.add_parser("apiserver", help="fault: stop or start the lab's kube-apiserver (an API outage)")
    api.add_argument("action", choices=["stop", "start"])
    return parser


def _print_status(info: dict[str, object], as_json: bool) -> None:
    if as_json:
        print(json.dumps(info, indent=2))
        return
    print(
        f"lab {info['name']}: {info['server']}  kubeconfig {info['kubeconfig']}  "
        f"flavours {info['flavours'] or '-'}"
    )
    for comp in info["components"]:  # type: ignore[attr-defined]
        state = "running" if comp["running"] else "STOPPED"
        print(f"  {comp['name']:<32} pid {comp['pid']:<8} {state:<8} {comp['log']}")


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    cfg = Config.from_env()
    lab = Lab(args.name, cfg)
    progress = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    try:
        if args.command == "build":
            names = list(build.BUILD_ORDER) if args.all else [*build.CORE_BINARIES]
            for flavour in args.flavour:
                names += flavours.load(flavour).binaries
            if args.not_built:
                for name in build.not_built(names, cfg):
                    print(name)
            else:
                for name, path in build.ensure_built(names, cfg, progress).items():
                    print(f"{name}\t{path}")
        elif args.command == "up":
            lab.up(args.flavour, owner_pid=0, progress=progress)
            _print_status(lab.status(), as_json=False)
        elif args.command == "down":
            if args.stale:
                for name in reap_stale(cfg):
                    print(f"reaped stale lab {name}")
            else:
                lab.down()
        elif args.command == "status":
            for name in all_labs(cfg) if args.all else [args.name]:
                _print_status(Lab(name, cfg).status(), args.json)
        elif args.command == "kubeconfig":
            lab.state()
            print(lab.kubeconfig)
        elif args.command == "bin":
            print(build.cached(["kubectl"], cfg)["kubectl"].parent)
        elif args.command == "apiserver":
            lab.stop_apiserver() if args.action == "stop" else lab.start_apiserver()
    except LabError as exc:
        print(f"kubelab: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
