"""The demo: a MachineDeployment rolled out in place on 3 lab hosts, driven exactly as Cluster API would.

``scripts/demo`` (or ``python -m hostlab.demo``) brings up a lab of 3 hosts, writes an inventory mapping
three Machines of MachineDeployment ``demo-md-0`` to them, starts ``inplace-extension serve`` on loopback
with that inventory, and then plays the rollout the way the CAPI controllers do (docs/capi-hooks.md):

1. Discovery, to learn the handler names;
2. CanUpdateMachineSet for the old and new MachineSet (the MachineDeployment controller), applying the
   returned patches to the old objects and comparing them with the new ones, as CAPI decides between an
   in-place update and a rollout of new machines;
3. UpdateMachine for each Machine in turn (the Machine controller), calling again only after
   ``retryAfterSeconds`` until ``Success`` with 0.

The change rolled out adds a file (``kubeadm_files``) and a user with an SSH key (``users``); at the end
the demo shows, per host, what changed (checked over SSH, including a login as the new user), then
stops the service and tears the lab down. If the service has no UpdateMachine executor, the demo stops
after the CanUpdate step and says so (exit 2).

This module owns the rollout and the command line; the requests are built in
:mod:`hostlab.demo_requests`, CAPI's decision in :mod:`hostlab.demo_capi` and the service process in
:mod:`hostlab.demo_service`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from hostlab.demo_capi import apply_patch, capi_decides_in_place, discover, patch_summary, post
from hostlab.demo_requests import (
    BANNER_PATH,
    BOOTSTRAP_TOKEN,
    DEMO_USER,
    DEPLOYMENT,
    MACHINES,
    NEW_SET,
    OLD_SET,
    machine_set_objects,
    update_machine_request,
)
from hostlab.demo_service import running_service
from hostlab.errors import DemoError, LabError, LabUnavailable
from hostlab.inventory import render
from hostlab.lab import Host, Lab

__all__ = [
    "BOOTSTRAP_TOKEN",
    "DEMO_USER",
    "MACHINES",
    "DemoError",
    "apply_patch",
    "capi_decides_in_place",
    "machine_set_objects",
    "main",
]

EXIT_STOPPED = 2


class Clock:
    def __init__(self) -> None:
        self.start = time.monotonic()

    def say(self, message: str) -> None:
        print(f"[{time.monotonic() - self.start:6.1f}s] {message}", flush=True)


# ----- on the hosts -----------------------------------------------------------------------------------


FACT_LABELS = {
    "banner": BANNER_PATH,
    "user": f"user {DEMO_USER}",
    "login": f"ssh login as {DEMO_USER}",
    "stamp": "applied stamp",
}


def host_facts(lab: Lab, host: Host, alice_key_file: Path) -> dict[str, str]:
    """What the rollout may change on a host, read over SSH as the login user."""
    script = (
        f"if [ -f {BANNER_PATH} ]; then"
        f" echo \"banner=$(stat -c '%U:%G %a' {BANNER_PATH}) $(cat {BANNER_PATH})\";"
        " else echo banner=absent; fi;"
        f' if id {DEMO_USER} >/dev/null 2>&1; then echo "user=$(id {DEMO_USER})"; else echo user=absent; fi;'
        " f=/var/lib/inplace-extension/stamp.json;"
        ' if sudo -n test -f $f; then echo "stamp=$(sudo -n cat $f)"; else echo stamp=absent; fi'
    )
    result = lab.ssh(host, ["sh", "-c", script])
    if result.returncode != 0:
        raise DemoError(f"{host.name}: cannot read its state: {result.stderr.strip()}")
    facts = dict(line.split("=", 1) for line in result.stdout.splitlines() if "=" in line)
    stamp = facts.get("stamp", "absent")
    if stamp != "absent":
        with contextlib.suppress(ValueError, AttributeError):
            facts["stamp"] = "fingerprint " + str(json.loads(stamp).get("fingerprint", "?"))[:16] + "..."
    known_hosts = f"UserKnownHostsFile={lab.known_hosts}"
    options = [
        "IdentitiesOnly=yes",
        "BatchMode=yes",
        known_hosts,
        "StrictHostKeyChecking=yes",
        "ConnectTimeout=5",
    ]
    pairs = [arg for option in [*options, "LogLevel=ERROR"] for arg in ("-o", option)]
    argv = ["ssh", "-i", str(alice_key_file), *pairs, f"{DEMO_USER}@{host.address}", "whoami"]
    login = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    facts["login"] = "ok" if login.stdout.strip() == DEMO_USER else "refused"
    return facts


# ----- the rollout ------------------------------------------------------------------------------------


def rollout(lab: Lab, workdir: Path, clock: Clock, retry_after: int) -> int:
    hosts = lab.hosts()
    machine_to_host = dict(zip(MACHINES, hosts, strict=True))
    key_file = workdir / "ops-alice_ed25519"
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", DEMO_USER, "-f", str(key_file)],
        check=True,
        capture_output=True,
    )
    alice_key = key_file.with_suffix(".pub").read_text().strip()
    inventory = workdir / "inventory.yaml"
    inventory.write_text(render(lab, "service", list(MACHINES)))
    clock.say(
        f"inventory {inventory}: " + ", ".join(f"{m} -> {h.address}" for m, h in machine_to_host.items())
    )
    before = {m: host_facts(lab, h, key_file) for m, h in machine_to_host.items()}

    with (
        running_service(inventory, lab, workdir, retry_after) as service,
        httpx.Client(base_url=service.url, timeout=30) as client,
    ):
        clock.say(f"service: {service.url} (log {service.log_path})")
        paths = discover(client)
        clock.say(
            "Discovery: " + ", ".join(f"{hook} -> {path.rsplit('/', 1)[1]}" for hook, path in paths.items())
        )

        request = {
            "kind": "CanUpdateMachineSetRequest",
            "apiVersion": "hooks.runtime.cluster.x-k8s.io/v1alpha1",
            "current": machine_set_objects(False, alice_key),
            "desired": machine_set_objects(True, alice_key),
        }
        clock.say(
            f"MachineDeployment {DEPLOYMENT}: new template adds file {BANNER_PATH} and user {DEMO_USER}"
        )
        answer = post(client, paths["CanUpdateMachineSet"], request)
        clock.say(
            f"CanUpdateMachineSet {OLD_SET} -> {NEW_SET}: {answer.get('status')}; {patch_summary(answer)}"
        )
        if answer.get("status") != "Success":
            raise DemoError(f"CanUpdateMachineSet failed: {answer.get('message')}")
        differing = capi_decides_in_place(request, answer)
        if differing:
            clock.say(f"CAPI decision: roll out new Machines (not covered in place: {', '.join(differing)})")
            return EXIT_STOPPED
        clock.say("CAPI decision: update the 3 Machines in place")

        for machine, host in machine_to_host.items():
            body = update_machine_request(machine, alice_key)
            started, calls, last = time.monotonic(), 0, ""
            while True:
                answer = post(client, paths["UpdateMachine"], body)
                calls += 1
                status, message = answer.get("status"), str(answer.get("message", ""))
                retry = answer.get("retryAfterSeconds", 0)
                if status == "Failure" and "no executor" in message:
                    clock.say(f"UpdateMachine {machine}: {message}")
                    clock.say(
                        "This build has no UpdateMachine executor: the demo stops after the CanUpdate step"
                    )
                    return EXIT_STOPPED
                if status == "Failure":
                    raise DemoError(f"UpdateMachine {machine} failed: {message}")
                if message != last or retry == 0:
                    clock.say(
                        f"UpdateMachine {machine} ({host.address}): {status},"
                        f" retryAfterSeconds={retry}: {message}"
                    )
                    last = message
                if not isinstance(retry, int) or retry <= 0:
                    break
                time.sleep(retry)  # the protocol: CAPI calls again only after retryAfterSeconds
            clock.say(f"{machine}: updated in {time.monotonic() - started:.1f}s ({calls} calls)")
        if BOOTSTRAP_TOKEN in service.log_path.read_text(errors="replace"):
            raise DemoError("the bootstrap token appeared in the service log")

    print("\nWhat changed on each host:")
    for machine, host in machine_to_host.items():
        after = host_facts(lab, host, key_file)
        print(f"  {machine}  ({host.name}, {host.address})")
        for key, label in FACT_LABELS.items():
            was, now = before[machine].get(key, "?").strip(), after.get(key, "?").strip()
            print(f"    {label:<26} {'(unchanged) ' if was == now else ''}{was} -> {now}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/demo", description="In-place rollout demo on 3 lab hosts.")
    parser.add_argument("--lab-name", default="demo", help="lab name (default: demo)")
    parser.add_argument("--retry-after", type=int, default=2, help="service's retryAfterSeconds (default 2)")
    parser.add_argument(
        "--keep-workdir", action="store_true", help="keep the inventory, logs and run artifacts"
    )
    args = parser.parse_args(argv)
    clock = Clock()
    lab = Lab(args.lab_name)
    workdir = Path(tempfile.mkdtemp(prefix="inplace-demo-"))
    try:
        if lab.exists():
            raise DemoError(
                f"lab {args.lab_name!r} is already up; 'hostlab --name {args.lab_name} down' first"
            )
        clock.say("bringing up 3 lab hosts (the first run on a machine builds the Debian base, ~40 s)")
        hosts = lab.up(3, owner_pid=os.getpid(), log=lambda line: clock.say(line.removeprefix("hostlab: ")))
        clock.say("lab up: " + ", ".join(f"{h.name} {h.address}" for h in hosts))
        return rollout(lab, workdir, clock, args.retry_after)
    except LabUnavailable as exc:
        print(f"demo: this machine cannot run the lab: {exc}", file=sys.stderr)
        return 77
    except (LabError, DemoError, httpx.HTTPError) as exc:
        print(f"demo: {exc}", file=sys.stderr)
        return 1
    finally:
        lab.down()
        clock.say(f"lab {lab.name} torn down")
        if args.keep_workdir:
            clock.say(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
