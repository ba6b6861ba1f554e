"""The lab's infrastructure provider on real nodes (issue #27 item 1), on its own: no CAPI controller runs.

A pool of two hostlab nodes (systemd booted by systemd-nspawn, reached over SSH) and the provider's
controller, started as a component of the session's kubelab. The CAPI objects the provider reads are
written by the test as CAPI's controllers leave them: a v1beta2 Cluster (its
``status.initialization.infrastructureProvisioned`` set through the status subresource, as the Cluster
controller does once the LabCluster is provisioned) and Machines owning their LabMachines (the
``ownerReferences`` CAPI's Machine controller sets). The bootstrap data Secrets are written in CABPK's
exact format by the test (:mod:`labprovider.cabpk`), not made by the real CABPK. In the first test their
kubeadm command is a stand-in (``test -s`` of the join configuration CABPK wrote); in the second it is
CABPK's own ``kubeadm join --config /run/kubeadm/kubeadm-join-config.yaml``: the real kubeadm joins the
node to the session's kubelab (flavour ``nodes``) and the delete runs the real ``kubeadm reset``.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Iterator
from typing import Any

import pytest
from hostlab.lab import Host
from hostlab.lab import Lab as HostLab
from hostlab.proc import wait_until
from hostlab.pytest_plugin import nodes_lab
from kubelab import labprovider, manifests, node_join, objects
from kubelab.config import APISERVER_NAME
from kubelab.flavours import capi_objects as co
from kubelab.flavours import nodes
from kubelab.lab import Lab as KubeLab
from kubelab.labprovider import crds, node_program
from kubelab.labprovider.controller import FINALIZER

from .cabpk import BASE64, GZIPPED, KEY, USERS_AND_NTP, join_configuration, secret, worker_document
from .pool import LAB_MACHINE, WAIT, LabMachines, clean, provider_running, ready, stat

pytestmark = [pytest.mark.lab, pytest.mark.kube]

NAMESPACE = f"lab-provider-{os.getpid()}"
CLUSTER = "c1"
STAND_IN_KUBEADM = "test -s /run/kubeadm/kubeadm-join-config.yaml"  # the join configuration was written first
KUBEADM_JOIN = "kubeadm join --config /run/kubeadm/kubeadm-join-config.yaml "  # CABPK's, no verbosity set
JOIN_WAIT = 300.0  # kubeadm join and the kubelet's first Ready on 2 shared cores
IMAGE = "v0.0.1"  # the first test's machine image (stand-in binaries: _stage_image)
TIMESYNCD_DROPIN = str(node_program.TIMESYNCD_DROPIN)


@pytest.fixture(scope="module")
def pool() -> Iterator[HostLab]:
    with nodes_lab("pool") as lab:
        yield lab


@pytest.fixture(scope="module")
def machines(kubelab: KubeLab, pool: HostLab) -> Iterator[LabMachines]:
    files = [manifests.capi_crd(kubelab, f"cluster.x-k8s.io_{p}.yaml") for p in ("clusters", "machines")]
    manifests.install_crds(kubelab, files, only_missing=True)
    with provider_running(kubelab, pool, NAMESPACE) as running:
        yield running
    kubelab.stop_component(f"apiserver-on-{pool.gateway}")  # the join test's forward, if it made one


def _owner(obj: dict[str, Any]) -> dict[str, Any]:
    meta = obj["metadata"]
    return {"apiVersion": obj["apiVersion"], "kind": obj["kind"], "name": meta["name"], "uid": meta["uid"]}


def _cluster(kube: KubeLab) -> None:
    """A Cluster whose infrastructure is a LabCluster; its provisioned infrastructure written to the Cluster
    as CAPI's Cluster controller bubbles it up once the LabCluster says so."""
    cluster = co.cluster(CLUSTER, NAMESPACE)
    cluster["spec"]["infrastructureRef"] = co.ref(crds.GROUP, "LabCluster", CLUSTER)
    objects.apply(kube, cluster)
    owner = _owner(objects.get(kube, "cluster.cluster.x-k8s.io", CLUSTER, NAMESPACE) or {})
    lab_cluster = {
        "apiVersion": crds.API_VERSION,
        "kind": "LabCluster",
        "metadata": {"name": CLUSTER, "namespace": NAMESPACE, "ownerReferences": [owner]},
        "spec": {"controlPlaneEndpoint": {"host": "kubelab-apiserver", "port": 6443}},
    }
    objects.apply(kube, lab_cluster)
    provisioned = lambda c: c.get("status", {}).get("initialization", {}).get("provisioned") is True  # noqa: E731
    objects.wait_for(kube, f"labcluster.{crds.GROUP}", CLUSTER, NAMESPACE, provisioned, "provisioned", WAIT)
    status = {"initialization": {"infrastructureProvisioned": True}}
    objects.set_status(kube, "cluster.cluster.x-k8s.io", CLUSTER, NAMESPACE, status)


def _machine(kube: KubeLab, name: str, document: str | None, image: str | None = None) -> None:
    """A Machine (bootstrap data Secret ``<name>-bootstrap``, written when ``document`` is given) owning the
    LabMachine ``name`` (of the machine image ``image``, when given)."""
    if document is not None:
        objects.apply(kube, secret(f"{name}-bootstrap", NAMESPACE, document, CLUSTER))
    machine = {
        "apiVersion": co.CORE_API,
        "kind": "Machine",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": {co.CLUSTER_LABEL: CLUSTER}},
        "spec": {
            "clusterName": CLUSTER,
            "bootstrap": {"dataSecretName": f"{name}-bootstrap"},
            "infrastructureRef": co.ref(crds.GROUP, "LabMachine", name),
        },
    }
    objects.apply(kube, machine)
    owner = _owner(objects.get(kube, "machine.cluster.x-k8s.io", name, NAMESPACE) or {})
    meta = {
        "name": name,
        "namespace": NAMESPACE,
        "labels": {co.CLUSTER_LABEL: CLUSTER},
        "ownerReferences": [owner],
    }
    spec = {"image": image} if image else {}
    objects.apply(
        kube, {"apiVersion": crds.API_VERSION, "kind": "LabMachine", "metadata": meta, "spec": spec}
    )


def _stage_image(pool: HostLab) -> None:
    """:data:`IMAGE` on every node: stand-in kubelet and kubeadm (scripts that print their name; ``kubeadm
    reset`` then does nothing), where the lab's pools carry real ones."""
    for host in pool.hosts():
        target = host.root() / node_program.IMAGES.relative_to("/") / IMAGE
        target.mkdir(parents=True, exist_ok=True)
        for binary in node_program.IMAGE_BINARIES:
            (target / binary.name).write_text(_stand_in(binary.name))
            (target / binary.name).chmod(0o755)


def _stand_in(name: str) -> str:
    return f"#!/bin/sh\necho stand-in {name} of image {IMAGE}\n"


def test_a_lab_machine_is_provisioned_on_a_pool_node_from_cabpk_data_and_its_delete_returns_the_node_reset(
    machines: LabMachines, pool: HostLab
) -> None:
    kube = machines.kube
    crd = objects.get(kube, "crd", f"labmachines.{crds.GROUP}") or {}
    assert crd["metadata"]["labels"]["cluster.x-k8s.io/v1beta2"] == crds.VERSION  # the contract label
    _cluster(kube)
    by_name = {h.name: h for h in pool.hosts()}

    # no bootstrap data yet: the LabMachine waits, holding no node
    _stage_image(pool)
    _machine(kube, "m1", None, image=IMAGE)
    waiting = machines.wait_reason("m1", "WaitingForBootstrapData")
    assert "Secret m1-bootstrap not found" in ready(waiting)["message"]
    assert "nodeName" not in waiting.get("status", {})
    document = worker_document(STAND_IN_KUBEADM, tail=USERS_AND_NTP)
    objects.apply(kube, secret("m1-bootstrap", NAMESPACE, document, CLUSTER))

    m1 = machines.wait_reason("m1", "Provisioned")
    node = m1["status"]["nodeName"]
    host = by_name[node]
    assert m1["spec"]["providerID"] == f"lab://{node}"
    assert m1["status"]["initialization"] == {"provisioned": True}
    assert m1["status"]["addresses"] == [
        {"type": "Hostname", "address": node},
        {"type": "InternalIP", "address": host.address},
    ]
    assert ready(m1)["status"] == "True"
    assert FINALIZER in m1["metadata"]["finalizers"]
    # the files, as cloud-init writes them: content decoded, mode and owner set, the jinja metadata rendered
    assert stat(pool, host, "/etc/lab-test/plain.conf") == "600 nobody:nogroup"
    assert pool.read_file(host, "/etc/lab-test/plain.conf") == f"plain line for {node}\n"
    assert stat(pool, host, "/etc/lab-test/base64.bin") == "640 root:root"
    assert (
        pool.exec_in(host, ["base64", "-w0", "/etc/lab-test/base64.bin"]).stdout
        == base64.b64encode(BASE64).decode()
    )
    assert stat(pool, host, "/etc/lab-test/deep/gzip.txt") == "755 root:root"
    assert pool.read_file(host, "/etc/lab-test/deep/gzip.txt") == GZIPPED.decode()
    join = pool.read_file(host, "/run/kubeadm/kubeadm-join-config.yaml")
    assert f"name: '{node}'" in join and f"value: lab://{node}" in join
    assert pool.read_file(host, "/run/cluster-api/bootstrap-success.complete") == "success\n"  # runcmd ran
    # the machine image the LabMachine names, installed before the bootstrap
    for binary in node_program.IMAGE_BINARIES:
        assert pool.read_file(host, str(binary)) == _stand_in(binary.name)
    # the users, as cloud-init makes them: groups made, shell, key, sudo rule, password locked unless not
    assert _on(pool, host, "id", "-nG", "alice").split() == ["alice", "adm", "labteam"]
    assert _on(pool, host, "getent", "passwd", "alice").split(":")[4:] == [
        "Alice of the lab",
        "/home/alice",
        "/bin/bash\n",
    ]
    assert pool.read_file(host, "/home/alice/.ssh/authorized_keys") == f"{KEY}\n"
    assert stat(pool, host, "/home/alice/.ssh/authorized_keys") == "600 alice:alice"
    assert "(ALL) NOPASSWD: ALL" in _on(pool, host, "sudo", "-l", "-U", "alice")
    assert _on(pool, host, "passwd", "-S", "alice").split()[1] == "L"
    assert _on(pool, host, "passwd", "-S", "bob").split()[1] == "P"  # its hash set, not locked
    # ntp: the real systemd-timesyncd restarted with the servers
    assert pool.read_file(host, TIMESYNCD_DROPIN).endswith("[Time]\nNTP=ntp1.example.org 192.0.2.7\n")
    servers = _on(pool, host, "timedatectl", "show-timesync", "--property=SystemNTPServers", "--value")
    assert servers.split() == ["ntp1.example.org", "192.0.2.7"]

    # bad bootstrap data: a clear condition, and no node taken
    mounts = "#cloud-config\nmounts: [[/dev/vdb, /data]]\nruncmd:\n- echo hi\n"
    _machine(kube, "m2", mounts)
    m2 = machines.wait_reason("m2", "BootstrapDataInvalid")
    assert (
        "bootstrap data Secret m2-bootstrap: the lab provider does not carry out mounts"
        in ready(m2)["message"]
    )
    assert "nodeName" not in m2.get("status", {})

    # a runcmd that fails before CABPK's sentinel: a terminal failure naming the missing sentinel
    _machine(kube, "m3", worker_document("sh -c 'echo join refused >&2; exit 3'"))
    m3 = machines.wait_reason("m3", "BootstrapFailed")
    other = m3["status"]["nodeName"]
    assert other != node
    message = ready(m3)["message"]
    assert "/run/cluster-api/bootstrap-success.complete is missing" in message and "join refused" in message
    assert not m3["status"].get("initialization", {}).get("provisioned")

    # the pool is empty now: the next LabMachine waits for a node
    _machine(kube, "m4", worker_document(STAND_IN_KUBEADM))
    machines.wait_reason("m4", "WaitingForNode")

    # deleting m1 resets its node and returns it to the pool, where m4 takes it
    kube.kubectl("delete", LAB_MACHINE, "m1", "-n", NAMESPACE, "--wait=false")
    objects.wait_gone(kube, LAB_MACHINE, "m1", NAMESPACE, WAIT)
    m4 = machines.wait_reason("m4", "Provisioned")
    assert m4["status"]["nodeName"] == node
    # the reset undid m1's users, groups, sudo rule, ntp servers and image (the node had no kubelet)
    for gone in ("alice", "bob"):
        assert pool.exec_in(host, ["getent", "passwd", gone]).returncode == 2, gone
    assert pool.exec_in(host, ["getent", "group", "labteam"]).returncode == 2
    assert pool.exec_in(host, ["getent", "group", "adm"]).returncode == 0  # the node's own group stays
    for path in ("/home/alice", TIMESYNCD_DROPIN, str(node_program.SUDOERS), "/usr/bin/kubelet"):
        assert stat(pool, host, path) == "missing", path
    assert _on(pool, host, "timedatectl", "show-timesync", "--property=SystemNTPServers", "--value") == "\n"
    assert (
        pool.read_file(host, "/etc/lab-test/plain.conf") == f"plain line for {node}\n"
    )  # not appended twice

    # deleting the failed one resets its node too
    kube.kubectl("delete", LAB_MACHINE, "m3", "-n", NAMESPACE, "--wait=false")
    objects.wait_gone(kube, LAB_MACHINE, "m3", NAMESPACE, WAIT)
    assert clean(pool, by_name[other])
    kube.kubectl("delete", LAB_MACHINE, "m4", "-n", NAMESPACE, "--wait=false")
    objects.wait_gone(kube, LAB_MACHINE, "m4", NAMESPACE, WAIT)
    assert clean(pool, host)


def _on(pool: HostLab, host: Host, *argv: str) -> str:
    result = pool.exec_in(host, list(argv))
    assert result.returncode == 0, f"{argv} on {host.name}: {result.stderr}"
    return result.stdout


GO = "/run/lab-test-go"  # the interrupted bootstrap's runcmd waits for the test to write it


def _group(pool: HostLab, host: Host) -> str:
    """The process group of the runcmd script running on the node ("" when none runs)."""
    found = pool.exec_in(host, ["cat", "/var/lib/hostlab-lab-provider/runcmd.pgid"])
    return found.stdout.strip() if found.returncode == 0 else ""


def test_a_bootstrap_interrupted_by_a_controller_restart_runs_again_on_a_reset_node(
    machines: LabMachines, pool: HostLab
) -> None:
    kube = machines.kube
    _cluster(kube)
    wait_for_go = f"until [ -e {GO} ]; do sleep 0.2; done; {STAND_IN_KUBEADM}"
    _machine(kube, "r1", worker_document(wait_for_go))
    r1 = machines.wait_reason("r1", "Provisioning")
    host = pool.host(r1["status"]["nodeName"])
    assert wait_until(lambda: _group(pool, host) != "", WAIT, 0.2)
    first = _group(pool, host)

    # the controller is lost mid-bootstrap (stopped by PID) and started again
    labprovider.stop(kube, NAMESPACE)
    labprovider.start(kube, pool, [h.name for h in pool.hosts()], NAMESPACE)
    # the new one found the node claimed but not provisioned: it reset the node (the earlier script's
    # process group ended) and runs the bootstrap again
    assert wait_until(lambda: _group(pool, host) not in ("", first), WAIT, 0.2)
    group_alive = pool.exec_in(host, ["python3", "-c", f"import os; os.killpg({int(first)}, 0)"])
    assert group_alive.returncode != 0 and "ProcessLookupError" in group_alive.stderr
    pool.exec_in(host, ["touch", GO])
    try:
        machines.wait_reason("r1", "Provisioned")
        # written once: the reset removed the first run's file, so the append did not add a second line
        assert pool.read_file(host, "/etc/lab-test/plain.conf") == f"plain line for {host.name}\n"
    finally:
        pool.exec_in(host, ["rm", "-f", GO])
    kube.kubectl("delete", LAB_MACHINE, "r1", "-n", NAMESPACE, "--wait=false")
    objects.wait_gone(kube, LAB_MACHINE, "r1", NAMESPACE, WAIT)
    assert clean(pool, host)


def _prepare_image(kube: KubeLab, pool: HostLab) -> None:
    """The pool's nodes as a kubeadm machine image has them (image-builder's): kubelet and kubeadm at the
    nodes' first version with the packages' units, and the apiserver's name resolvable (kubelab's
    ``node_join`` does the same before its own join); the apiserver forwarded to the pool's gateway."""
    node_join.forward_apiserver(kube, pool.gateway)
    for host in pool.hosts():
        node_join.install_kubernetes(pool, host, kube, nodes.START_VERSION)
        hosts_file = host.root() / "etc/hosts"
        if APISERVER_NAME not in hosts_file.read_text():
            with hosts_file.open("a") as etc_hosts:
                etc_hosts.write(f"{pool.gateway} {APISERVER_NAME}\n")


def _node(kube: KubeLab, name: str) -> dict[str, Any]:
    return objects.get(kube, "node", name) or {}


def test_cabpks_kubeadm_join_on_a_pool_node_makes_a_ready_node_with_the_provider_id_and_delete_resets_it(
    machines: LabMachines, kubelab_nodes: KubeLab, pool: HostLab
) -> None:
    kube = kubelab_nodes
    _prepare_image(kube, pool)
    _cluster(kube)
    discovery = {
        "bootstrapToken": {
            "apiServerEndpoint": nodes.endpoint(kube),
            "token": nodes.token(kube),
            "unsafeSkipCAVerification": True,
        }
    }
    document = worker_document(KUBEADM_JOIN, join=join_configuration(discovery))
    _machine(kube, "w1", document)
    node = ""
    try:

        def settled() -> bool:
            return ready(machines.get("w1")).get("reason") in ("Provisioned", "BootstrapFailed")

        assert wait_until(settled, JOIN_WAIT, 1.0), ready(machines.get("w1"))
        w1 = machines.get("w1")
        assert ready(w1)["reason"] == "Provisioned", ready(w1)
        node = w1["status"]["nodeName"]
        host = pool.host(node)
        # the Node the real kubelet registered carries the LabMachine's provider ID: what CAPI matches them by
        assert wait_until(lambda: node_join.node_ready(kube, node), JOIN_WAIT, 1.0), f"Node {node} not Ready"
        assert _node(kube, node)["spec"]["providerID"] == w1["spec"]["providerID"] == f"lab://{node}"
        assert pool.exec_in(host, ["test", "-s", "/etc/kubernetes/kubelet.conf"]).returncode == 0

        kube.kubectl("delete", LAB_MACHINE, "w1", "-n", NAMESPACE, "--wait=false")
        objects.wait_gone(kube, LAB_MACHINE, "w1", NAMESPACE, WAIT)
        # kubeadm reset ran: the kubelet's credentials are gone and the kubelet is stopped
        assert pool.exec_in(host, ["test", "-e", "/etc/kubernetes/kubelet.conf"]).returncode != 0
        assert pool.exec_in(host, ["systemctl", "is-active", "kubelet"]).stdout.strip() != "active"
        assert clean(pool, host)
    finally:
        if node:  # CAPI's Machine controller deletes a deleted Machine's Node; none runs here
            kube.kubectl("delete", "node", node, "--ignore-not-found", check=False)
