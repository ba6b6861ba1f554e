"""``inplace-extension mcm-agent`` as a subprocess beside the real MCM, and the MCM pool a test rolls
out: a MachineDeployment of lab hosts (static-hosts machine controller) and its MachineClasses."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
import yaml
from hostlab.inventory import service_inventory
from hostlab.lab import Host
from hostlab.lab import Lab as HostLab
from hostlab.proc import stop_child, wait_until
from kubelab import objects
from kubelab.flavours import mcm, mcm_objects
from kubelab.lab import Lab

from inplace_extension.mcm import node_state as ns
from inplace_extension.plays.outcomes import load_attempts
from inplace_extension.runs.attempts import Attempt

REPO = Path(__file__).resolve().parents[2]
HOST_LABEL = "static-hosts.inplace-extension.io/host"
WAIT = 180.0


def write_inventory(hostlab: HostLab, path: Path, unlisted: Sequence[Host] = ()) -> Path:
    """The lab inventory with each entry matched by the Node label naming its host (the address comes
    from the static-hosts driver's annotation; the entry pins the host key). ``unlisted`` hosts get no
    entry: the defaults give their SSH settings and pin their host keys, the address must come from
    elsewhere (the Node's status.addresses)."""
    inventory = service_inventory(hostlab)
    skipped = {host.name for host in unlisted}
    entries = []
    for entry, host in zip(inventory["hosts"], hostlab.hosts(), strict=True):
        entry["match"] = {"labels": {HOST_LABEL: host.name}}
        if host.name in skipped:
            defaults = {k: v for k, v in entry.items() if k not in ("match", "address")}
            defaults["known_hosts"] = "\n".join(hostlab.known_hosts_line(h) for h in unlisted)
            inventory["defaults"] = defaults
        else:
            entries.append(entry)
    inventory["hosts"] = entries
    path.write_text(yaml.safe_dump(inventory, sort_keys=False, width=1000))
    return path


def play_started(runs: Path) -> bool:
    """An agent with this runs dir has a play running on a host: ansible-playbook wrote its first event
    (``<runs>/.batches/<batch>/artifacts/<batch>/job_events/``)."""
    return any(runs.glob(".batches/*/artifacts/*/job_events/*.json"))


def attempts(runs: Path, node: str, fingerprint: str) -> list[Attempt]:
    """The agent's attempts of one Node's update to ``fingerprint``, oldest first, from its run artifacts."""
    return load_attempts(runs / f"{mcm.NAMESPACE}.{node}.{fingerprint[:12]}", fingerprint, None)


class AgentProcess:
    def __init__(
        self,
        argv: Sequence[str],
        log_path: Path,
        port: int,
        runs_dir: Path,
        env: Mapping[str, str] | None = None,
    ) -> None:
        """``env``: variables set for the agent on top of the test's environment."""
        self.log_path, self.port, self.runs_dir = log_path, port, runs_dir
        self._log = log_path.open("ab")
        try:
            self.proc = subprocess.Popen(
                list(argv),
                stdout=self._log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=REPO,
                env={**os.environ, **(env or {})},
            )
        except BaseException:
            self._log.close()
            raise
        try:
            if not wait_until(lambda: self.healthy() or self.proc.poll() is not None, 60, 0.1):
                raise AssertionError(f"mcm-agent not healthy: {self.log()}")
            assert self.proc.poll() is None, f"mcm-agent exited: {self.log()}"
        except BaseException:  # the caller gets no AgentProcess to stop: stop it (and close its log) here
            self.stop()
            raise

    def get(self, path: str) -> httpx.Response:
        return httpx.get(f"http://127.0.0.1:{self.port}{path}", timeout=5)

    def healthy(self) -> bool:
        try:
            return self.get("/healthz").status_code == 200
        except httpx.HTTPError:
            return False

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)
        self._log.close()

    def stop(self) -> None:
        stop_child(self.proc, 20)
        self._log.close()


def agent_argv(
    lab: Lab,
    hostlab: HostLab,
    inventory: Path,
    runs: Path,
    capabilities: Path,
    port: int,
    extra: Sequence[str] = (),
) -> list[str]:
    flags = {
        "--target-kubeconfig": str(lab.kubeconfig),
        "--namespace": mcm.NAMESPACE,
        "--inventory": str(inventory),
        "--allowed-cidrs": str(hostlab.network),
        "--runs-dir": str(runs),
        "--capabilities-file": str(capabilities),
        "--retry-after-seconds": "1",
        "--listen": f"127.0.0.1:{port}",
        "--poll-seconds": "0.5",
        "--resync-seconds": "2",
        "--claim-seconds": "30",
    }
    argv = [sys.executable, "-m", "inplace_extension", "mcm-agent", *(a for f in flags.items() for a in f)]
    return [*argv, *extra]


# (version, class name, the version's inPlaceUpdate spec) -> the MachineClass
MakeClass = Callable[[str, str, Mapping[str, Any]], dict[str, Any]]


def static_hosts_class(version: str, name: str, spec: Mapping[str, Any]) -> dict[str, Any]:
    """A pool's MachineClass whose providerSpec is only the desired state (``inPlaceUpdate``)."""
    return mcm_objects.machine_class(name, {"inPlaceUpdate": dict(spec)})


class Pool:
    """A MachineDeployment of ``len(hosts)`` Machines on the lab hosts, on class ``<name>-v1``.
    ``provider_ids``: host name -> the providerID its Machine and Node get (the driver's own otherwise);
    ``make_class``: the classes of another shape than :func:`static_hosts_class`."""

    def __init__(
        self,
        lab: Lab,
        name: str,
        hosts: Sequence[Host],
        specs: Mapping[str, Mapping[str, Any]],
        provider_ids: Mapping[str, str] | None = None,
        make_class: MakeClass = static_hosts_class,
        **md: Any,
    ) -> None:
        self.lab, self.name, self.hosts = lab, name, list(hosts)
        mcm.set_hosts(lab, {h.name: h.address for h in hosts}, provider_ids)
        self.classes = {v: f"{name}-{v}" for v in specs}
        classes = [make_class(v, self.classes[v], s) for v, s in specs.items()]
        self.md = mcm_objects.machine_deployment(name, self.classes["v1"], len(hosts), **md)
        mcm_objects.apply_pool(lab, self.md, *classes)
        if not wait_until(lambda: self._running(len(hosts)), WAIT, 0.5):
            raise AssertionError(f"pool {name}: {[mcm_objects.phase(m) for m in self.machines()]}")
        self.initial = sorted(m["metadata"]["name"] for m in self.machines())

    def machines(self) -> list[dict[str, Any]]:
        return mcm_objects.machines(self.lab, self.name)

    def _running(self, count: int) -> bool:
        found = self.machines()
        if len(found) != count or any(mcm_objects.phase(m) != "Running" for m in found):
            return False
        return all(ns.is_ready(self.node(m["metadata"]["name"])) for m in found)

    def machine_sets(self) -> list[dict[str, Any]]:
        return mcm_objects.listed(self.lab, mcm_objects.MACHINE_SETS, f"name={self.name}")

    def node(self, name: str) -> dict[str, Any]:
        return objects.get(self.lab, "node", name) or {}

    def nodes(self) -> list[dict[str, Any]]:
        return [self.node(name) for name in self.initial]

    def host_of(self, node: Mapping[str, Any]) -> Host:
        host_name = ns.node_labels(node)[HOST_LABEL]
        return next(h for h in self.hosts if h.name == host_name)

    def switch(self, version: str) -> None:
        patch = {"spec": {"template": {"spec": {"class": {"name": self.classes[version]}}}}}
        self.lab.kubectl(
            "patch",
            mcm_objects.MACHINE_DEPLOYMENTS,
            self.name,
            "-n",
            mcm.NAMESPACE,
            "--type=merge",
            "-p",
            yaml.safe_dump(patch),
        )

    def deployment(self) -> dict[str, Any]:
        return objects.get(self.lab, mcm_objects.MACHINE_DEPLOYMENTS, self.name, mcm.NAMESPACE) or {}

    def finished(self) -> bool:
        """MCM is done: 3/3 updated and available, every Node cleaned up and back to Running Machines."""
        deployment = self.deployment()
        status = deployment.get("status", {})
        # the counts are of the template MCM has seen: right after a switch they are still the old
        # template's 3/3 until MCM observes the new generation (a poll within milliseconds of the patch,
        # as the lab's HTTP reads make it, took the rollout for done before it started)
        if status.get("observedGeneration") != deployment.get("metadata", {}).get("generation"):
            return False
        count = len(self.hosts)
        if status.get("updatedReplicas") != count or status.get("availableReplicas") != count:
            return False
        if any(mcm_objects.phase(m) != "Running" for m in self.machines()):
            return False
        return all(
            ns.CANDIDATE_LABEL not in ns.node_labels(n) and not ns.has_critical_taint(n) for n in self.nodes()
        )

    def delete(self) -> None:
        """Delete the MachineDeployment: MCM terminates its MachineSets and Machines (scaling to 0 does
        not proceed during an unfinished in-place rollout), the driver deletes the Nodes, the hosts are
        free for the next pool."""
        self.lab.kubectl(
            "delete", mcm_objects.MACHINE_DEPLOYMENTS, self.name, "-n", mcm.NAMESPACE, "--wait=false"
        )
        if not wait_until(lambda: not self.machines(), WAIT, 0.5):
            raise AssertionError(
                f"pool {self.name}: Machines left {[m['metadata']['name'] for m in self.machines()]}"
            )
        for name in self.initial:
            objects.wait_gone(self.lab, "node", name, timeout=WAIT)
