"""What the Kubernetes-aware CAPI lab tests share: the service started with ``--kubeconfig`` and
registered with CAPI (:func:`serving`, one per test module, each with its own ExtensionConfig and
namespace label), one in-memory cluster per test whose MachineDeployment Machine is mapped to a lab host
and a kwok Node (:class:`Worker`), or whose MachineDeployment of three is mapped to the three lab hosts
(:class:`Fleet`), a PDB-guarded Pod, the run attempts on disk, and a :class:`Sampler` that watches cordon
and skip-remediation while a rollout runs. The tests are in ``test_capi_kube_aware.py`` and
``test_capi_operator_checks.py``.
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import ssl
import subprocess
import tempfile
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml
from e2e.conftest import START_VERSION
from e2e.service import START_TIMEOUT
from hostlab.inventory import defaults_only_inventory, service_inventory
from hostlab.lab import Host
from hostlab.lab import Lab as HostLab
from hostlab.proc import stop_child
from kubelab import objects, reads
from kubelab.flavours import capi_objects as co
from kubelab.lab import Lab

from inplace_extension.plays.ssh import close_control_masters

from .conftest import registered, serve_argv, unique_namespace
from .rollout import wait

MACHINES = "machines.cluster.x-k8s.io"
DEV_MACHINES = "devmachines.infrastructure.cluster.x-k8s.io"
MD = "machinedeployments.cluster.x-k8s.io"
SKIP_REMEDIATION = "cluster.x-k8s.io/skip-remediation"
SKIP_REMEDIATION_BY = "inplace-extension.io/skip-remediation-by"  # ours, beside it while we hold it
CORDONED_BY = "inplace-extension.io/cordoned-by"
GATE_SECONDS = 15
DRAIN_SECONDS = 8
SERVING_RE = re.compile(r"serving https://127\.0\.0\.1:(\d+)")


@dataclass
class KubeExtension:
    kube: Lab
    hosts: HostLab
    inventory: Path
    runs_dir: Path
    log_path: Path
    argv: list[str]
    selector: dict[str, str]  # the label of the namespaces its ExtensionConfig serves
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
            START_TIMEOUT,
            "serving",
        )
        assert proc.poll() is None, self.log()

    def kill(self) -> None:
        """SIGKILL, by PID, the service this fixture started (as an OOM kill would)."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None:
            stop_child(self.proc, 20)  # by PID: the service this fixture started

    def serve_host(self, host: Host) -> None:
        """Only inventory defaults (SSH user, key, this host's key): the address comes from the Machine."""
        self.inventory.write_text(yaml.safe_dump(defaults_only_inventory(self.hosts, host)))

    @property
    def url(self) -> str:
        match = SERVING_RE.search(self.log())
        assert match is not None, self.log()
        return f"https://127.0.0.1:{match.group(1)}"

    def metrics(self) -> str:
        """The service's ``/metrics`` page, over TLS trusted through the lab CA."""
        verify = ssl.create_default_context(cafile=str(self.kube.ca))
        with httpx.Client(base_url=self.url, timeout=15, verify=verify) as client:
            return client.get("/metrics").raise_for_status().text


@contextmanager
def serving(
    kube: Lab,
    hosts: HostLab,
    name: str,
    selector: Mapping[str, str],
    capabilities: Path,
    log_path: Path,
    extra_argv: Sequence[str] = (),
    workload_kubeconfig: str = "management",
) -> Iterator[KubeExtension]:
    """``serve --kubeconfig ... --workload-kubeconfig management`` (TLS from the lab's PKI, an empty
    inventory, ``--retry-after-seconds 1``) with ``capabilities`` and ``extra_argv``, registered with CAPI
    through the ExtensionConfig ``name`` for the namespaces labelled ``selector``; stopped and deregistered
    afterwards. ``name`` is also the serving certificate's file name in the PKI: one per test module, so
    modules running at once on other workers never share either. ``workload_kubeconfig`` ``secret``
    reaches a real workload cluster through the kubeconfig Secret CAPI writes (test_capi_workload.py)."""
    # short: ssh's ControlPath socket lives under the runs dir (108-byte limit for socket paths)
    work = Path(tempfile.mkdtemp(prefix="ka-"))
    inventory = work / "inventory.yaml"
    inventory.write_text("hosts: []\n")
    argv = [
        *serve_argv(kube, name, inventory, hosts.network, work / "runs", capabilities),
        "--kubeconfig",
        str(kube.kubeconfig),
        "--workload-kubeconfig",
        workload_kubeconfig,
        *extra_argv,
    ]
    ext = KubeExtension(kube, hosts, inventory, work / "runs", log_path, argv, dict(selector))
    try:
        ext.start()
        with registered(kube, ext.url, name, ext.selector):
            yield ext
    finally:
        ext.stop()
        close_control_masters(work / "runs")
        shutil.rmtree(work, ignore_errors=True)


def run_attempts(ext: KubeExtension, machine: str) -> list[dict[str, Any]]:
    """The Machine's run attempts on disk (``meta.json``, with ``outcome`` once the attempt ended)."""
    found = []
    for meta_path in sorted(ext.runs_dir.glob("*/attempt-*/meta.json")):
        meta = json.loads(meta_path.read_text())
        if meta.get("machine") == machine:
            outcome = meta_path.with_name("outcome.json")
            meta["outcome"] = json.loads(outcome.read_text())["kind"] if outcome.exists() else None
            found.append(meta)
    return found


def drained_at_drain_point(ext: KubeExtension, machine: str) -> bool:
    """The service told one of the Machine's plays at its drain point that the drain is over
    (``drain.json`` beside the attempt's ``meta.json``, ``drained`` true): its play goes on over SSH alone."""
    for meta_path in ext.runs_dir.glob("*/attempt-*/meta.json"):
        told = meta_path.with_name("drain.json")
        ours = json.loads(meta_path.read_text()).get("machine") == machine
        if ours and told.exists() and json.loads(told.read_text()).get("drained") is True:
            return True
    return False


class TemplateChanges:
    """The MachineDeployment ``<cluster>-md-0`` of a test's in-memory cluster and the bootstrap templates
    the test gives it: each :meth:`change` is a new KubeadmConfigTemplate ``<md>-<generation>`` the
    MachineDeployment then points at (CAPI asks CanUpdateMachineSet and rolls it out in place). Shared by
    the dataclasses of one worker, a fleet and a rollout of 3, which declare these attributes."""

    ext: KubeExtension
    namespace: str
    cluster: str
    generation: int

    @property
    def kube(self) -> Lab:
        return self.ext.kube

    @property
    def md(self) -> str:
        return f"{self.cluster}-md-0"

    @property
    def template(self) -> str:
        """The KubeadmConfigTemplate of the latest :meth:`change`."""
        return f"{self.md}-{self.generation}"

    def change(self, spec: dict[str, Any]) -> None:
        self.generation += 1
        objects.apply(self.kube, co.kubeadm_config_template(self.template, self.namespace, spec))
        body = {"spec": {"template": {"spec": {"bootstrap": {"configRef": {"name": self.template}}}}}}
        self.kube.kubectl("patch", MD, self.md, "-n", self.namespace, "--type=merge", "-p", json.dumps(body))


@dataclass
class Worker(TemplateChanges):
    """One in-memory cluster with one MachineDeployment Machine mapped to a lab host and a kwok Node."""

    ext: KubeExtension
    namespace: str
    cluster: str
    machine: str
    uid: str
    node: str
    generation: int = 1

    def machine_obj(self) -> dict[str, Any]:
        found = objects.get(self.kube, MACHINES, self.machine, self.namespace)
        assert found is not None
        return found

    def node_obj(self) -> dict[str, Any]:
        found = objects.get(self.kube, "node", self.node)
        assert found is not None
        return found

    def updated_in_place(self) -> bool:
        """CAPI moved the Machine (same UID) to the MachineSet of the latest template and it is UpToDate."""
        if not co.owned_by_template(self.kube, self.namespace, self.md, self.template):
            return False
        machines = co.machines(self.kube, self.namespace, deployment=self.md)
        return (
            len(machines) == 1
            and machines[0]["metadata"]["uid"] == self.uid
            and co.condition_status(machines[0], "UpToDate") == "True"
            and co.condition_status(machines[0], "Updating") != "True"
        )

    def events(self) -> dict[str, list[str]]:
        found: dict[str, list[str]] = {}
        for event in reads.list_objects(self.kube, "events", self.namespace):
            if event["involvedObject"].get("uid") == self.uid:
                found.setdefault(event["reason"], []).append(event["message"])
        return found

    def explain(self) -> str:
        return co.conditions_text(co.machines(self.kube, self.namespace)) + f"\nevents {self.events()}"


@dataclass
class Fleet(TemplateChanges):
    """One in-memory cluster whose MachineDeployment of several Machines is mapped to lab hosts (by
    Machine name, through the inventory) and kwok Nodes: a rollout CAPI does one Machine at a time."""

    ext: KubeExtension
    namespace: str
    cluster: str
    uids: dict[str, str]  # Machine name -> UID (an in-place update keeps it)
    nodes: dict[str, str]  # Machine name -> Node name
    hosts: dict[str, Host]  # Machine name -> lab host
    generation: int = 1

    def machine_objs(self) -> list[dict[str, Any]]:
        return co.machines(self.kube, self.namespace, deployment=self.md)

    def node_objs(self) -> dict[str, dict[str, Any]]:
        """Machine name -> its Node as the API server has it now."""
        return {m: objects.get(self.kube, "node", n) or {} for m, n in self.nodes.items()}

    def rolled_out(self) -> bool:
        """CAPI moved every Machine (same UIDs) to the latest template's MachineSet, all UpToDate."""
        if not co.owned_by_template(self.kube, self.namespace, self.md, self.template):
            return False
        machines = self.machine_objs()
        deployment = objects.get(self.kube, MD, self.md, self.namespace) or {}
        return (
            {m["metadata"]["name"]: m["metadata"]["uid"] for m in machines} == self.uids
            and all(
                co.condition_status(m, "UpToDate") == "True" and co.condition_status(m, "Updating") != "True"
                for m in machines
            )
            and deployment.get("status", {}).get("upToDateReplicas") == len(self.uids)
        )

    def explain(self) -> str:
        return co.conditions_text(co.machines(self.kube, self.namespace))


def create_fleet(ext: KubeExtension, hosts: list[Host], prefix: str) -> Fleet:
    """A MachineDeployment of ``len(hosts)`` Machines, each with a kwok Node and one Pod on it, mapped to
    the hosts in name order through an inventory of host entries (address and pinned host key)."""
    namespace, machines = create_md_cluster(ext, prefix, len(hosts))
    names = [m["metadata"]["name"] for m in machines]
    ext.inventory.write_text(yaml.safe_dump(service_inventory(ext.hosts, names), sort_keys=False))
    fleet = Fleet(
        ext,
        namespace,
        prefix,
        {m["metadata"]["name"]: m["metadata"]["uid"] for m in machines},
        {
            m["metadata"]["name"]: _attach(ext.kube, namespace, m, h)
            for m, h in zip(machines, hosts, strict=True)
        },
        dict(zip(names, hosts, strict=True)),
    )
    for machine, node in fleet.nodes.items():  # a workload for each drain
        objects.create_pod(ext.kube, f"{namespace}-pods", f"app-{machine}", node)
    return fleet


def create_worker(ext: KubeExtension, host: Host, prefix: str, kwok: bool = True) -> Worker:
    namespace, machines = create_md_cluster(ext, prefix, 1)
    machine = machines[0]
    node = _attach(ext.kube, namespace, machine, host, kwok)
    return Worker(ext, namespace, prefix, machine["metadata"]["name"], machine["metadata"]["uid"], node)


def create_md_cluster(ext: KubeExtension, prefix: str, replicas: int) -> tuple[str, list[dict[str, Any]]]:
    """A fresh namespace (our ExtensionConfig's label) with an in-memory cluster: one control plane
    Machine and a MachineDeployment of ``replicas`` (maxSurge 0, maxUnavailable 1); waits until every
    Machine is Running and returns the namespace and the MachineDeployment's Machines."""
    namespace = unique_namespace(prefix)
    objects.apply(
        ext.kube,
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace, "labels": ext.selector}},
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
        co.machine_deployment(md, namespace, cluster, replicas, START_VERSION, f"{md}-1", md),
    )

    def running() -> bool:
        machines = co.machines(kube, namespace)
        return len(machines) == 1 + replicas and all(co.running(m) for m in machines)

    wait(
        running,
        180,
        f"{1 + replicas} Machines Running in {namespace}",
        lambda: co.conditions_text(co.machines(kube, namespace)),
    )
    return namespace, sorted(co.machines(kube, namespace, deployment=md), key=lambda m: m["metadata"]["name"])


def _attach(kube: Lab, namespace: str, machine: dict[str, Any], host: Host, kwok: bool = True) -> str:
    """Give the Machine the lab host's address and a Node in the kubelab named as its nodeRef (kwok keeps
    it Ready, or with ``kwok=False`` nothing does); returns the Node's name."""
    name, node = str(machine["metadata"]["name"]), str(machine["status"]["nodeRef"]["name"])
    # the in-memory DevMachine has no address: give it the lab host's, as a real provider reports its VM's;
    # CAPI's Machine controller copies it into Machine.status.addresses
    dev = machine["spec"]["infrastructureRef"]["name"]
    addresses = {"status": {"addresses": [{"type": "InternalIP", "address": host.address}]}}
    kube.kubectl(
        "patch",
        DEV_MACHINES,
        dev,
        "-n",
        namespace,
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps(addresses),
    )

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
    return node


def guarded_pod(worker: Worker) -> str:
    """A Pod "guarded" on the worker's Node with a PodDisruptionBudget that refuses every eviction
    (observed by the disruption controller); returns the Pod's namespace."""
    workloads = f"{worker.namespace}-pods"
    objects.create_pod(worker.kube, workloads, "guarded", worker.node, labels={"app": "guarded"})
    objects.create_pdb(worker.kube, workloads, "guarded")
    return workloads


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
