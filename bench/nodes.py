"""The real-node run of ``bench/update.py``: one update on a real Kubernetes node, the service against an
SSH-script floor measured in the same run.

Brings up its own kubelab (flavour ``nodes``) and one hostlab node (systemd booted by systemd-nspawn,
containerd, the lab's kubelet and kubeadm) joined with ``kubeadm join``, starts ``inplace-extension serve
--plain-http`` and alternates, on the same node with new content every round:

- **service**: a files (three files) + kubelet_args (``max-pods``) update through UpdateMachine, polled
  like CAPI (retryAfterSeconds 1) until ``Success``: the project's playbook restarts the real kubelet
  through systemd and waits for its healthz;
- **floor**: the same change made by one hand-written shell script over one new SSH connection (``sudo
  sh``: write the three files and ``/etc/default/kubelet``, ``systemctl restart kubelet``, poll the
  kubelet's healthz every 0.25 s as the role does), which is what an operator would type.

After each, the time until the apiserver's Node is Ready again with the new ``max-pods`` capacity is taken
too (the kubelet's own status update, the same for both). Medians, and the service/floor ratio of each.
Needs root and the node lab's prerequisites (docs/development.md); everything is stopped at the end.

    .venv/bin/python bench/update.py --real-nodes [--rounds 3]
"""

from __future__ import annotations

import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the e2e CAPI driver lives with the tests

from e2e.capi import NodeSpec, poll_update_machine  # noqa: E402
from e2e.service import Service  # noqa: E402
from hostlab.inventory import render  # noqa: E402
from hostlab.lab import Host  # noqa: E402
from hostlab.lab import Lab as HostLab  # noqa: E402
from hostlab.proc import wait_until  # noqa: E402
from hostlab.state import NODE  # noqa: E402
from kubelab import node_join  # noqa: E402
from kubelab.flavours import nodes as nodes_flavour  # noqa: E402
from kubelab.lab import Lab as KubeLab  # noqa: E402

from inplace_extension.runs.ssh import close_control_masters  # noqa: E402

VERSION = nodes_flavour.START_VERSION
FILES = ("a", "b", "c")
HEALTHZ = "http://127.0.0.1:10248/healthz"
READY_TIMEOUT = 120.0


def spec(tag: str, max_pods: int) -> NodeSpec:
    """Three files and one kubelet flag; ``tag`` makes every round's content (and fingerprint) new."""
    file = {"owner": "root:root", "permissions": "0644"}
    files = [{**file, "path": f"/etc/bench/{n}.conf", "content": f"{n} {tag}\n"} for n in FILES]
    args = {"nodeRegistration": {"kubeletExtraArgs": [{"name": "max-pods", "value": str(max_pods)}]}}
    return NodeSpec(VERSION, {"files": files, "joinConfiguration": args})


def floor_script(tag: str, max_pods: int) -> str:
    """The same change as :func:`spec` by hand: files, the kubelet's flags file, restart, wait for healthz."""
    lines = ["set -e", "mkdir -p /etc/bench"]
    for n in FILES:
        path = f"/etc/bench/{n}.conf"
        lines += [f"printf '%s\\n' {shlex.quote(f'{n} {tag}')} > {path}", f"chmod 0644 {path}"]
    flags = f'KUBELET_EXTRA_ARGS="--max-pods={max_pods}"'
    lines += [
        f"printf '%s\\n' {shlex.quote(flags)} > /etc/default/kubelet",
        "systemctl restart kubelet",
        # the node has no curl: python3 is there (Ansible needs it), the role asks the same URL
        "python3 - <<'EOF'",
        "import time, urllib.request",
        "deadline = time.monotonic() + 60",
        "while True:",
        "    try:",
        f"        if urllib.request.urlopen({HEALTHZ!r}, timeout=1).status == 200:",
        "            break",
        "    except OSError:",
        "        if time.monotonic() > deadline:",
        "            raise",
        "    time.sleep(0.25)",
        "EOF",
    ]
    return "\n".join(lines) + "\n"


@dataclass
class NodeBench:
    kube: KubeLab
    lab: HostLab
    host: Host
    service: Service
    api: httpx.Client  # the lab's apiserver, as admin

    def node_ready_with(self, max_pods: int) -> bool:
        """The apiserver's Node is Ready and reports the new ``max-pods`` capacity."""
        node: dict[str, Any] = self.api.get(f"/api/v1/nodes/{self.host.name}").json()
        status = node.get("status", {})
        ready = any(c["type"] == "Ready" and c["status"] == "True" for c in status.get("conditions", []))
        return ready and status.get("capacity", {}).get("pods") == str(max_pods)

    def until_ready(self, started: float, max_pods: int) -> float:
        if not wait_until(lambda: self.node_ready_with(max_pods), READY_TIMEOUT, 0.1):
            raise SystemExit(f"bench: Node {self.host.name} not Ready with max-pods {max_pods}")
        return time.monotonic() - started

    def through_service(self, tag: str, max_pods: int) -> tuple[float, float]:
        started = time.monotonic()
        polled = poll_update_machine(self.service.client, self.host.name, spec(tag, max_pods), within=300)
        if (polled.status, polled.message) != ("Success", "update applied"):
            raise SystemExit(f"bench: the service did not converge: {polled.messages}")
        return time.monotonic() - started, self.until_ready(started, max_pods)

    def by_script(self, tag: str, max_pods: int) -> tuple[float, float]:
        argv = [*self.lab.ssh_argv(self.host), "--", "sudo", "-n", "sh", "-s"]
        started = time.monotonic()
        proc = subprocess.run(
            argv, input=floor_script(tag, max_pods), capture_output=True, text=True, timeout=120, check=False
        )
        done = time.monotonic() - started
        if proc.returncode != 0:
            raise SystemExit(f"bench: the SSH script failed ({proc.returncode}): {proc.stderr[-2000:]}")
        return done, self.until_ready(started, max_pods)


@contextmanager
def node_lab() -> Iterator[NodeBench]:
    kube = KubeLab("bench-nodes")
    lab = HostLab("bench-nodes")
    work = Path(tempfile.mkdtemp(prefix="bench-nodes-"))
    service: Service | None = None
    try:
        kube.up(owner_pid=os.getpid())
        kube.ensure_flavour("nodes")
        host = lab.up(1, owner_pid=os.getpid(), kind=NODE)[0]
        node_join.join(kube, lab, host, VERSION)
        inventory = work / "inventory.yaml"
        inventory.write_text(render(lab, "service", [host.name]))
        runs = work / "runs"
        argv = [sys.executable, "-m", "inplace_extension", "serve", "--plain-http", "--listen", "127.0.0.1:0"]
        argv += ["--inventory", str(inventory), "--allowed-cidrs", str(lab.network), "--runs-dir", str(runs)]
        argv += ["--retry-after-seconds", "1", "--log-level", "WARNING"]
        service = Service(argv, work / "service.log", runs)
        with kube.http() as api:
            yield NodeBench(kube, lab, host, service, api)
    finally:
        if service is not None:
            service.stop()
            close_control_masters(service.runs_dir)
        lab.down()
        kube.down()


def main(rounds: int) -> int:
    load_before = os.getloadavg()[0]
    started = time.monotonic()
    with node_lab() as bench:
        lab_up = time.monotonic() - started
        # warm-up (SSH masters, page cache, the kubelet's first restarts) for both ways, not counted
        bench.through_service("warm", 100)
        bench.by_script("warm", 101)
        runs: dict[str, list[tuple[float, float]]] = {"service": [], "floor": []}
        ways = {"service": bench.through_service, "floor": bench.by_script}
        for r in range(rounds):
            # which goes first alternates, so that a slow spell of the machine hits both alike
            for n, way in enumerate(sorted(ways, reverse=r % 2 == 1)):
                runs[way].append(ways[way](f"r{r}{way}", 110 + 2 * r + n))
        service, floor = runs["service"], runs["floor"]
    svc_done, svc_ready = (statistics.median(t[i] for t in service) for i in (0, 1))
    floor_done, floor_ready = (statistics.median(t[i] for t in floor) for i in (0, 1))

    def times(runs: list[tuple[float, float]], i: int) -> str:
        return ", ".join(f"{t[i]:.2f}" for t in runs)

    report = [
        (
            f"bench/update.py --real-nodes: {rounds} rounds",
            f"{os.cpu_count()} CPUs shared with the lab, load average {load_before:.1f} at the start",
        ),
        ("node lab up (kubelab, node boot, kubeadm join)", f"{lab_up:6.1f} s"),
        ("files+kubelet_args, real kubelet: service", f"{svc_done:6.2f} s   median of {times(service, 0)}"),
        ("  SSH script floor (one connection)", f"{floor_done:6.2f} s   median of {times(floor, 0)}"),
        ("  service / floor", f"{svc_done / floor_done:6.2f}x"),
        ("until the Node is Ready again: service", f"{svc_ready:6.2f} s   median of {times(service, 1)}"),
        ("  SSH script floor", f"{floor_ready:6.2f} s   median of {times(floor, 1)}"),
        ("  service / floor", f"{svc_ready / floor_ready:6.2f}x"),
        ("load average at the end", f"{os.getloadavg()[0]:6.1f}"),
    ]
    for label, value in report:
        print(f"{label:<48} {value}".rstrip())
    return 0
