"""The Kubernetes-aware mode with the real CAPI v1.14.2 controllers (kubelab capi flavour).

Real: the apiserver, CAPI core/KCP/CABPK/CAPD, our service (``serve --kubeconfig``) registered through
an ExtensionConfig, the playbooks over SSH on a hostlab host. Simulated: CAPD's in-memory machines (no
VM: the Machine's operating system is the lab host its DevMachine's ``status.addresses`` names), and
the workload Nodes: CAPD's in-memory workload API servers are fakes, so the drain and the health gate
use the kubelab's own API server (``--workload-kubeconfig management``) where a kwok Node carries the
name of the Machine's ``status.nodeRef`` (kwok stands in for its kubelet).
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from e2e import conftest as e2e_fixtures
from e2e.conftest import START_VERSION
from e2e.hostcheck import stamp_writes
from hostlab.inventory import service_inventory
from hostlab.lab import Host
from hostlab.lab import Lab as HostLab
from kubelab import objects
from kubelab.flavours import capi_objects as co
from kubelab.lab import Lab
from playbooks.standins import install_standins, lab_run_on_host

from inplace_extension.runs.runner import close_control_masters

pytestmark = [pytest.mark.lab, pytest.mark.kube, pytest.mark.capi]

release_server = e2e_fixtures.release_server
e2e_playbooks = e2e_fixtures.e2e_playbooks

EXTENSION = "inplace-extension-kube"
SELECTOR = {"inplace-extension.io/capi-kube-aware": "yes"}
MACHINES = "machines.cluster.x-k8s.io"
DEV_MACHINES = "devmachines.infrastructure.cluster.x-k8s.io"
MD = "machinedeployments.cluster.x-k8s.io"
SKIP_REMEDIATION = "cluster.x-k8s.io/skip-remediation"
CORDONED_BY = "inplace-extension.io/cordoned-by"
GATE_SECONDS = 15
DRAIN_SECONDS = 8
SERVING_RE = re.compile(r"serving https://127\.0\.0\.1:(\d+)")


def wait(
    holds: Callable[[], bool], timeout: float, what: str, explain: Callable[[], str] = lambda: ""
) -> None:
    deadline = time.monotonic() + timeout
    while not holds():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:g}s: {what}\n{explain()}")
        time.sleep(0.5)


@dataclass
class KubeExtension:
    kube: Lab
    hosts: HostLab
    inventory: Path
    runs_dir: Path
    log_path: Path
    argv: list[str]
    proc: subprocess.Popen[bytes] | None = None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def start(self) -> None:
        """Start ``serve`` (same flags and port every time) and wait until it serves."""
        served = self.log().count("inplace-extension: serving")
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                self.argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        proc = self.proc
        wait(
            lambda: self.log().count("inplace-extension: serving") > served or proc.poll() is not None,
            30,
            "serving",
        )
        assert proc.poll() is None, self.log()

    def kill(self) -> None:
        """SIGKILL, by PID, the service this fixture started (as an OOM kill would)."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)  # by PID: the service this fixture started
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)

    def serve_host(self, host: Host) -> None:
        """Only inventory defaults (SSH user, key, this host's key): the address comes from the Machine."""
        entry: dict[str, Any] = service_inventory(self.hosts, [host.name])["hosts"][0]
        defaults = {k: v for k, v in entry.items() if k not in ("match", "address")}
        self.inventory.write_text(yaml.safe_dump({"hosts": [], "defaults": defaults}))


@pytest.fixture(scope="module")
def kube_extension(
    kubelab_capi: Lab, lab: HostLab, e2e_playbooks: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[KubeExtension]:
    # short: ssh's ControlPath socket lives under the runs dir (108-byte limit for socket paths)
    work = Path(tempfile.mkdtemp(prefix="ka-"))
    cert = kubelab_capi.pki.issue_server(EXTENSION)
    inventory = work / "inventory.yaml"
    inventory.write_text("hosts: []\n")
    log_path = tmp_path_factory.mktemp("capi-kube-aware") / "service.log"  # kept after the run
    argv = [
        sys.executable, "-m", "inplace_extension", "serve",
        "--listen", f"127.0.0.1:{kubelab_capi.free_port()}",
        "--tls-cert", str(cert.cert), "--tls-key", str(cert.key),
        "--inventory", str(inventory),
        "--allowed-cidrs", str(lab.network),
        "--runs-dir", str(work / "runs"),
        "--playbooks-dir", str(e2e_playbooks),
        "--retry-after-seconds", "1",
        "--kubeconfig", str(kubelab_capi.kubeconfig),
        "--workload-kubeconfig", "management",
        "--drain-timeout-seconds", str(DRAIN_SECONDS),
        "--health-gate-timeout-seconds", str(GATE_SECONDS),
    ]  # fmt: skip
    ext = KubeExtension(kubelab_capi, lab, inventory, work / "runs", log_path, argv)
    try:
        ext.start()
        match = SERVING_RE.search(ext.log())
        assert match is not None, ext.log()
        url = f"https://127.0.0.1:{match.group(1)}"
        config = co.extension_config(EXTENSION, url, kubelab_capi.ca.read_bytes(), SELECTOR)
        objects.apply(kubelab_capi, config)

        def discovered() -> bool:
            found = objects.get(kubelab_capi, "extensionconfigs.runtime.cluster.x-k8s.io", EXTENSION) or {}
            return len(found.get("status", {}).get("handlers", [])) == 3

        wait(discovered, 60, "CAPI discovered the kube-aware extension", ext.log)
        yield ext
    finally:
        kubelab_capi.kubectl(
            "delete",
            "extensionconfigs.runtime.cluster.x-k8s.io",
            EXTENSION,
            "--ignore-not-found",
            check=False,
        )
        ext.stop()
        close_control_masters(work / "runs")
        shutil.rmtree(work, ignore_errors=True)


@pytest.fixture
def host(lab: HostLab, lab_hosts: list[Host], kube_extension: KubeExtension) -> Host:
    install_standins(lab_run_on_host(lab, lab_hosts[0]), version=START_VERSION)
    kube_extension.serve_host(lab_hosts[0])
    return lab_hosts[0]


@dataclass
class Worker:
    """One in-memory cluster with one MachineDeployment Machine mapped to a lab host and a kwok Node."""

    ext: KubeExtension
    namespace: str
    cluster: str
    machine: str
    uid: str
    node: str
    generation: int = 1

    @property
    def kube(self) -> Lab:
        return self.ext.kube

    @property
    def md(self) -> str:
        return f"{self.cluster}-md-0"

    def machine_obj(self) -> dict[str, Any]:
        found = objects.get(self.kube, MACHINES, self.machine, self.namespace)
        assert found is not None
        return found

    def node_obj(self) -> dict[str, Any]:
        found = objects.get(self.kube, "node", self.node)
        assert found is not None
        return found

    def change(self, spec: dict[str, Any]) -> None:
        """A new KubeadmConfigTemplate for the MachineDeployment (CAPI then asks CanUpdateMachineSet)."""
        self.generation += 1
        name = f"{self.md}-{self.generation}"
        objects.apply(self.kube, co.kubeadm_config_template(name, self.namespace, spec))
        body = {"spec": {"template": {"spec": {"bootstrap": {"configRef": {"name": name}}}}}}
        self.kube.kubectl("patch", MD, self.md, "-n", self.namespace, "--type=merge", "-p", json.dumps(body))

    def updated_in_place(self) -> bool:
        machines = co.machines(self.kube, self.namespace, deployment=self.md)
        return (
            len(machines) == 1
            and machines[0]["metadata"]["uid"] == self.uid
            and co.condition_status(machines[0], "UpToDate") == "True"
            and co.condition_status(machines[0], "Updating") != "True"
        )

    def events(self) -> dict[str, list[str]]:
        listed = json.loads(self.kube.kubectl("get", "events", "-n", self.namespace, "-o", "json").stdout)
        found: dict[str, list[str]] = {}
        for event in listed["items"]:
            if event["involvedObject"].get("uid") == self.uid:
                found.setdefault(event["reason"], []).append(event["message"])
        return found

    def explain(self) -> str:
        return co.conditions_text(co.machines(self.kube, self.namespace)) + f"\nevents {self.events()}"


def create_worker(ext: KubeExtension, host: Host, prefix: str, kwok: bool = True) -> Worker:
    namespace = f"{prefix}-{time.monotonic_ns() % 10**8:08d}"
    objects.apply(
        ext.kube,
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace, "labels": SELECTOR}},
    )
    cluster, kube = prefix, ext.kube
    cp, md = f"{cluster}-cp", f"{cluster}-md-0"
    objects.apply(
        kube,
        co.dev_cluster(cluster, namespace),
        co.cluster(cluster, namespace, control_plane=cp),
        co.dev_machine_template(cp, namespace),
        co.kubeadm_control_plane(cp, namespace, 1, START_VERSION, cp),
        co.dev_machine_template(md, namespace),
        co.kubeadm_config_template(f"{md}-1", namespace),
        co.machine_deployment(md, namespace, cluster, 1, START_VERSION, f"{md}-1", md),
    )

    def running() -> bool:
        machines = co.machines(kube, namespace)
        return len(machines) == 2 and all(co.running(m) for m in machines)

    wait(
        running,
        180,
        f"2 Machines Running in {namespace}",
        lambda: co.conditions_text(co.machines(kube, namespace)),
    )
    machine = co.machines(kube, namespace, deployment=md)[0]
    name, node = machine["metadata"]["name"], machine["status"]["nodeRef"]["name"]
    # the in-memory DevMachine has no address: give it the lab host's, as a real provider reports its VM's;
    # CAPI's Machine controller copies it into Machine.status.addresses
    dev = machine["spec"]["infrastructureRef"]["name"]
    addresses = {"status": {"addresses": [{"type": "InternalIP", "address": host.address}]}}
    kube.kubectl(
        "patch", DEV_MACHINES, dev, "-n", namespace, "--subresource=status", "--type=merge",
        "-p", json.dumps(addresses),
    )  # fmt: skip

    def has_address() -> bool:
        current = objects.get(kube, MACHINES, name, namespace) or {}
        return {"type": "InternalIP", "address": host.address} in current.get("status", {}).get(
            "addresses", []
        )

    wait(has_address, 60, f"Machine {name} shows the host address")
    if kwok:
        objects.create_kwok_node(kube, node)
    else:  # a Node no kubelet (not even kwok) keeps Ready
        objects.apply(kube, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}})
    status = {"status": {"nodeInfo": {"kubeletVersion": START_VERSION}}}
    kube.kubectl("patch", "node", node, "--subresource=status", "--type=merge", "-p", json.dumps(status))
    return Worker(ext, namespace, cluster, name, machine["metadata"]["uid"], node)


class Sampler:
    """Watches the Machine's annotations and the Node's cordon while a rollout runs.

    Watches, not polls: a cordon of a Node whose kwok Pods leave at once lasts well under a second, and
    a watch delivers every change of the object, however short.
    """

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.skip_remediation = False
        self.cordoned = False
        self._client = worker.kube.http()
        self._client.timeout = httpx.Timeout(30, read=None)
        machines = f"/apis/cluster.x-k8s.io/v1beta2/namespaces/{worker.namespace}/machines"
        self._threads = [
            threading.Thread(target=self._watch, args=(machines, worker.machine, self._machine), daemon=True),
            threading.Thread(
                target=self._watch, args=("/api/v1/nodes", worker.node, self._node), daemon=True
            ),
        ]
        self._started = threading.Barrier(3)

    def __enter__(self) -> Sampler:
        for thread in self._threads:
            thread.start()
        self._started.wait(30)  # both watches are open before the test changes anything
        return self

    def __exit__(self, *exc: object) -> None:
        self._client.close()  # ends both streams
        for thread in self._threads:
            thread.join(10)

    def _machine(self, obj: dict[str, Any]) -> None:
        if SKIP_REMEDIATION in obj.get("metadata", {}).get("annotations", {}):
            self.skip_remediation = True

    def _node(self, obj: dict[str, Any]) -> None:
        if obj.get("spec", {}).get("unschedulable"):
            self.cordoned = True

    def _watch(self, path: str, name: str, seen: Callable[[dict[str, Any]], None]) -> None:
        params = {"watch": "true", "fieldSelector": f"metadata.name={name}", "timeoutSeconds": "900"}
        try:
            with self._client.stream("GET", path, params=params) as response:
                response.raise_for_status()
                self._started.wait(30)
                for line in response.iter_lines():
                    if line:
                        seen(json.loads(line).get("object", {}))
        except (httpx.HTTPError, RuntimeError):
            return  # the client was closed by __exit__ (or the API went away: the asserts will say)


def kubelet_args(*pairs: tuple[str, str]) -> dict[str, Any]:
    extra = [{"name": k, "value": v} for k, v in pairs]
    return {"format": "cloud-config", "joinConfiguration": {"nodeRegistration": {"kubeletExtraArgs": extra}}}


def test_a_kubelet_args_change_drains_the_node_marks_the_machine_and_reports_in_events(
    kube_extension: KubeExtension, host: Host
) -> None:
    worker = create_worker(kube_extension, host, "ka-drain")
    workloads = f"{worker.namespace}-pods"
    for pod in ("web-1", "web-2"):
        objects.create_pod(worker.kube, workloads, pod, worker.node, labels={"app": "web"})
    with Sampler(worker) as seen:
        worker.change(kubelet_args(("max-pods", "120")))
        wait(worker.updated_in_place, 240, "the Machine updated in place", worker.explain)
    assert seen.cordoned and seen.skip_remediation  # both while the update ran ...
    node = worker.node_obj()  # ... and neither after it
    assert not node["spec"].get("unschedulable") and CORDONED_BY not in node["metadata"].get(
        "annotations", {}
    )
    assert SKIP_REMEDIATION not in worker.machine_obj()["metadata"].get("annotations", {})
    assert json.loads(worker.kube.kubectl("get", "pods", "-n", workloads, "-o", "json").stdout)["items"] == []
    assert len(stamp_writes(kube_extension.hosts, host)) >= 1
    wait(lambda: "Done" in worker.events(), 30, "the Done Event", worker.explain)
    events = worker.events()
    assert events["Started"] == [f"started on host {host.address} (machine status)"]
    assert events["Drained"] == [f"drained Node {worker.node}"]
    assert "running: kubelet_args" in events["Running"]
    assert events["Uncordoned"] == [f"uncordoned Node {worker.node}"]
    assert re.search(
        r"hook=CanUpdateMachineSet .* decision=in-place .*affects_availability=true", kube_extension.log()
    )


def test_a_users_only_change_does_not_drain_and_does_not_affect_availability(
    kube_extension: KubeExtension, host: Host
) -> None:
    worker = create_worker(kube_extension, host, "ka-users")
    key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGV4YW1wbGUta2V5LWZvci1lMmUtdGVzdHMtb25seQ ka@test"
    before = kube_extension.log()
    with Sampler(worker) as seen:
        worker.change({"format": "cloud-config", "users": [{"name": "kaops", "sshAuthorizedKeys": [key]}]})
        wait(worker.updated_in_place, 240, "the Machine updated in place", worker.explain)
    assert not seen.cordoned and not seen.skip_remediation
    wait(lambda: "Done" in worker.events(), 30, "the Done Event", worker.explain)
    assert "Drained" not in worker.events()
    # the real CAPI v1.14.2 took the answer carrying affectsAvailability (it updated in place)
    new = kube_extension.log()[len(before) :]
    assert re.search(r"hook=CanUpdateMachineSet .* decision=in-place .*affects_availability=false", new), new


def test_a_pdb_that_blocks_the_drain_fails_the_update_and_leaves_the_node_uncordoned(
    kube_extension: KubeExtension, host: Host
) -> None:
    worker = create_worker(kube_extension, host, "ka-pdb")
    workloads = f"{worker.namespace}-pods"
    objects.create_pod(worker.kube, workloads, "guarded", worker.node, labels={"app": "guarded"})
    objects.apply(
        worker.kube,
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": "guarded", "namespace": workloads},
            "spec": {"maxUnavailable": 0, "selector": {"matchLabels": {"app": "guarded"}}},
        },
    )
    observed = lambda pdb: pdb.get("status", {}).get("observedGeneration") == 1  # noqa: E731
    objects.wait_for(worker.kube, "pdb", "guarded", workloads, observed, "observed")
    worker.change(kubelet_args(("max-pods", "130")))
    message = (
        f"drain: timed out after {DRAIN_SECONDS}s with 1 pod left on Node {worker.node}; "
        f"evictions refused by a PodDisruptionBudget: {workloads}/guarded"
    )
    wait(lambda: message in worker.events().get("Failed", []), 120, "the drain Failure", worker.explain)
    node = worker.node_obj()
    assert not node["spec"].get("unschedulable") and CORDONED_BY not in node["metadata"].get(
        "annotations", {}
    )
    assert not worker.updated_in_place()
    assert objects.get(worker.kube, "pod", "guarded", workloads) is not None


def test_a_node_that_stays_not_ready_fails_the_health_gate_and_the_rollout_stops(
    kube_extension: KubeExtension, host: Host
) -> None:
    worker = create_worker(kube_extension, host, "ka-gate", kwok=False)
    worker.change({"format": "cloud-config", "users": [{"name": "kagate", "sshAuthorizedKeys": []}]})
    message = (
        f"health gate: the Node was not Ready with kubelet {START_VERSION} "
        f"within {GATE_SECONDS}s after the update"
    )
    wait(lambda: message in worker.events().get("Failed", []), 180, "the health gate Failure", worker.explain)
    assert not worker.updated_in_place()
    assert co.condition_status(worker.machine_obj(), "UpToDate") != "True"


def test_a_service_killed_while_the_node_is_cordoned_uncordons_it_once_and_completes(
    kube_extension: KubeExtension, host: Host
) -> None:
    worker = create_worker(kube_extension, host, "ka-kill")
    workloads = f"{worker.namespace}-pods"
    objects.create_pod(worker.kube, workloads, "guarded", worker.node, labels={"app": "guarded"})
    objects.apply(
        worker.kube,
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": "guarded", "namespace": workloads},
            "spec": {"maxUnavailable": 0, "selector": {"matchLabels": {"app": "guarded"}}},
        },
    )
    observed = lambda pdb: pdb.get("status", {}).get("observedGeneration") == 1  # noqa: E731
    objects.wait_for(worker.kube, "pdb", "guarded", workloads, observed, "observed")
    worker.change(kubelet_args(("max-pods", "140")))
    # the PDB holds the drain: kill the service as soon as the Node is cordoned (well inside the timeout)
    wait(
        lambda: bool(worker.node_obj()["spec"].get("unschedulable")), 120, "the Node cordoned", worker.explain
    )
    kube_extension.kill()
    assert worker.node_obj()["metadata"]["annotations"][CORDONED_BY] == f"{worker.namespace}/{worker.machine}"
    worker.kube.kubectl("delete", "pdb", "guarded", "-n", workloads)
    kube_extension.start()
    wait(worker.updated_in_place, 240, "the Machine updated in place after the restart", worker.explain)
    node = worker.node_obj()
    assert not node["spec"].get("unschedulable") and CORDONED_BY not in node["metadata"].get(
        "annotations", {}
    )
    uncordons = [
        line
        for line in kube_extension.log().splitlines()
        if f"machine={worker.namespace}/" in line and " uncordoned" in line
    ]
    assert len(uncordons) == 1, uncordons
    wait(lambda: "Done" in worker.events(), 30, "the Done Event", worker.explain)
    assert worker.events()["Uncordoned"] == [f"uncordoned Node {worker.node}"]
