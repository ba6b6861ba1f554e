"""The lab provider's controller: LabClusters and LabMachines reconciled as the CAPI v1beta2 contracts ask,
the LabMachines onto a pool of the lab's real nodes (hostlab nodes), one process, polling the API server.

A LabMachine, once its owner Machine (``ownerReferences``, set by CAPI's Machine controller) names a
bootstrap data Secret and its Cluster's infrastructure is provisioned: the controller renders and reads
the cloud-config (:mod:`kubelab.labprovider.cloudconfig`; bad data is the condition
``Ready=False, BootstrapDataInvalid`` and holds no node), takes a free node of the pool (recorded in
``status.nodeName`` before anything runs on it), carries the bootstrap out over SSH
(:mod:`kubelab.labprovider.remote`, in a worker thread per node; over the machine image ``spec.image``
names, when it names one), checks CABPK's success sentinel, then
sets ``spec.providerID`` (``lab://<node name>``), ``status.addresses`` (the node's Hostname and
InternalIP) and ``status.initialization.provisioned``. A bootstrap that fails is a terminal failure
(``Ready=False, BootstrapFailed`` with the end of the failed command's output): the node keeps what it
did until the LabMachine is deleted. Deleting a LabMachine (the finalizer :data:`FINALIZER`) resets its
node (``kubeadm reset``, CABPK's files removed) and returns it to the pool; a reset that fails keeps the
finalizer and is tried again. A node claimed but not provisioned when the controller (re)starts was
left by an earlier run mid-bootstrap: it is reset before its bootstrap runs again.

A LabCluster with an owner Cluster and a ``spec.controlPlaneEndpoint`` is provisioned (the endpoint is
given, as for k0smotron's RemoteCluster: the lab makes no load balancer). Objects of a paused Cluster
(``spec.paused``) or with the ``cluster.x-k8s.io/paused`` annotation are left alone. With ``--namespace``
the controller reconciles that namespace's objects only: controllers of different pools then share one
API server (the CAPI lab's, which test modules on several workers use at once).
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
from hostlab.errors import LabError
from hostlab.lab import Host
from hostlab.lab import Lab as HostLab

from kubelab.lab import Lab as KubeLab
from kubelab.labprovider import cloudconfig, crds, remote

FINALIZER = "labmachine.infrastructure.lab.inplace-extension.dev"
PAUSED = "cluster.x-k8s.io/paused"
PROVIDER_ID_PREFIX = "lab://"
INTERVAL = 1.0  # seconds between passes; a lab's handful of objects is listed in milliseconds
RESET_RETRY = 10.0  # seconds before a failed reset is tried again
BASE = f"/apis/{crds.API_VERSION}"
Log = Callable[[str], None]


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def log(message: str) -> None:
    print(f"{_now()} {message}", flush=True)


class Api:
    """The few API calls the controller makes (JSON over the lab's admin client)."""

    def __init__(self, client: httpx.Client) -> None:
        self.client = client

    def get(self, path: str) -> dict[str, Any] | None:
        response = self.client.get(path)
        if response.status_code == 404:
            return None
        response.raise_for_status()
        result: dict[str, Any] = response.json()
        return result

    def items(self, path: str) -> list[dict[str, Any]]:
        found = self.get(path)
        return list(found.get("items", [])) if found else []

    def patch(self, path: str, body: Mapping[str, Any], status: bool = False) -> None:
        headers = {"Content-Type": "application/merge-patch+json"}
        response = self.client.patch(path + ("/status" if status else ""), json=body, headers=headers)
        if response.status_code != 404:  # gone meanwhile: nothing left to patch
            response.raise_for_status()


def _path(obj: Mapping[str, Any], plural: str) -> str:
    meta = obj["metadata"]
    return f"{BASE}/namespaces/{meta['namespace']}/{plural}/{meta['name']}"


def _key(obj: Mapping[str, Any]) -> str:
    return f"{obj['metadata']['namespace']}/{obj['metadata']['name']}"


def _owner(obj: Mapping[str, Any], kind: str) -> str | None:
    for ref in obj["metadata"].get("ownerReferences", []):
        if ref.get("kind") == kind and str(ref.get("apiVersion", "")).startswith("cluster.x-k8s.io/"):
            return str(ref["name"])
    return None


def _ready(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    conditions = obj.get("status", {}).get("conditions", [])
    return next((c for c in conditions if c.get("type") == "Ready"), {})


def _condition(obj: Mapping[str, Any], status: bool, reason: str, message: str) -> dict[str, Any] | None:
    """The Ready condition to write, or None when the object already says exactly that."""
    text = "True" if status else "False"
    current = _ready(obj)
    generation = obj["metadata"].get("generation", 1)
    if (current.get("status"), current.get("reason"), current.get("message")) == (text, reason, message) and (
        current.get("observedGeneration") == generation
    ):
        return None
    changed = current.get("status") != text
    return {
        "type": "Ready",
        "status": text,
        "reason": reason,
        "message": message,
        "observedGeneration": generation,
        "lastTransitionTime": _now() if changed or not current else current.get("lastTransitionTime", _now()),
    }


def _guarded(work: Callable[..., remote.Outcome], *args: Any) -> remote.Outcome:
    """``work`` in a worker thread: an exception is a failed outcome with its message, never a lost thread."""
    try:
        return work(*args)
    except (OSError, LabError, ValueError) as exc:
        return remote.Outcome(False, False, f"{type(exc).__name__}: {exc}")


class Provider:
    def __init__(
        self, api: Api, pool_lab: HostLab, pool: list[str], log: Log = log, namespace: str | None = None
    ) -> None:
        self.api = api
        # the one namespace whose objects this controller owns (None: all), so that controllers of
        # different pools share one API server without taking each other's LabMachines
        self.namespace = namespace
        self.pool_lab = pool_lab
        self.pool = pool
        self.log = log
        self.workers = ThreadPoolExecutor(max_workers=max(1, len(pool)), thread_name_prefix="node")
        # by LabMachine uid: the provisioning or reset in flight on its node ("provision" or "reset")
        self.jobs: dict[str, tuple[str, Future[remote.Outcome]]] = {}
        self.started_here: set[str] = set()  # LabMachine uids whose bootstrap this process started
        self.reset_failed_at: dict[str, float] = {}

    # -- one pass ----------------------------------------------------------------------------------
    def listing(self, plural: str) -> str:
        """The list path of ``plural``: in :attr:`namespace` only when one is set."""
        scope = f"/namespaces/{self.namespace}" if self.namespace else ""
        return f"{BASE}{scope}/{plural}"

    def reconcile(self) -> None:
        for cluster in self.api.items(self.listing("labclusters")):
            self.reconcile_cluster(cluster)
        machines = self.api.items(self.listing("labmachines"))
        for machine in machines:
            self.reconcile_machine(machine, machines)

    def set_ready(self, obj: dict[str, Any], plural: str, status: bool, reason: str, message: str) -> None:
        condition = _condition(obj, status, reason, message)
        if condition is None:
            return
        others = [c for c in obj.get("status", {}).get("conditions", []) if c.get("type") != "Ready"]
        self.api.patch(_path(obj, plural), {"status": {"conditions": [*others, condition]}}, status=True)
        self.log(f"{plural} {_key(obj)}: Ready={condition['status']} {reason}: {message}")

    def paused(self, obj: Mapping[str, Any], cluster: Mapping[str, Any] | None) -> bool:
        if PAUSED in obj["metadata"].get("annotations", {}):
            return True
        return bool(cluster and cluster.get("spec", {}).get("paused"))

    def capi(self, namespace: str, plural: str, name: str) -> dict[str, Any] | None:
        return self.api.get(f"/apis/cluster.x-k8s.io/v1beta2/namespaces/{namespace}/{plural}/{name}")

    # -- LabCluster --------------------------------------------------------------------------------
    def reconcile_cluster(self, lab_cluster: dict[str, Any]) -> None:
        if lab_cluster["metadata"].get("deletionTimestamp"):
            return
        owner = _owner(lab_cluster, "Cluster")
        if owner is None:
            self.set_ready(lab_cluster, "labclusters", False, "WaitingForCluster", "no owner Cluster yet")
            return
        cluster = self.capi(lab_cluster["metadata"]["namespace"], "clusters", owner)
        if self.paused(lab_cluster, cluster):
            return
        endpoint = lab_cluster.get("spec", {}).get("controlPlaneEndpoint", {})
        if not endpoint.get("host") or not endpoint.get("port"):
            message = "spec.controlPlaneEndpoint (host and port) is not set"
            self.set_ready(lab_cluster, "labclusters", False, "WaitingForControlPlaneEndpoint", message)
            return
        if not lab_cluster.get("status", {}).get("initialization", {}).get("provisioned"):
            body = {"status": {"initialization": {"provisioned": True}}}
            self.api.patch(_path(lab_cluster, "labclusters"), body, status=True)
        self.set_ready(lab_cluster, "labclusters", True, "Provisioned", "")

    # -- LabMachine --------------------------------------------------------------------------------
    def reconcile_machine(self, lab_machine: dict[str, Any], all_machines: list[dict[str, Any]]) -> None:
        meta = lab_machine["metadata"]
        uid = meta["uid"]
        kind, job = self.jobs.get(uid, ("", None))
        if job is not None and not job.done():
            return  # its node is busy: provisioning or resetting
        if meta.get("deletionTimestamp"):
            if kind == "provision":
                self.jobs.pop(uid)  # deleted while it was provisioned: its node is reset all the same
            self.delete_machine(lab_machine)
            return
        if job is not None:
            self.jobs.pop(uid)
            self.provisioned(lab_machine, job.result())
            return
        status = lab_machine.get("status", {})
        if (
            status.get("initialization", {}).get("provisioned")
            or _ready(lab_machine).get("reason") == "BootstrapFailed"
        ):
            return  # done, or a terminal failure: only a delete changes it
        if FINALIZER not in meta.get("finalizers", []):
            self.api.patch(
                _path(lab_machine, "labmachines"),
                {"metadata": {"finalizers": [*meta.get("finalizers", []), FINALIZER]}},
            )
            return  # seen again with the finalizer on the next pass
        self.provision_machine(lab_machine, all_machines)

    def provision_machine(self, lab_machine: dict[str, Any], all_machines: list[dict[str, Any]]) -> None:
        namespace, uid = lab_machine["metadata"]["namespace"], lab_machine["metadata"]["uid"]

        def waiting(reason: str, message: str) -> None:
            self.set_ready(lab_machine, "labmachines", False, reason, message)

        machine_name = _owner(lab_machine, "Machine")
        machine = self.capi(namespace, "machines", machine_name) if machine_name else None
        if machine is None:
            waiting("WaitingForMachine", "no owner Machine yet")
            return
        cluster = self.capi(namespace, "clusters", machine["spec"]["clusterName"])
        if self.paused(lab_machine, cluster):
            return
        if not (cluster or {}).get("status", {}).get("initialization", {}).get("infrastructureProvisioned"):
            waiting(
                "WaitingForClusterInfrastructure",
                f"Cluster {machine['spec']['clusterName']} has no provisioned infrastructure yet",
            )
            return
        secret_name = machine["spec"].get("bootstrap", {}).get("dataSecretName")
        secret = (
            self.api.get(f"/api/v1/namespaces/{namespace}/secrets/{secret_name}") if secret_name else None
        )
        if secret is None:
            what = (
                f"Secret {secret_name} not found"
                if secret_name
                else "the Machine names no bootstrap data Secret yet"
            )
            waiting("WaitingForBootstrapData", what)
            return
        node = lab_machine.get("status", {}).get("nodeName") or self.free_node(all_machines)
        try:  # before a node is taken: bad data holds none (read for the first node when none is free)
            rendered_for = self.pool_lab.host(node or self.pool[0])
            bootstrap = cloudconfig.parse(
                cloudconfig.secret_document(secret), rendered_for.name, rendered_for.address
            )
        except cloudconfig.BootstrapDataError as exc:
            waiting("BootstrapDataInvalid", f"bootstrap data Secret {secret_name}: {exc}")
            return
        if node is None:
            waiting("WaitingForNode", f"every node of the pool ({', '.join(self.pool)}) is taken")
            return
        host = self.pool_lab.host(node)
        earlier = bool(lab_machine.get("status", {}).get("nodeName")) and uid not in self.started_here
        if not lab_machine.get("status", {}).get("nodeName"):
            # the claim is in the cluster before anything runs on the node: a restarted controller sees it
            self.api.patch(_path(lab_machine, "labmachines"), {"status": {"nodeName": node}}, status=True)
            lab_machine.setdefault("status", {})["nodeName"] = node
        self.started_here.add(uid)
        for line in cloudconfig.describe(bootstrap):
            self.log(f"labmachines {_key(lab_machine)} on {node}: {line}")
        image = lab_machine.get("spec", {}).get("image")
        self.jobs[uid] = (
            "provision",
            self.workers.submit(_guarded, self.bootstrap_node, host, bootstrap, image, earlier),
        )
        waiting("Provisioning", f"carrying out the bootstrap data on node {node}")

    def bootstrap_node(
        self, host: Host, bootstrap: cloudconfig.Bootstrap, image: str | None, reset_first: bool
    ) -> remote.Outcome:
        if reset_first:  # an earlier controller left this node mid-bootstrap
            self.log(
                f"node {host.name}: claimed by an earlier run of the controller, reset before its bootstrap"
            )
            outcome = remote.reset(self.pool_lab, host)
            if not outcome.ok:
                return outcome
        return remote.provision(self.pool_lab, host, bootstrap, image)

    def provisioned(self, lab_machine: dict[str, Any], outcome: remote.Outcome) -> None:
        node = lab_machine["status"]["nodeName"]
        if not (outcome.ok and outcome.sentinel):
            self.set_ready(
                lab_machine, "labmachines", False, "BootstrapFailed", f"node {node}: {outcome.message}"
            )
            return
        host = self.pool_lab.host(node)
        path = _path(lab_machine, "labmachines")
        self.api.patch(path, {"spec": {"providerID": f"{PROVIDER_ID_PREFIX}{node}"}})
        addresses = [{"type": "Hostname", "address": node}, {"type": "InternalIP", "address": host.address}]
        self.api.patch(
            path, {"status": {"addresses": addresses, "initialization": {"provisioned": True}}}, status=True
        )
        self.set_ready(lab_machine, "labmachines", True, "Provisioned", f"node {node}")

    def free_node(self, all_machines: list[dict[str, Any]]) -> str | None:
        taken = {m.get("status", {}).get("nodeName") for m in all_machines}
        return next((n for n in self.pool if n not in taken), None)

    def delete_machine(self, lab_machine: dict[str, Any]) -> None:
        meta, uid = lab_machine["metadata"], lab_machine["metadata"]["uid"]
        if FINALIZER not in meta.get("finalizers", []):
            return
        node = lab_machine.get("status", {}).get("nodeName")
        _, job = self.jobs.pop(uid, ("", None))
        if node and job is None:
            if time.monotonic() - self.reset_failed_at.get(uid, -RESET_RETRY) < RESET_RETRY:
                return
            self.set_ready(lab_machine, "labmachines", False, "Deleting", f"resetting node {node}")
            self.jobs[uid] = (
                "reset",
                self.workers.submit(_guarded, remote.reset, self.pool_lab, self.pool_lab.host(node)),
            )
            return
        if node and job is not None:
            outcome = job.result()
            if not outcome.ok:
                self.reset_failed_at[uid] = time.monotonic()
                self.set_ready(
                    lab_machine, "labmachines", False, "ResetFailed", f"node {node}: {outcome.message}"
                )
                return
            self.log(f"labmachines {_key(lab_machine)}: node {node} reset, back in the pool")
        finalizers = [f for f in meta["finalizers"] if f != FINALIZER]
        # the precondition: a finalizer list changed meanwhile is not overwritten
        body = {"metadata": {"finalizers": finalizers, "resourceVersion": meta["resourceVersion"]}}
        self.api.patch(_path(lab_machine, "labmachines"), body)
        self.started_here.discard(uid)
        self.reset_failed_at.pop(uid, None)

    def stop(self) -> None:
        remote.stop_all()
        self.workers.shutdown(wait=True, cancel_futures=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kubelab.labprovider", description=__doc__.split("\n")[0])
    parser.add_argument("--kubelab", required=True, help="the kubelab whose API server holds the objects")
    parser.add_argument("--hostlab", required=True, help="the hostlab lab of the pool's nodes")
    parser.add_argument("--nodes", required=True, help="the pool: node names of that lab, comma-separated")
    parser.add_argument("--ready-file", type=Path, required=True, help="written after the first pass")
    parser.add_argument("--namespace", help="reconcile the objects of this namespace only (default: all)")
    args = parser.parse_args(argv)
    try:
        pool_lab = HostLab(args.hostlab)
        pool = [pool_lab.host(n).name for n in args.nodes.split(",") if n]
        kube = KubeLab(args.kubelab)
        client = kube.http()
    except LabError as exc:
        print(f"lab provider: {exc}", file=sys.stderr)
        return 2
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    provider = Provider(Api(client), pool_lab, pool, namespace=args.namespace)
    scope = f"namespace {args.namespace}" if args.namespace else "every namespace"
    log(f"lab provider: pool {', '.join(pool)} of hostlab {args.hostlab}, API server {kube.server}, {scope}")
    try:
        while not stopping.is_set():
            try:
                provider.reconcile()
            # the API server restarting, a conflict, a node's lab gone: the next pass tries again
            except (httpx.HTTPError, LabError) as exc:
                log(f"lab provider: pass failed, trying again: {exc}")
            args.ready_file.touch()
            stopping.wait(INTERVAL)
    finally:
        log("lab provider: stopping")
        provider.stop()
        client.close()
    return 0
