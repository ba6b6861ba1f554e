"""The demo: a MachineDeployment rolled out in place on 3 lab hosts, driven exactly as Cluster API would.

``scripts/demo`` (or ``python -m hostlab.demo``) brings up a lab of 3 hosts, writes an inventory mapping
three Machines of MachineDeployment ``demo-md-0`` to them, starts ``inplace-extension serve`` on loopback
with that inventory, and then plays the rollout the way the CAPI controllers do (docs: capi-hooks.md):

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
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import copy
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import jsonpatch

from hostlab.errors import LabError, LabUnavailable
from hostlab.inventory import render
from hostlab.lab import Host, Lab

HOOKS = "/hooks.runtime.cluster.x-k8s.io/v1alpha1"
NAMESPACE = "demo"
CLUSTER = "demo"
DEPLOYMENT = "demo-md-0"
OLD_SET, NEW_SET = "demo-md-0-6d9f7c8b5x", "demo-md-0-8b4c6f9d2q"
MACHINES = ("demo-md-0-6d9f7c8b5x-k2x7p", "demo-md-0-6d9f7c8b5x-m8r4t", "demo-md-0-6d9f7c8b5x-w5n9q")
BANNER_PATH = "/etc/inplace-demo/banner"
BANNER = "This node was updated in place by inplace-extension.\n"
DEMO_USER = "ops-alice"
# a bootstrap token as CABPK keeps it in every KubeadmConfig: the service must never echo or log it
BOOTSTRAP_TOKEN = "dem0ab.0123456789abcdef"  # noqa: S105 - a made-up token the demo checks stays secret
SERVING_RE = re.compile(r"serving (http://127\.0\.0\.1:\d+)")
EXIT_STOPPED = 2


class DemoError(RuntimeError):
    """The demo cannot go on; the message says where and why."""


class Clock:
    def __init__(self) -> None:
        self.start = time.monotonic()

    def say(self, message: str) -> None:
        print(f"[{time.monotonic() - self.start:6.1f}s] {message}", flush=True)


# ----- the objects CAPI would send ------------------------------------------------------------------


def _meta(name: str, **labels: str) -> dict[str, Any]:
    base = {"cluster.x-k8s.io/cluster-name": CLUSTER, "cluster.x-k8s.io/deployment-name": DEPLOYMENT}
    return {"name": name, "namespace": NAMESPACE, "labels": {**base, **labels}}


def kubeadm_spec(new: bool, alice_key: str) -> dict[str, Any]:
    """The KubeadmConfig(Template) spec: the new one adds a file and a user."""
    spec: dict[str, Any] = {"joinConfiguration": {"nodeRegistration": {}}}
    if new:
        spec["files"] = [
            {"path": BANNER_PATH, "content": BANNER, "owner": "root:root", "permissions": "0644"}
        ]
        spec["users"] = [{"name": DEMO_USER, "shell": "/bin/bash", "sshAuthorizedKeys": [alice_key]}]
    return spec


def machine_set_objects(new: bool, alice_key: str) -> dict[str, Any]:
    set_name = NEW_SET if new else OLD_SET
    template_hash = set_name.rsplit("-", 1)[1]
    suffix = "v2" if new else "v1"
    return {
        "machineSet": {
            "kind": "MachineSet",
            "apiVersion": "cluster.x-k8s.io/v1beta2",
            "metadata": _meta(set_name, **{"machine-template-hash": template_hash}),
            "spec": {
                "clusterName": CLUSTER,
                "replicas": len(MACHINES),
                "selector": {"matchLabels": {"machine-template-hash": template_hash}},
                "template": {
                    "metadata": {"labels": {"machine-template-hash": template_hash}},
                    "spec": {
                        "clusterName": CLUSTER,
                        "bootstrap": {
                            "configRef": {
                                "apiGroup": "bootstrap.cluster.x-k8s.io",
                                "kind": "KubeadmConfigTemplate",
                                "name": f"demo-md-0-bootstrap-{suffix}",
                            }
                        },
                        "infrastructureRef": {
                            "apiGroup": "infrastructure.cluster.x-k8s.io",
                            "kind": "DockerMachineTemplate",
                            "name": "demo-md-0-infra-v1",
                        },
                        # no version: the lab hosts run no Kubernetes, so the kubernetes_version
                        # capability (it checks the installed kubelet) has nothing to act on
                    },
                },
            },
        },
        "infrastructureMachineTemplate": {
            "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta2",
            "kind": "DockerMachineTemplate",
            "metadata": _meta("demo-md-0-infra-v1"),
            "spec": {"template": {"spec": {}}},
        },
        "bootstrapConfigTemplate": {
            "apiVersion": "bootstrap.cluster.x-k8s.io/v1beta2",
            "kind": "KubeadmConfigTemplate",
            "metadata": _meta(f"demo-md-0-bootstrap-{suffix}"),
            "spec": {"template": {"spec": kubeadm_spec(new, alice_key)}},
        },
    }


def update_machine_request(machine: str, alice_key: str) -> dict[str, Any]:
    labels = {"cluster.x-k8s.io/set-name": NEW_SET}
    in_progress = {"in-place-updates.internal.cluster.x-k8s.io/update-in-progress": ""}
    bootstrap = kubeadm_spec(True, alice_key)
    # as stored by CABPK: the join discovery, with its token, is part of the live KubeadmConfig
    bootstrap["joinConfiguration"]["discovery"] = {
        "bootstrapToken": {"apiServerEndpoint": "10.0.0.1:6443", "token": BOOTSTRAP_TOKEN, "caCertHashes": []}
    }
    return {
        "kind": "UpdateMachineRequest",
        "apiVersion": "hooks.runtime.cluster.x-k8s.io/v1alpha1",
        "desired": {
            "machine": {
                "kind": "Machine",
                "apiVersion": "cluster.x-k8s.io/v1beta2",
                "metadata": {
                    **_meta(machine, **labels),
                    "annotations": {**in_progress, "runtime.cluster.x-k8s.io/pending-hooks": "UpdateMachine"},
                },
                "spec": {
                    "clusterName": CLUSTER,
                    "bootstrap": {
                        "configRef": {
                            "apiGroup": "bootstrap.cluster.x-k8s.io",
                            "kind": "KubeadmConfig",
                            "name": machine,
                        },
                        "dataSecretName": machine,
                    },
                    "infrastructureRef": {
                        "apiGroup": "infrastructure.cluster.x-k8s.io",
                        "kind": "DockerMachine",
                        "name": machine,
                    },
                },
            },
            "infrastructureMachine": {
                "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta2",
                "kind": "DockerMachine",
                "metadata": {**_meta(machine, **labels), "annotations": in_progress},
                "spec": {"bootstrapped": True},
            },
            "bootstrapConfig": {
                "apiVersion": "bootstrap.cluster.x-k8s.io/v1beta2",
                "kind": "KubeadmConfig",
                "metadata": {**_meta(machine, **labels), "annotations": in_progress},
                "spec": bootstrap,
            },
        },
    }


# ----- CAPI's side of the protocol ---------------------------------------------------------------------

# fields CAPI leaves out when it compares Machine specs (CleanupMachineSpecForDiff, capi-hooks.md §5)
IGNORED_MACHINE_FIELDS = ("clusterName", "bootstrap", "infrastructureRef", "providerID", "minReadySeconds")
PATCH_FIELDS = {
    "machineSet": "machineSetPatch",
    "infrastructureMachineTemplate": "infrastructureMachineTemplatePatch",
    "bootstrapConfigTemplate": "bootstrapConfigTemplatePatch",
}


def apply_patch(obj: dict[str, Any], patch: Mapping[str, Any] | None) -> dict[str, Any]:
    if not patch or not patch.get("patch"):
        return obj
    ops = json.loads(base64.b64decode(patch["patch"]))
    if patch.get("patchType") == "JSONPatch":
        result = jsonpatch.apply_patch(obj, ops)
        assert isinstance(result, dict)  # noqa: S101 - a patch of an object yields an object
        return result
    if patch.get("patchType") == "JSONMergePatch":
        merged = _merge(obj, ops)
        if not isinstance(merged, dict):
            raise DemoError("a JSONMergePatch replaced a whole object with a non-object")
        return merged
    raise DemoError(f"unknown patchType {patch.get('patchType')!r}")


def _merge(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return patch
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = _merge(result.get(key), value)
    return result


def _comparable(kind: str, obj: dict[str, Any]) -> Any:
    spec = copy.deepcopy(obj.get("spec", {}))
    if kind == "machineSet":
        template_spec = spec.get("template", {}).get("spec", {})
        return {k: v for k, v in template_spec.items() if k not in IGNORED_MACHINE_FIELDS}
    return spec.get("template", {}).get("spec", {})


def capi_decides_in_place(request: dict[str, Any], response: dict[str, Any]) -> list[str]:
    """Apply the answer's patches to the current objects; return the objects that still differ."""
    differing = []
    for kind, field in PATCH_FIELDS.items():
        patched = apply_patch(copy.deepcopy(request["current"][kind]), response.get(field))
        if _comparable(kind, patched) != _comparable(kind, request["desired"][kind]):
            differing.append(kind)
    return differing


def _patch_summary(response: dict[str, Any]) -> str:
    parts = []
    for field in PATCH_FIELDS.values():
        patch = response.get(field)
        if patch and patch.get("patch"):
            ops = json.loads(base64.b64decode(patch["patch"]))
            paths = [f"{op['op']} {op['path']}" for op in ops] if isinstance(ops, list) else ["merge"]
            parts.append(f"{field}: {', '.join(paths)}")
    return "; ".join(parts) or "no patches"


# ----- the service ------------------------------------------------------------------------------------


@dataclass
class Service:
    proc: subprocess.Popen[bytes]
    url: str
    log_path: Path


@contextlib.contextmanager
def running_service(inventory: Path, lab: Lab, workdir: Path, retry_after: int) -> Iterator[Service]:
    log_path = workdir / "service.log"
    argv = [sys.executable, "-m", "extension", "serve", "--listen", "127.0.0.1:0", "--plain-http",
            "--inventory", str(inventory), "--allowed-cidrs", str(lab.network),
            "--runs-dir", str(workdir / "runs"), "--retry-after-seconds", str(retry_after)]  # fmt: skip
    with log_path.open("ab") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not (match := SERVING_RE.search(log_path.read_text(errors="replace"))):
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-20:])
                raise DemoError(f"the service did not start (see {log_path}):\n{tail}")
            time.sleep(0.05)
        yield Service(proc, match.group(1), log_path)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        _close_run_ssh_masters(workdir / "runs")


def _close_run_ssh_masters(runs_dir: Path) -> None:
    """End the service's ControlPersist ssh masters (they would linger for a minute after the runs)."""
    try:
        from extension.runs.runner import control_path_dir
    except ImportError:
        return
    cp_dir = control_path_dir(runs_dir)
    for sock in cp_dir.glob("*") if cp_dir.is_dir() else ():
        subprocess.run(["ssh", "-O", "exit", "-o", f"ControlPath={sock}", "lab"], capture_output=True,
                       timeout=10, check=False)  # fmt: skip


def _post(client: httpx.Client, path: str, body: dict[str, Any]) -> dict[str, Any]:
    response = client.post(path, json=body)
    if response.status_code != 200:
        raise DemoError(f"POST {path}: HTTP {response.status_code}: {response.text[:500]}")
    data = response.json()
    if not isinstance(data, dict):
        raise DemoError(f"POST {path}: the answer is not a JSON object")
    return data


def discover(client: httpx.Client) -> dict[str, str]:
    """Hook name -> handler path, from the Discovery answer (as the CAPI runtime client builds it)."""
    body = {"kind": "DiscoveryRequest", "apiVersion": "hooks.runtime.cluster.x-k8s.io/v1alpha1"}
    answer = _post(client, f"{HOOKS}/discovery", body)
    if answer.get("status") != "Success":
        raise DemoError(f"Discovery failed: {answer.get('message')}")
    paths = {}
    for handler in answer.get("handlers", []):
        hook = handler["requestHook"]["hook"]
        paths[hook] = f"{HOOKS}/{hook.lower()}/{handler['name']}"
    for hook in ("CanUpdateMachineSet", "UpdateMachine"):
        if hook not in paths:
            raise DemoError(f"the service registers no {hook} handler")
    return paths


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
    login = subprocess.run(
        ["ssh", "-i", str(alice_key_file), "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
         "-o", f"UserKnownHostsFile={lab.known_hosts}", "-o", "StrictHostKeyChecking=yes",
         "-o", "ConnectTimeout=5", "-o", "LogLevel=ERROR", f"{DEMO_USER}@{host.address}", "whoami"],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    facts["login"] = "ok" if login.stdout.strip() == DEMO_USER else "refused"
    return facts


# ----- the rollout ------------------------------------------------------------------------------------


def rollout(lab: Lab, workdir: Path, clock: Clock, retry_after: int) -> int:
    hosts = lab.hosts()
    machine_to_host = dict(zip(MACHINES, hosts, strict=True))
    key_file = workdir / "ops-alice_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", DEMO_USER, "-f", str(key_file)],
                   check=True, capture_output=True)  # fmt: skip
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
        answer = _post(client, paths["CanUpdateMachineSet"], request)
        clock.say(
            f"CanUpdateMachineSet {OLD_SET} -> {NEW_SET}: {answer.get('status')}; {_patch_summary(answer)}"
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
                answer = _post(client, paths["UpdateMachine"], body)
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
