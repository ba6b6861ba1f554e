"""A real workload cluster made by the real CAPI v1.14.2 controllers on the lab's real nodes (issue #27 item
3), and its workers updated in place, their kubelet credentials rotated and then replaced under those
controllers, and its control plane updated in place (item 4): core, KubeadmControlPlane and CABPK on the
shared CAPI lab, the lab's infrastructure provider (:mod:`kubelab.labprovider`, the stand-in for a
bare-metal provider) over a pool of :data:`POOL` node-lab nodes (systemd, containerd, the real kubelet):
one per Machine and :data:`SPARE` for a rollout by replacement. One work unit: the cluster is built once,
the tests run in order.

The test writes only what a user writes (:mod:`capi_lab.workload`): a Cluster on a LabCluster, a
KubeadmControlPlane of three (``maxSurge: 0``) at v1.36.1 and a MachineDeployment of two workers at
v1.35.4. CABPK renders the bootstrap data, the provider carries it out on a pool node (``kubeadm init``
with the real static Pods, ``kubeadm join --control-plane`` with a stacked etcd member, ``kubeadm
join``), CAPI's Machine controller finds each Node by its providerID through the kubeconfig Secret KCP
writes. Nothing is patched by hand on any Node or Machine. The pool's preparation (images in
containerd, kubelet and kubeadm staged per version) stands for a bare-metal machine image.

The in-place update: our service in the Kubernetes-aware mode (``serve --kubeconfig``, the workload
cluster reached through the kubeconfig Secret CAPI writes, as in production) registered through its own
ExtensionConfig for the cluster's namespace, reaching each worker over SSH through an inventory entry per
Machine (the pool node's address and pinned host key). The test changes the MachineDeployment as a user
does: ``version`` v1.35.4 -> v1.36.1 (a minor, to the control plane's) and a new KubeadmConfigTemplate
with a kubelet flag, a file, a user and NTP servers. CAPI asks the service, which claims it; CAPI updates
each Machine in place through UpdateMachine, one at a time; the service drains each Node through the
workload cluster before the disruptive steps (the kubelet flag, ``kubeadm upgrade node``), uncordons it
and answers done once the real Node is Ready.

Kubelet credential rotation: the service's capabilities file enables the shipped ``kubelet_credentials``
with :data:`~capi_lab.workload.ROTATION_ANNOTATION`. A user sets the timestamp in the MachineDeployment's
``spec.template.metadata.annotations``; CAPI v1.14.2 propagates template metadata to the MachineSet and
its Machines in place (``computeDesiredMachineSet`` and the MachineSet's ``syncMachines``) and compares no
metadata when it decides on a rollout (``MachineTemplateUpToDate``), so the annotation alone changes
nothing on the nodes. The rotation runs with the next in-place update, whose desired Machine carries it:
the user pairs it with a change the service claims (here a file in a new KubeadmConfigTemplate). A later
update with the same timestamp does not rotate again.

A revert (issue 38): the user points the MachineDeployment at a KubeadmConfigTemplate A (a file and
the kubelet's ``--max-pods``), then B (both changed), then back at A. The second A is the desired state
the workers had before, which the service must apply again (a new episode of it); the test reads the
hosts: the file's content and the flag on the running kubelet's command line (``/proc/<pid>/cmdline``).

The rollout by replacement: a LabMachineTemplate naming the machine image of the workers' version (the
lab provider's ``spec.image``), a field the service does not claim: CanUpdateMachineSet answers
``rollout``, CAPI creates new Machines (a surge of one), the first on the spare node, deletes the old ones,
whose nodes the provider resets and returns to the pool, where the next new Machine takes one. The
provider carries out the workers' bootstrap data with its ``users`` and ``ntp``, as cloud-init does.

The control plane in place: the user bumps the KubeadmControlPlane's ``version`` v1.36.1 -> v1.36.3.
KCP (3 replicas, ``maxSurge: 0``: the only way CAPI v1.14.2's KCP updates in place) writes the version
into the workload cluster's kubeadm-config, asks CanUpdateMachine and takes one Machine at a time through
UpdateMachine; the service runs ``kubeadm upgrade node`` on each (kubeadm-config already at the target)
and swaps the kubelet. A thread reads the workload API throughout, through the controlPlaneEndpoint (the
first node's apiserver: a real site puts a VIP or load balancer there) and through any of the three
apiservers, and the longest gaps are printed.
"""

from __future__ import annotations

import base64
import copy
import json
import re
import subprocess
import time
import urllib.error
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from hostlab.lab import Host
from hostlab.lab import Lab as HostLab
from hostlab.node_base import PAUSE_IMAGE
from hostlab.proc import wait_until
from hostlab.pytest_plugin import nodes_lab
from kubelab import build, objects
from kubelab.flavours import capi_objects as co
from kubelab.lab import Lab as KubeLab
from labprovider.pool import LabMachines, provider_running
from nodes.images import CONTROL_PLANE_REPOSITORY
from nodes.kubeadm_cluster import API_PORT, AdminApi, ApiProbe, built
from playbooks.support import ReleaseServer

from .conftest import unique_namespace
from .kube_aware import CORDONED_BY, KubeExtension, serving
from .workload import (
    ROTATION_ANNOTATION,
    capabilities,
    cluster_objects,
    in_place_worker_spec,
    kubeadm_upgrades,
    kubeconfig,
    lab_machine_template,
    machine_inventory,
    node_binaries,
    prepare_pool,
    release_binary,
    workload_api,
)

pytestmark = [pytest.mark.lab, pytest.mark.kube, pytest.mark.capi]

CLUSTER = "wl"
CONTROL_PLANE_VERSION = build.NODE_VERSIONS[0]  # v1.36.1
WORKER_VERSION = build.MINOR_UPGRADE_VERSION  # v1.35.4
CONTROL_PLANES = 3  # KCP's maxSurge 0, so that it updates in place, needs 3 (CAPI's webhook)
WORKERS = 2
# a node no Machine holds once the cluster is built: the first new Machine of a rollout by replacement
SPARE = 1
POOL = CONTROL_PLANES + WORKERS + SPARE
VERSIONS = (WORKER_VERSION, *build.NODE_VERSIONS)  # staged on every pool node
# kubeadm init (static Pods on busy cores), CAPI's controllers noticing, two joins: measured 63-65 s at load
# averages of 12-22 on the 2 shared cores; the deadline leaves room for a far busier machine
BUILD_DEADLINE = 1500.0
DELETE_DEADLINE = 600.0
KCP = "kubeadmcontrolplane.controlplane.cluster.x-k8s.io"
KCP_HEALTHY = ("Available", "EtcdClusterHealthy", "ControlPlaneComponentsHealthy")
# KCP's conditions on each control-plane Machine: its etcd member (in the member list, healthy) and the
# static Pods it reads through the workload API
CP_MACHINE_HEALTHY = (
    "EtcdMemberHealthy",
    "EtcdPodHealthy",
    "APIServerPodHealthy",
    "ControllerManagerPodHealthy",
    "SchedulerPodHealthy",
)
MD = "machinedeployments.cluster.x-k8s.io"
# this module's ExtensionConfig and the label of the workload cluster's namespace (no other module's)
EXTENSION = "inplace-extension-workload"
SELECTOR = {"inplace-extension.io/capi-workload": "yes"}
TARGET = CONTROL_PLANE_VERSION  # the workers' minor upgrade, to the control plane's version
# two workers one after the other, each: drain, the binaries downloaded, kubeadm upgrade node, the kubelet
# restarted, the health gate on the real Node
ROLLOUT_DEADLINE = 1200.0
FLAG = ("max-pods", "77")
FILE = {"path": "/etc/lab-workload/in-place.conf", "content": "in place $(id)\n", "permissions": "0640"}
NTP = {"enabled": True, "servers": ["ntp1.example.org", "ntp2.example.org"]}
USER = "labops"
ROTATION_FILE = "/etc/lab-workload/rotation.conf"  # the claimed change that carries a rotation
# the field managers of a write by hand (the test's kubelab client, kubectl): none may show on a Machine/Node
BY_HAND = {"kubelab", "kubectl", "kubectl-patch", "kubectl-edit"}
CP_TARGET = build.NODE_VERSIONS[-1]  # v1.36.3: the control plane's patch upgrade
# three control-plane Machines one after the other, each: the binaries downloaded, kubeadm upgrade (the
# static Pods restarted, the local apiserver among them), the kubelet restarted, KCP's health checks
KCP_ROLLOUT_DEADLINE = 1800.0
# kubeadm's upgrade on each control-plane Machine: "node" on all three. The role runs "apply" where the
# cluster's kubeadm-config still names the old version, but KCP writes the new version there itself
# before it updates any Machine (UpdateClusterConfiguration in update.go), and does the cluster-wide
# parts apply would (kubeadm-config, RBAC, kube-proxy and CoreDNS) itself
KUBEADM_MODES = ["kubeadm upgrade node"] * CONTROL_PLANES
# seconds the workload API may go unanswered through the controlPlaneEndpoint (the first node's own
# apiserver, restarted by its upgrade): generous, the measured figure is in docs/development.md
API_GAP_LIMIT = 300.0
# the service's log of its plays: one "started" and one end per play (inplace_extension/local/backend.py)
RUN_STATE = re.compile(
    r"machine=(\S+) run=\S+ state=(started|successful|task_failed|unreachable|interrupted)"
)


@dataclass(frozen=True)
class Workload:
    kube: KubeLab
    namespace: str
    pool: Pool
    machines: LabMachines
    api: AdminApi
    took: float  # seconds from the objects' apply to every Machine Running and Node Ready


def _machines(kube: KubeLab, namespace: str) -> list[dict[str, Any]]:
    return co.machines(kube, namespace)


def _nodes(api: AdminApi) -> dict[str, dict[str, Any]]:
    try:
        return {n["metadata"]["name"]: n for n in api.get("/api/v1/nodes")["items"]}
    except (OSError, ValueError):
        return {}


def _node_ready(node: dict[str, Any]) -> bool:
    conditions = node.get("status", {}).get("conditions", [])
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _static_images(api: AdminApi, node: str) -> dict[str, str]:
    """The static Pods on ``node`` running with every container ready: name (less the node's) -> image."""
    pods = api.get(f"/api/v1/namespaces/kube-system/pods?fieldSelector=spec.nodeName%3D{node}")["items"]
    return {
        p["metadata"]["name"].removesuffix(f"-{node}"): p["spec"]["containers"][0]["image"]
        for p in pods
        if p.get("status", {}).get("phase") == "Running"
        and all(c.get("ready") for c in p["status"].get("containerStatuses", [{}]))
    }


def _expected_images(version: str) -> dict[str, str]:
    """The static Pods' images at ``version``: the control plane's, etcd's own tag whatever the version."""
    images = {c: f"{CONTROL_PLANE_REPOSITORY}/{c}:{version}" for c in build.CONTROL_PLANE}
    return {"etcd": f"{CONTROL_PLANE_REPOSITORY}/etcd:{build.ETCD_VERSION}", **images}


def _static_at(api: AdminApi, node: str, version: str) -> bool:
    return _static_images(api, node) == _expected_images(version)


def _all_ready(api: AdminApi) -> bool:
    nodes = _nodes(api)
    return len(nodes) == CONTROL_PLANES + WORKERS and all(_node_ready(n) for n in nodes.values())


def _progress(kube: KubeLab, namespace: str) -> str:
    """What CAPI and the provider say, for a failure's message."""
    lines = [
        f"Machine {m['metadata']['name']}: {m.get('status', {}).get('phase')} {co.conditions_text([m])[:600]}"
        for m in _machines(kube, namespace)
    ]
    lines.append(f"KCP: {json.dumps(_kcp(kube, namespace).get('status', {}))[:1500]}")
    for lm in LabMachines(kube, namespace).all():
        ready = objects.condition(lm, "Ready") or {}
        lines.append(f"LabMachine {lm['metadata']['name']}: {ready.get('reason')}: {ready.get('message')}")
    return "\n".join(lines)


def _kcp(kube: KubeLab, namespace: str) -> dict[str, Any]:
    return objects.get(kube, KCP, f"{CLUSTER}-cp", namespace) or {}


def _built(kube: KubeLab, namespace: str) -> bool:
    """Every Machine Running (its Node found) and KCP Available with every replica counted ready and
    available and etcd and the components healthy: KCP says Available (etcd and the API answer) while it
    may still count a Machine whose static Pods' probes have not passed as not ready (seen once)."""
    found = _machines(kube, namespace)
    if not (len(found) == CONTROL_PLANES + WORKERS and all(co.running(m) for m in found)):
        return False
    return _control_plane_healthy(_kcp(kube, namespace))


def _control_plane_healthy(kcp: dict[str, Any]) -> bool:
    """KCP counts all its Machines ready and available and says etcd and the components are healthy."""
    status = kcp.get("status", {})
    counts = (status.get("readyReplicas"), status.get("availableReplicas"))
    return counts == (CONTROL_PLANES, CONTROL_PLANES) and all(
        co.condition_status(kcp, kind) == "True" for kind in KCP_HEALTHY
    )


@dataclass(frozen=True)
class Pool:
    lab: HostLab
    took: float  # seconds to start the nodes and prepare them (images imported, binaries staged)


@pytest.fixture(scope="module")
def pool() -> Iterator[Pool]:
    binaries = built(node_binaries(VERSIONS))
    started = time.monotonic()
    with nodes_lab("wlpool", count=POOL) as lab:
        prepare_pool(lab, binaries, VERSIONS, image=WORKER_VERSION)
        yield Pool(lab, time.monotonic() - started)


@pytest.fixture(scope="module")
def workload(kubelab_capi: KubeLab, pool: Pool) -> Iterator[Workload]:
    kube, namespace = kubelab_capi, unique_namespace("workload")
    endpoint = pool.lab.hosts()[0]
    with provider_running(kube, pool.lab, namespace) as machines:
        # the label by which this module's ExtensionConfig serves the namespace (workload_extension)
        objects.apply(
            kube,
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace, "labels": SELECTOR}},
        )
        started = time.monotonic()
        objects.apply(
            kube,
            *cluster_objects(
                CLUSTER,
                namespace,
                endpoint,
                (CONTROL_PLANES, CONTROL_PLANE_VERSION),
                (WORKERS, WORKER_VERSION),
            ),
        )
        try:
            if not wait_until(lambda: _built(kube, namespace), BUILD_DEADLINE, 2.0):
                pytest.fail(
                    f"the workload cluster not built within {BUILD_DEADLINE:g}s:\n"
                    + _progress(kube, namespace),
                    pytrace=False,
                )
            text = kubeconfig(kube, CLUSTER, namespace)
            assert text is not None, f"no Secret {CLUSTER}-kubeconfig"
            with workload_api(text) as api:
                ready = wait_until(lambda: _all_ready(api), BUILD_DEADLINE, 2.0)
                assert ready, f"workload Nodes not Ready: {_nodes(api)}"
                yield Workload(kube, namespace, pool, machines, api, time.monotonic() - started)
        finally:
            _delete(kube, namespace)


def _delete(kube: KubeLab, namespace: str) -> None:
    """The Cluster deleted as a user deletes it: CAPI deletes the Machines, the provider resets the nodes."""
    kube.kubectl("delete", "cluster.cluster.x-k8s.io", CLUSTER, "-n", namespace, "--wait=false", check=False)
    wait_until(lambda: not _machines(kube, namespace), DELETE_DEADLINE, 2.0)


def test_capi_builds_a_workload_cluster_on_real_nodes(
    workload: Workload, capsys: pytest.CaptureFixture[str]
) -> None:
    kube, namespace, api = workload.kube, workload.namespace, workload.api
    with capsys.disabled():
        print(
            f"\npool of {POOL} nodes prepared in {workload.pool.took:.0f}s; workload cluster built "
            f"by CAPI on them in {workload.took:.0f}s"
        )
    machines = {m["metadata"]["name"]: m for m in _machines(kube, namespace)}
    labels = {name: m["metadata"].get("labels", {}) for name, m in machines.items()}
    control_plane = [m for name, m in machines.items() if co.CONTROL_PLANE_LABEL in labels[name]]
    workers = [m for name, m in machines.items() if labels[name].get(co.DEPLOYMENT_LABEL)]
    assert len(control_plane) == CONTROL_PLANES and len(workers) == WORKERS, sorted(machines)

    nodes = _nodes(api)
    endpoint = workload.pool.lab.hosts()[0]
    # each Machine's Node found by CAPI through the workload API: its providerID, the kubelet's version
    expected = [*((c, CONTROL_PLANE_VERSION) for c in control_plane), *((w, WORKER_VERSION) for w in workers)]
    for machine, version in expected:
        node_name = machine["status"]["nodeRef"]["name"]
        node = nodes[node_name]
        assert node["spec"]["providerID"] == machine["spec"]["providerID"] == f"lab://{node_name}"
        assert node["status"]["nodeInfo"]["kubeletVersion"] == version, node_name
        assert _node_ready(node)
    # the first control plane (kubeadm init) is on the endpoint's node (the LabCluster's
    # controlPlaneEndpoint), the two others joined as control planes on other nodes
    cp_nodes = sorted(m["status"]["nodeRef"]["name"] for m in control_plane)
    assert endpoint.name in cp_nodes and len(set(cp_nodes)) == CONTROL_PLANES, cp_nodes
    assert api.server == f"https://{endpoint.address}:6443"

    # on each control-plane node the static Pods kubeadm made (init, then join --control-plane), from the
    # images imported into containerd (lab.local); none on a worker
    for node_name in cp_nodes:
        assert _static_images(api, node_name) == _expected_images(CONTROL_PLANE_VERSION), node_name
    for worker in workers:
        assert _static_images(api, worker["status"]["nodeRef"]["name"]) == {}
    assert api.get("/version")["gitVersion"] == CONTROL_PLANE_VERSION

    # KCP read the workload cluster (etcd's members through the API, the static Pods): every Machine's
    # etcd member and Pods healthy, 3 of 3 ready and available
    kcp = _kcp(kube, namespace)
    assert kcp["status"]["initialization"]["controlPlaneInitialized"] is True
    assert _control_plane_healthy(kcp), json.dumps(kcp["status"])[:2000]
    for machine in control_plane:
        for kind in CP_MACHINE_HEALTHY:
            assert co.condition_status(machine, kind) == "True", (machine["metadata"]["name"], kind)
    # nothing but CAPI's controllers wrote the Machines: no field manager of the test (kubelab/kubectl)
    for machine in machines.values():
        managers = {f["manager"] for f in machine["metadata"].get("managedFields", [])}
        assert managers.isdisjoint(BY_HAND), managers


@pytest.fixture(scope="module")
def workload_extension(
    kubelab_capi: KubeLab, pool: Pool, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[KubeExtension]:
    """Our service in the Kubernetes-aware mode for the workload cluster's namespace (module docstring),
    the kubernetes_version role pointed at a release server of the lab's builds on the pool's gateway."""
    binaries = built(node_binaries(VERSIONS))
    work = tmp_path_factory.mktemp("capi-workload")  # kept after the run: the service's log
    with ReleaseServer(pool.lab.gateway, release_binary(binaries)) as server:
        caps = work / "capabilities.yaml"
        caps.write_text(capabilities(server.base_url))
        log_path = work / "service.log"
        with serving(
            kubelab_capi, pool.lab, EXTENSION, SELECTOR, caps, log_path, workload_kubeconfig="secret"
        ) as ext:
            yield ext


def _on_node(lab: HostLab, host: Host, *argv: str) -> str:
    result = lab.exec_in(host, list(argv))
    assert result.returncode == 0, f"{argv} on {host.name}: {result.stderr}"
    return result.stdout


def _kubelet_pid(lab: HostLab, host: Host) -> int:
    return int(_on_node(lab, host, "systemctl", "show", "-p", "MainPID", "--value", "kubelet").strip())


def _workload_pod(api: AdminApi, node: str) -> str:
    """A Pod bound to ``node``, run by its real kubelet (the nodes' stand-in pause image, host network);
    its name once it runs. The drain must evict it."""
    name = f"app-{node}"
    container = {"name": "app", "image": PAUSE_IMAGE, "imagePullPolicy": "Never"}
    spec = {
        "nodeName": node,
        "hostNetwork": True,
        "automountServiceAccountToken": False,
        "terminationGracePeriodSeconds": 1,
        "containers": [container],
    }
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}
    api.post("/api/v1/namespaces/default/pods", pod)
    assert wait_until(lambda: _pod_phase(api, name) == "Running", 120, 1.0), (
        f"Pod {name}: {_pod_phase(api, name)}"
    )
    return name


def _pod_phase(api: AdminApi, name: str) -> str | None:
    """The Pod's phase, or None once it is gone."""
    try:
        return str(api.get(f"/api/v1/namespaces/default/pods/{name}").get("status", {}).get("phase"))
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return None
        raise


def _pod_capacity_is(api: AdminApi, node: str, pods: str) -> bool:
    return bool(_nodes(api).get(node, {}).get("status", {}).get("capacity", {}).get("pods") == pods)


def _events(kube: KubeLab, namespace: str, uid: str) -> dict[str, list[str]]:
    """The Events about the object ``uid`` (our service's, on the Machine), reason -> messages."""
    listed = json.loads(kube.kubectl("get", "events", "-n", namespace, "-o", "json").stdout)
    found: dict[str, list[str]] = {}
    for event in listed["items"]:
        if event["involvedObject"].get("uid") == uid:
            found.setdefault(event["reason"], []).append(event["message"])
    return found


def _rolled_out(kube: KubeLab, namespace: str, template: str, version: str = TARGET) -> bool:
    """CAPI moved every worker to the new template's MachineSet, each at ``version`` and UpToDate, and
    the MachineDeployment counts them all up to date."""
    md = f"{CLUSTER}-md"
    if not co.owned_by_template(kube, namespace, md, template):
        return False
    workers = co.machines(kube, namespace, deployment=md)
    deployment = objects.get(kube, MD, md, namespace) or {}
    return (
        len(workers) == WORKERS
        and all(
            m["spec"].get("version") == version
            and co.condition_status(m, "UpToDate") == "True"
            and co.condition_status(m, "Updating") != "True"
            for m in workers
        )
        and deployment.get("status", {}).get("upToDateReplicas") == WORKERS
    )


def _worker_hosts(workload: Workload, extension: KubeExtension) -> dict[str, Host]:
    """The workers' Machines (by name) on their pool nodes, and the service's inventory of them written."""
    lab = workload.pool.lab
    pool = {h.name: h for h in lab.hosts()}
    workers = co.machines(workload.kube, workload.namespace, deployment=f"{CLUSTER}-md")
    # the provider names each Node as its pool node (CABPK's local_hostname): Machine -> node
    hosts = {m["metadata"]["name"]: pool[m["status"]["nodeRef"]["name"]] for m in workers}
    extension.inventory.write_text(yaml.safe_dump(machine_inventory(lab, hosts), sort_keys=False))
    return hosts


def _uids(kube: KubeLab, namespace: str) -> dict[str, str]:
    return {m["metadata"]["name"]: m["metadata"]["uid"] for m in _machines(kube, namespace)}


def _change_deployment(
    kube: KubeLab,
    namespace: str,
    extension: KubeExtension,
    change: Mapping[str, Any],
    done: Callable[[], bool],
    what: str,
) -> float:
    """The MachineDeployment patched with ``change`` as a user patches it; the seconds until ``done``."""
    started = time.monotonic()
    kube.kubectl("patch", MD, f"{CLUSTER}-md", "-n", namespace, "--type=merge", "-p", json.dumps(change))
    if not wait_until(done, ROLLOUT_DEADLINE, 2.0):
        pytest.fail(
            f"not {what} within {ROLLOUT_DEADLINE:g}s:\n{_progress(kube, namespace)}\n"
            f"service log (end):\n{extension.log()[-6000:]}",
            pytrace=False,
        )
    return time.monotonic() - started


def test_capi_updates_the_workers_in_place_on_the_real_nodes(
    workload: Workload, workload_extension: KubeExtension, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kube, namespace, api, lab = workload.kube, workload.namespace, workload.api, workload.pool.lab
    before = _uids(kube, namespace)
    hosts = _worker_hosts(workload, workload_extension)
    key = tmp_path / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    user = {
        "name": USER,
        "shell": "/bin/bash",
        "sshAuthorizedKeys": [key.with_suffix(".pub").read_text().strip()],
    }
    pids = {name: _kubelet_pid(lab, host) for name, host in hosts.items()}
    pods = {name: _workload_pod(api, host.name) for name, host in hosts.items()}

    # what a user does: a new KubeadmConfigTemplate, and the MachineDeployment pointed at it and the version
    template = f"{CLUSTER}-md-in-place"
    spec = in_place_worker_spec(FLAG, FILE, user, NTP)
    objects.apply(kube, co.kubeadm_config_template(template, namespace, spec))
    change = {
        "spec": {"template": {"spec": {"version": TARGET, "bootstrap": {"configRef": {"name": template}}}}}
    }
    done = partial(_rolled_out, kube, namespace, template)
    took = _change_deployment(
        kube, namespace, workload_extension, change, done, "the workers updated in place"
    )
    with capsys.disabled():
        print(f"\n{WORKERS} workers updated in place ({WORKER_VERSION} -> {TARGET} and more) in {took:.0f}s")

    # in place: the same Machines (UIDs), none added, none replaced; CanUpdateMachineSet claimed it
    assert _uids(kube, namespace) == before
    assert re.search(r"hook=CanUpdateMachineSet .* decision=in-place", workload_extension.log())
    nodes = _nodes(api)
    for name, host in hosts.items():
        node = nodes[host.name]
        # the minor upgrade by kubeadm upgrade node: the real kubelet reports the target, Ready, schedulable
        assert node["status"]["nodeInfo"]["kubeletVersion"] == TARGET, host.name
        assert _node_ready(node), host.name
        assert not node["spec"].get("unschedulable"), host.name
        assert CORDONED_BY not in node["metadata"].get("annotations", {}), host.name
        # the kubelet flag: the restarted kubelet runs with it, the Node reports its pod capacity
        pid = _kubelet_pid(lab, host)
        assert pid != pids[name]
        assert f"--{FLAG[0]}={FLAG[1]}" in _on_node(lab, host, "cat", f"/proc/{pid}/cmdline").split("\0")
        assert wait_until(partial(_pod_capacity_is, api, host.name, FLAG[1]), 60, 1.0), host.name
        # the file, its content literal (never run by a shell) and its mode
        assert _on_node(lab, host, "cat", FILE["path"]) == FILE["content"]
        assert _on_node(lab, host, "stat", "-c", "%a", FILE["path"]).strip() == FILE["permissions"][1:]
        # the user logs in over the node's real sshd with its key
        login = lab.ssh_argv(host, USER)
        login[login.index("-i") + 1] = str(key)
        answer = subprocess.run([*login, "--", "id", "-un"], capture_output=True, text=True, timeout=30)
        assert answer.stdout == f"{USER}\n", answer.stderr
        # NTP: the real systemd-timesyncd restarted with the servers
        servers = _on_node(
            lab, host, "timedatectl", "show-timesync", "--property=SystemNTPServers", "--value"
        )
        assert servers.split() == NTP["servers"]
        # drained through the workload cluster: the Pod evicted and removed by the real kubelet
        assert _pod_phase(api, pods[name]) is None
        events = _events(kube, namespace, before[name])
        assert events.get("Drained") == [f"drained Node {host.name}"], events
        assert events.get("Uncordoned") == [f"uncordoned Node {host.name}"], events
    # only CAPI's controllers, the kubelets and our service wrote the Machines and Nodes: not the test
    for obj in [*_machines(kube, namespace), *(nodes[h.name] for h in hosts.values())]:
        managers = {f["manager"] for f in obj["metadata"].get("managedFields", [])}
        assert managers.isdisjoint(BY_HAND), (obj["metadata"]["name"], managers)


CLIENT_CERTIFICATE = "/var/lib/kubelet/pki/kubelet-client-current.pem"  # kubeadm's kubelet.conf names it
KUBELET_CLIENT_SIGNER = "kubernetes.io/kube-apiserver-client-kubelet"
KCT = "kubeadmconfigtemplates.bootstrap.cluster.x-k8s.io"


def _client_certificate(lab: HostLab, host: Host) -> x509.Certificate:
    return x509.load_pem_x509_certificate(_on_node(lab, host, "cat", CLIENT_CERTIFICATE).encode())


def _client_csrs(api: AdminApi, node: str) -> dict[str, dict[str, Any]]:
    """The CertificateSigningRequests of ``node``'s kubelet for its own client certificate, by name."""
    listed = api.get("/apis/certificates.k8s.io/v1/certificatesigningrequests")["items"]
    return {
        c["metadata"]["name"]: c
        for c in listed
        if c["spec"]["username"] == f"system:node:{node}" and c["spec"]["signerName"] == KUBELET_CLIENT_SIGNER
    }


def _machine_sets(kube: KubeLab, namespace: str) -> set[str]:
    sets = co.list_objects(
        kube, "machinesets.cluster.x-k8s.io", namespace, {co.DEPLOYMENT_LABEL: f"{CLUSTER}-md"}
    )
    return {ms["metadata"]["name"] for ms in sets}


def _annotated(kube: KubeLab, namespace: str, key: str, value: str) -> bool:
    workers = co.machines(kube, namespace, deployment=f"{CLUSTER}-md")
    return len(workers) == WORKERS and all(
        m["metadata"].get("annotations", {}).get(key) == value for m in workers
    )


def _change_worker_files(
    kube: KubeLab, namespace: str, extension: KubeExtension, template: str, file: Mapping[str, str]
) -> float:
    """What a user does for a change the service claims: a copy of the workers' current KubeadmConfigTemplate
    with ``file`` added (or replaced), the MachineDeployment pointed at it; the seconds until CAPI has
    rolled it out to every worker."""
    deployment = objects.get(kube, MD, f"{CLUSTER}-md", namespace)
    assert deployment is not None
    current = deployment["spec"]["template"]["spec"]["bootstrap"]["configRef"]["name"]
    stored = objects.get(kube, KCT, current, namespace)
    assert stored is not None, current
    spec = copy.deepcopy(stored["spec"]["template"]["spec"])
    spec["files"] = [*(f for f in spec.get("files", []) if f["path"] != file["path"]), dict(file)]
    objects.apply(kube, co.kubeadm_config_template(template, namespace, spec))
    change = {"spec": {"template": {"spec": {"bootstrap": {"configRef": {"name": template}}}}}}
    done = partial(_rolled_out, kube, namespace, template, deployment["spec"]["template"]["spec"]["version"])
    return _change_deployment(kube, namespace, extension, change, done, f"{template} rolled out")


def test_capi_rotates_the_workers_kubelet_credentials_in_place(
    workload: Workload, workload_extension: KubeExtension, capsys: pytest.CaptureFixture[str]
) -> None:
    kube, namespace, api, lab = workload.kube, workload.namespace, workload.api, workload.pool.lab
    before = _uids(kube, namespace)
    hosts = _worker_hosts(workload, workload_extension)
    certificates = {name: _client_certificate(lab, host) for name, host in hosts.items()}
    csrs = {name: set(_client_csrs(api, host.name)) for name, host in hosts.items()}
    sets = _machine_sets(kube, namespace)
    log = len(workload_extension.log())

    # 1. the user asks for a rotation in the MachineDeployment's template metadata; CAPI propagates it to
    # the MachineSet and the Machines in place, without a rollout: no new MachineSet, no UpdateMachine, the
    # kubelets keep their certificates (CAPI compares no annotations: module docstring)
    asked = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    rotate = {"spec": {"template": {"metadata": {"annotations": {ROTATION_ANNOTATION: asked}}}}}
    kube.kubectl("patch", MD, f"{CLUSTER}-md", "-n", namespace, "--type=merge", "-p", json.dumps(rotate))
    assert wait_until(lambda: _annotated(kube, namespace, ROTATION_ANNOTATION, asked), 120, 1.0), _progress(
        kube, namespace
    )
    assert _machine_sets(kube, namespace) == sets
    assert "hook=UpdateMachine" not in workload_extension.log()[log:]
    for name, host in hosts.items():
        assert _client_certificate(lab, host).serial_number == certificates[name].serial_number, host.name

    # 2. with it, a change the service claims (a file): CAPI updates each worker in place through
    # UpdateMachine, whose desired Machine carries the timestamp: the rotation runs on the node
    took = _change_worker_files(
        kube,
        namespace,
        workload_extension,
        f"{CLUSTER}-md-rotation",
        {"path": ROTATION_FILE, "content": asked},
    )
    with capsys.disabled():
        print(f"\nkubelet credentials of {WORKERS} workers rotated in place (and a file) in {took:.0f}s")
    assert _uids(kube, namespace) == before
    nodes = _nodes(api)
    rotated = {}
    for name, host in hosts.items():
        assert re.search(
            rf"hook=UpdateMachine machine={re.escape(namespace)}/{re.escape(name)} .*kubelet_credentials.*"
            r"decision=done",
            workload_extension.log()[log:],
        ), name
        # a new client certificate from a new CSR, approved by the workload cluster's real csrapproving
        # controller (kube-controller-manager's "self kubelet client certificate" auto-approval)
        certificate = _client_certificate(lab, host)
        assert certificate.serial_number != certificates[name].serial_number, host.name
        assert certificate.not_valid_before_utc > certificates[name].not_valid_before_utc, host.name
        new = {k: v for k, v in _client_csrs(api, host.name).items() if k not in csrs[name]}
        issued = {
            x509.load_pem_x509_certificate(base64.b64decode(c["status"]["certificate"])).serial_number: c
            for c in new.values()
            if c.get("status", {}).get("certificate")
        }
        assert certificate.serial_number in issued, (host.name, sorted(new))
        approved = objects.condition(issued[certificate.serial_number], "Approved") or {}
        assert (approved.get("status"), approved.get("reason")) == ("True", "AutoApproved"), approved
        assert _node_ready(nodes[host.name]), host.name
        assert _on_node(lab, host, "cat", ROTATION_FILE) == asked
        rotated[name] = (certificate.serial_number, set(_client_csrs(api, host.name)))

    # 3. another claimed change with the same timestamp: updated in place again, no second rotation
    log = len(workload_extension.log())
    again = {"path": ROTATION_FILE, "content": "again\n"}
    _change_worker_files(kube, namespace, workload_extension, f"{CLUSTER}-md-no-rotation", again)
    assert _uids(kube, namespace) == before
    for name, host in hosts.items():
        machine = f"{re.escape(namespace)}/{re.escape(name)}"
        assert re.search(
            rf"hook=UpdateMachine machine={machine} .*decision=done", workload_extension.log()[log:]
        )
        assert _on_node(lab, host, "cat", ROTATION_FILE) == again["content"]
        serial, requested = rotated[name]
        assert _client_certificate(lab, host).serial_number == serial, host.name
        assert set(_client_csrs(api, host.name)) == requested, host.name


REVERT_FILE = "/etc/lab-workload/revert.conf"  # what a revert must put back on the host
REVERT_FLAG = "max-pods"


def _worker_template_with(
    kube: KubeLab, namespace: str, template: str, file: Mapping[str, str], max_pods: str
) -> None:
    """A copy of the workers' current KubeadmConfigTemplate with ``file`` and the kubelet's ``--max-pods``
    set, as a user writes one (not yet pointed at)."""
    deployment = objects.get(kube, MD, f"{CLUSTER}-md", namespace)
    assert deployment is not None
    current = deployment["spec"]["template"]["spec"]["bootstrap"]["configRef"]["name"]
    stored = objects.get(kube, KCT, current, namespace)
    assert stored is not None, current
    spec = copy.deepcopy(stored["spec"]["template"]["spec"])
    spec["files"] = [*(f for f in spec.get("files", []) if f["path"] != file["path"]), dict(file)]
    registration = spec["joinConfiguration"]["nodeRegistration"]
    registration["kubeletExtraArgs"] = [
        *(a for a in registration.get("kubeletExtraArgs", []) if a["name"] != REVERT_FLAG),
        {"name": REVERT_FLAG, "value": max_pods},
    ]
    objects.apply(kube, co.kubeadm_config_template(template, namespace, spec))


def _point_workers_at(
    kube: KubeLab, namespace: str, extension: KubeExtension, template: str, what: str
) -> float:
    """The MachineDeployment pointed at the KubeadmConfigTemplate ``template``; the seconds until CAPI
    rolled it out to every worker (in place: the same Machines)."""
    deployment = objects.get(kube, MD, f"{CLUSTER}-md", namespace)
    assert deployment is not None
    version = deployment["spec"]["template"]["spec"]["version"]
    change = {"spec": {"template": {"spec": {"bootstrap": {"configRef": {"name": template}}}}}}
    done = partial(_rolled_out, kube, namespace, template, version)
    return _change_deployment(kube, namespace, extension, change, done, what)


def _host_has(
    lab: HostLab, api: AdminApi, host: Host, content: str, max_pods: str, kubelet_before: int | None
) -> int:
    """The host's truth (never the service's words): the file's content, the running kubelet's own command
    line (restarted since ``kubelet_before``) and the Node's pod capacity that kubelet reports; its PID."""
    assert _on_node(lab, host, "cat", REVERT_FILE) == content, host.name
    pid = _kubelet_pid(lab, host)
    if kubelet_before is not None:
        assert pid != kubelet_before, f"{host.name}: the kubelet was not restarted"
    flags = _on_node(lab, host, "cat", f"/proc/{pid}/cmdline").split("\0")
    assert f"--{REVERT_FLAG}={max_pods}" in flags, (host.name, flags)
    assert [f for f in flags if f.startswith(f"--{REVERT_FLAG}=")] == [f"--{REVERT_FLAG}={max_pods}"]
    assert wait_until(partial(_pod_capacity_is, api, host.name, max_pods), 60, 1.0), host.name
    return pid


def test_capi_applies_a_reverted_worker_template_again_on_the_real_nodes(
    workload: Workload, workload_extension: KubeExtension, capsys: pytest.CaptureFixture[str]
) -> None:
    """A user's revert: the MachineDeployment's template A -> B -> A (a file and a kubelet flag). The
    second A is a new episode of A's desired state (docs/operations.md): each worker plays it again and
    ends with A's file and A's kubelet flag, judged on the host."""
    kube, namespace, api, lab = workload.kube, workload.namespace, workload.api, workload.pool.lab
    before = _uids(kube, namespace)
    hosts = _worker_hosts(workload, workload_extension)
    a, b = f"{CLUSTER}-md-revert-a", f"{CLUSTER}-md-revert-b"
    _worker_template_with(kube, namespace, a, {"path": REVERT_FILE, "content": "A\n"}, "88")
    took = [_point_workers_at(kube, namespace, workload_extension, a, "A rolled out")]
    pids = {name: _host_has(lab, api, host, "A\n", "88", None) for name, host in hosts.items()}
    _worker_template_with(kube, namespace, b, {"path": REVERT_FILE, "content": "B\n"}, "99")
    took.append(_point_workers_at(kube, namespace, workload_extension, b, "B rolled out"))
    pids = {name: _host_has(lab, api, host, "B\n", "99", pids[name]) for name, host in hosts.items()}
    log = len(workload_extension.log())
    took.append(_point_workers_at(kube, namespace, workload_extension, a, "A rolled out again"))
    with capsys.disabled():
        print(f"\n{WORKERS} workers A -> B -> A in place in {' + '.join(f'{t:.0f}s' for t in took)}")
    assert _uids(kube, namespace) == before, "in place: the same Machines"
    for name, host in hosts.items():
        _host_has(lab, api, host, "A\n", "88", pids[name])
        node = _nodes(api)[host.name]
        assert _node_ready(node) and not node["spec"].get("unschedulable"), host.name
        # the revert's own play ran on the host (a new attempt of A's desired state), then it was done
        machine = f"{re.escape(namespace)}/{re.escape(name)}"
        assert re.search(rf"machine={machine} run=\S+ state=started", workload_extension.log()[log:]), name


RESET_PATHS = ("/etc/kubernetes/kubelet.conf", "/run/cluster-api", "/var/lib/hostlab-lab-provider")


def _replaced(kube: KubeLab, namespace: str, template: str, old: set[str]) -> bool:
    """CAPI replaced every worker: WORKERS Machines, none of ``old`` (UIDs) left, all on the MachineSet of the
    LabMachineTemplate ``template``, Running and UpToDate, and the MachineDeployment counts them."""
    md = f"{CLUSTER}-md"
    if not co.owned_by_template(kube, namespace, md, template, infrastructure=True):
        return False
    workers = co.machines(kube, namespace, deployment=md)
    deployment = objects.get(kube, MD, md, namespace) or {}
    return (
        len(workers) == WORKERS
        and not {m["metadata"]["uid"] for m in workers} & old
        and all(co.running(m) and co.condition_status(m, "UpToDate") == "True" for m in workers)
        and deployment.get("status", {}).get("upToDateReplicas") == WORKERS
    )


def _free_nodes(workload: Workload) -> set[str]:
    taken = {lm.get("status", {}).get("nodeName") for lm in workload.machines.all()}
    return {h.name for h in workload.pool.lab.hosts()} - taken


def test_capi_replaces_the_workers_for_a_new_machine_image_on_the_pools_nodes(
    workload: Workload, workload_extension: KubeExtension, capsys: pytest.CaptureFixture[str]
) -> None:
    kube, namespace, api, lab = workload.kube, workload.namespace, workload.api, workload.pool.lab
    pool = {h.name: h for h in lab.hosts()}
    machines = _machines(kube, namespace)
    old = {m["metadata"]["uid"]: m["status"]["nodeRef"]["name"] for m in machines if _is_worker(m)}
    control_plane = {
        m["metadata"]["uid"]: m["status"]["nodeRef"]["name"] for m in machines if not _is_worker(m)
    }
    kubelets = {node: _kubelet_pid(lab, pool[node]) for node in control_plane.values()}
    spare = _free_nodes(workload)
    assert len(spare) == SPARE, spare
    old_lab_machines = {m["spec"]["infrastructureRef"]["name"] for m in machines if _is_worker(m)}
    deployment = objects.get(kube, MD, f"{CLUSTER}-md", namespace)
    assert deployment is not None
    version = deployment["spec"]["template"]["spec"]["version"]
    bootstrap = objects.get(
        kube, KCT, deployment["spec"]["template"]["spec"]["bootstrap"]["configRef"]["name"], namespace
    )
    assert bootstrap is not None
    config = bootstrap["spec"]["template"]["spec"]
    log = len(workload_extension.log())

    # what a user does: a LabMachineTemplate of the machine image for the workers' version (the service
    # claims no LabMachineTemplate field), the MachineDeployment pointed at it and rolled out with a surge
    # (a new worker joins before an old one goes)
    template = f"{CLUSTER}-md-{version.replace('.', '-')}"
    objects.apply(kube, lab_machine_template(template, namespace, image=version))
    change = {
        "spec": {
            "template": {"spec": {"infrastructureRef": {"name": template}}},
            "rollout": co.rolling_update(1, 0),
        }
    }
    done = partial(_replaced, kube, namespace, template, set(old))
    took = _change_deployment(kube, namespace, workload_extension, change, done, "the workers replaced")
    with capsys.disabled():
        print(f"\n{WORKERS} workers replaced onto the pool's nodes (machine image {version}) in {took:.0f}s")

    # not in place: CanUpdateMachineSet answered so, no UpdateMachine; new Machines, the old ones gone
    new_log = workload_extension.log()[log:]
    assert re.search(r"hook=CanUpdateMachineSet .* decision=rollout", new_log), new_log[-3000:]
    assert "hook=UpdateMachine" not in new_log
    machines = _machines(kube, namespace)
    workers = [m for m in machines if _is_worker(m)]
    assert not {m["metadata"]["uid"] for m in workers} & set(old)
    # the first new worker joined on the spare node; the second on an old worker's node, reset and
    # returned to the pool when its Machine went; the other old node is back in the pool, reset
    new_nodes = {m["status"]["nodeRef"]["name"] for m in workers}
    assert spare < new_nodes and len(new_nodes & set(old.values())) == WORKERS - SPARE, (new_nodes, old)
    assert _free_nodes(workload) == set(old.values()) - new_nodes
    assert not old_lab_machines & {lm["metadata"]["name"] for lm in workload.machines.all()}
    nodes = _nodes(api)
    for free in _free_nodes(workload):
        assert free not in nodes, free  # CAPI deleted its Node
        active = lab.exec_in(pool[free], ["systemctl", "is-active", "kubelet"]).stdout.strip()
        assert active != "active", free
        for path in RESET_PATHS:
            assert lab.exec_in(pool[free], ["test", "-e", path]).returncode == 1, (free, path)
    # the new Nodes: Ready at the MachineDeployment's version with the template's files, flags, users, NTP
    for machine in workers:
        host = pool[machine["status"]["nodeRef"]["name"]]
        node = nodes[host.name]
        assert node["spec"]["providerID"] == machine["spec"]["providerID"] == f"lab://{host.name}"
        assert node["status"]["nodeInfo"]["kubeletVersion"] == version, host.name
        assert _node_ready(node), host.name
        _carries(lab, host, config)
    # the control plane untouched: the same Machines, their kubelets not restarted
    assert {m["metadata"]["uid"]: m["status"]["nodeRef"]["name"] for m in machines if not _is_worker(m)} == (
        control_plane
    )
    assert {node: _kubelet_pid(lab, pool[node]) for node in control_plane.values()} == kubelets


def _is_worker(machine: Mapping[str, Any]) -> bool:
    return bool(machine["metadata"].get("labels", {}).get(co.DEPLOYMENT_LABEL))


def _carries(lab: HostLab, host: Host, config: Mapping[str, Any]) -> None:
    """What the KubeadmConfigTemplate spec ``config`` asks of a node, on ``host``: its plain files, its
    kubelet flags (the running kubelet's command line), its users' keys, its NTP servers."""
    for file in config.get("files", []):
        if not file.get("encoding") and "{{" not in file.get("content", ""):
            # CABPK writes the content as a YAML block (``content: |``), which ends it with a line break
            written = file["content"] if file["content"].endswith("\n") else f"{file['content']}\n"
            assert _on_node(lab, host, "cat", file["path"]) == written, (host.name, file["path"])
    cmdline = _on_node(lab, host, "cat", f"/proc/{_kubelet_pid(lab, host)}/cmdline").split("\0")
    for arg in config["joinConfiguration"]["nodeRegistration"].get("kubeletExtraArgs", []):
        value = arg["value"].replace("{{ ds.meta_data.local_hostname }}", host.name)
        assert f"--{arg['name']}={value}" in cmdline, (host.name, arg)
    for user in config.get("users", []):
        home = _on_node(lab, host, "getent", "passwd", user["name"]).split(":")[5]
        keys = _on_node(lab, host, "cat", f"{home}/.ssh/authorized_keys").splitlines()
        assert set(user.get("sshAuthorizedKeys", [])) <= set(keys), (host.name, user["name"])
    if config.get("ntp", {}).get("servers"):
        servers = _on_node(
            lab, host, "timedatectl", "show-timesync", "--property=SystemNTPServers", "--value"
        )
        # as a set: a node reused after an in-place update also keeps the service's own drop-in (the
        # provider's reset undoes only what the provider did), which names the same servers
        assert set(servers.split()) == set(config["ntp"]["servers"]), host.name


def _control_plane_upgraded(kube: KubeLab, namespace: str, api: AdminApi, before: dict[str, str]) -> bool:
    """KCP counts every control-plane Machine up to date at :data:`CP_TARGET`, none Updating, and healthy;
    each one's real kubelet reports the target. Fails at once if KCP created a Machine (a replacement)."""
    machines = co.machines(kube, namespace, control_plane=True)
    created = {m["metadata"]["name"] for m in machines} - set(before)
    assert not created, (
        f"KCP created {sorted(created)} instead of updating in place\n{_progress(kube, namespace)}"
    )
    kcp = _kcp(kube, namespace)
    if not (
        len(machines) == CONTROL_PLANES
        and kcp.get("status", {}).get("upToDateReplicas") == CONTROL_PLANES
        and _control_plane_healthy(kcp)
    ):
        return False
    nodes = _nodes(api)
    return all(
        m["spec"].get("version") == CP_TARGET
        and co.condition_status(m, "UpToDate") == "True"
        and co.condition_status(m, "Updating") != "True"
        and nodes.get(m["status"]["nodeRef"]["name"], {})
        .get("status", {})
        .get("nodeInfo", {})
        .get("kubeletVersion")
        == CP_TARGET
        for m in machines
    )


def _control_plane_settled(kube: KubeLab, namespace: str) -> bool:
    kcp = _kcp(kube, namespace)
    machines = co.machines(kube, namespace, control_plane=True)
    return (
        _control_plane_healthy(kcp)
        and kcp["status"].get("upToDateReplicas") == CONTROL_PLANES
        and all(
            co.condition_status(m, kind) == "True"
            for m in machines
            for kind in ("UpToDate", *CP_MACHINE_HEALTHY)
        )
    )


def test_capi_upgrades_the_control_plane_in_place_on_the_real_nodes(
    workload: Workload, workload_extension: KubeExtension, capsys: pytest.CaptureFixture[str]
) -> None:
    kube, namespace, api, lab = workload.kube, workload.namespace, workload.api, workload.pool.lab
    before = {m["metadata"]["name"]: m["metadata"]["uid"] for m in _machines(kube, namespace)}
    control_plane = co.machines(kube, namespace, control_plane=True)
    pool = {h.name: h for h in lab.hosts()}
    hosts = {m["metadata"]["name"]: pool[m["status"]["nodeRef"]["name"]] for m in _machines(kube, namespace)}
    # every Machine of the cluster on its pool node: the control plane's now, the workers' still
    workload_extension.inventory.write_text(yaml.safe_dump(machine_inventory(lab, hosts), sort_keys=False))
    cp_uids = {m["metadata"]["name"]: m["metadata"]["uid"] for m in control_plane}
    assert len(cp_uids) == CONTROL_PLANES

    # what a user does: the KubeadmControlPlane's version, one patch release up. The workload API read
    # throughout through the controlPlaneEndpoint (the first node's apiserver: what the kubeconfig names)
    # and, for comparison, through any of the three apiservers (what a load balancer in front of them
    # would answer; each apiserver's certificate names its node's address)
    apiservers = [replace(api, server=f"https://{hosts[name].address}:{API_PORT}") for name in cp_uids]
    change = {"spec": {"version": CP_TARGET}}
    started = time.monotonic()
    with ApiProbe(api) as probe, ApiProbe(*apiservers) as any_probe:
        kube.kubectl("patch", KCP, f"{CLUSTER}-cp", "-n", namespace, "--type=merge", "-p", json.dumps(change))
        upgraded = wait_until(
            lambda: _control_plane_upgraded(kube, namespace, api, cp_uids), KCP_ROLLOUT_DEADLINE, 2.0
        )
        took = time.monotonic() - started
    with capsys.disabled():  # the measured figures in every run's output, passed or not
        print(
            f"\ncontrol plane of {CONTROL_PLANES} in place ({CONTROL_PLANE_VERSION} -> {CP_TARGET}): "
            f"{took:.0f}s; the workload API's longest gap {probe.longest_gap:.1f}s ({probe.unanswered} of "
            f"{probe.answered + probe.unanswered} reads unanswered); through any of the three apiservers "
            f"{any_probe.longest_gap:.1f}s ({any_probe.unanswered} of "
            f"{any_probe.answered + any_probe.unanswered} unanswered)"
        )
    if not upgraded:
        pytest.fail(
            f"the control plane not updated in place within {KCP_ROLLOUT_DEADLINE:g}s:\n"
            f"{_progress(kube, namespace)}\nservice log (end):\n{workload_extension.log()[-6000:]}",
            pytrace=False,
        )

    # in place: the same Machines (UIDs), none added; CanUpdateMachine claimed each control-plane Machine
    assert {m["metadata"]["name"]: m["metadata"]["uid"] for m in _machines(kube, namespace)} == before
    log = workload_extension.log()
    for name in cp_uids:
        assert re.search(rf"hook=CanUpdateMachine machine=\S*\b{name} decision=in-place", log), name
    # one Machine at a time: no two of the control plane's plays overlapped
    runs = [
        (machine, state) for machine, state in RUN_STATE.findall(log) if machine.split("/")[-1] in cp_uids
    ]
    assert {machine.split("/")[-1] for machine, state in runs if state == "started"} == set(cp_uids), runs
    in_flight = 0
    for _, state in runs:
        in_flight += 1 if state == "started" else -1
        assert in_flight <= 1, runs

    for name in cp_uids:
        host = hosts[name]
        # the four static Pods Running at the target's images (etcd's own tag unchanged), the kubelet too
        assert wait_until(partial(_static_at, api, host.name, CP_TARGET), 120, 1.0), (
            host.name,
            _static_images(api, host.name),
        )
        assert _on_node(lab, host, "kubelet", "--version").split()[-1] == CP_TARGET, host.name
        node = _nodes(api)[host.name]
        assert node["status"]["nodeInfo"]["kubeletVersion"] == CP_TARGET and _node_ready(node), host.name
        assert not node["spec"].get("unschedulable"), host.name
        assert CORDONED_BY not in node["metadata"].get("annotations", {}), host.name
    assert api.get("/version")["gitVersion"] == CP_TARGET
    # KCP healthy again, every Machine up to date with its etcd member and Pods healthy: waited for, as
    # KCP's view may drop a Machine as not ready for a moment after the rollout ended (seen once)
    assert wait_until(partial(_control_plane_settled, kube, namespace), 180, 2.0), _progress(kube, namespace)

    # the workload API answered at the end and its longest gap stayed within the generous bound
    assert probe.answered > 0 and api.answers(), "the workload API does not answer"
    assert probe.longest_gap < API_GAP_LIMIT, f"the workload API did not answer for {probe.longest_gap:.1f}s"
    # kubeadm's upgrade on each control-plane Machine, once, as KUBEADM_MODES says (the service's run
    # records): KCP had written the target into the cluster's kubeadm-config before the first one
    upgrades = {name: kubeadm_upgrades(workload_extension, f"{namespace}/{name}") for name in cp_uids}
    assert all(len(ran) == 1 for ran in upgrades.values()), upgrades
    modes = sorted(" ".join(ran[0][:3]) for ran in upgrades.values())
    assert modes == KUBEADM_MODES, upgrades
    config = api.get("/api/v1/namespaces/kube-system/configmaps/kubeadm-config")["data"][
        "ClusterConfiguration"
    ]
    assert f"kubernetesVersion: {CP_TARGET}" in config, config
    # only CAPI's controllers, the kubelets and our service wrote the Machines and Nodes: not the test
    nodes = _nodes(api)
    for obj in [*_machines(kube, namespace), *(nodes[hosts[name].name] for name in cp_uids)]:
        managers = {f["manager"] for f in obj["metadata"].get("managedFields", [])}
        assert managers.isdisjoint(BY_HAND), (obj["metadata"]["name"], managers)
