"""The Kubernetes-aware mode end to end: the real service (``serve --kubeconfig``) and playbooks on a
lab host, the kubelab's real API server holding the Machine (CAPI's CRD) and its Node. CAPI itself is
played by tests/e2e/capi.py; the Node and its Pods are kwok's (no kubelet behind them), and the host's
kubelet is the stand-in of tests/playbooks/standins.py.

The host address comes from the Machine's status.addresses (the inventory has no entry for it), a
kubelet_args change drains the Node right before the kubelet step (a file step runs before the drain),
and the service SIGKILLed while the Node is cordoned uncordons it exactly once after the restart and
completes the update.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from hostlab.inventory import defaults_only_inventory
from hostlab.lab import Host, Lab
from hostlab.proc import wait_until
from kubelab import manifests, objects
from kubelab.flavours import capi_objects as co
from kubelab.lab import Lab as KubeLab

from .capi import NodeSpec, poll_update_machine
from .conftest import START_VERSION, StartService
from .hostcheck import run_on, stamp_writes

pytestmark = [pytest.mark.lab, pytest.mark.kube]

CORDONED_BY = "inplace-extension.io/cordoned-by"
SKIP_REMEDIATION = "cluster.x-k8s.io/skip-remediation"
NAMESPACE = "e2e"


def kubelet_args(*pairs: tuple[str, str]) -> dict[str, object]:
    return {"nodeRegistration": {"kubeletExtraArgs": [{"name": k, "value": v} for k, v in pairs]}}


@pytest.fixture(scope="module")
def cluster(kubelab: KubeLab) -> KubeLab:
    # the Machine, and the owners its labels name (read for the operator's pause annotation)
    names = ("machines", "machinedeployments", "clusters")
    crds = [manifests.capi_crd(kubelab, f"cluster.x-k8s.io_{name}.yaml") for name in names]
    manifests.install_crds(kubelab, crds, only_missing=True)
    objects.ensure_namespace(kubelab, NAMESPACE)
    return kubelab


def machine_for(kube: KubeLab, host: Host) -> tuple[str, str]:
    """A Machine whose status names ``host`` and a kwok Node reporting the stand-in kubelet's version."""
    name, node = f"md-0-{uuid.uuid4().hex[:5]}", f"kn-{uuid.uuid4().hex[:6]}"
    objects.create_kwok_node(kube, node)
    # kwok simulates this Node's kubelet: it reports what the stand-in kubelet on the host runs
    status = {"status": {"nodeInfo": {"kubeletVersion": START_VERSION}}}
    kube.kubectl("patch", "node", node, "--subresource=status", "--type=merge", "-p", json.dumps(status))
    addresses = [{"type": "Hostname", "address": name}, {"type": "InternalIP", "address": host.address}]
    co.machine_with_status(kube, NAMESPACE, name, addresses, node)
    return name, node


def guarded_pods(kube: KubeLab, node: str, *unguarded: str) -> str:
    """A fresh namespace with the Pods ``unguarded`` on ``node``, then the Pod ``guarded`` whose
    PodDisruptionBudget refuses every eviction; returns the namespace."""
    namespace = f"w-{uuid.uuid4().hex[:6]}"
    for pod in (*unguarded, "guarded"):
        objects.create_pod(kube, namespace, pod, node, labels={"app": pod})
    objects.create_pdb(kube, namespace, "guarded")
    return namespace


def host_only_inventory(lab: Lab, host: Host, directory: Path) -> Path:
    """An inventory of the defaults and ``host``'s key only: the address comes from the Machine."""
    inventory = directory / "inventory.yaml"
    inventory.write_text(yaml.safe_dump(defaults_only_inventory(lab, host)))
    return inventory


def node(kube: KubeLab, name: str) -> dict[str, Any]:
    obj = objects.get(kube, "node", name)
    assert obj is not None
    return obj


def machine_events(kube: KubeLab, machine: str) -> list[dict[str, Any]]:
    listed = json.loads(kube.kubectl("get", "events", "-n", NAMESPACE, "-o", "json").stdout)["items"]
    return [e for e in listed if e["involvedObject"]["name"] == machine]


def test_a_service_killed_while_the_node_is_cordoned_uncordons_it_once_after_restart(
    lab: Lab, nodes: list[Host], cluster: KubeLab, start_service: StartService, tmp_path: Path
) -> None:
    host = nodes[0]
    name, node_name = machine_for(cluster, host)
    pods_ns = guarded_pods(cluster, node_name, "web")
    inventory = host_only_inventory(lab, host, tmp_path)
    kube_args = [
        "--kubeconfig",
        str(cluster.kubeconfig),
        "--workload-kubeconfig",
        "management",
        "--drain-timeout-seconds",
        "300",
        "--drain-wait-for-blocking-pdbs",  # the budget holds the drain while the test kills the service
    ]
    spec = NodeSpec(START_VERSION, {"joinConfiguration": kubelet_args(("max-pods", "120"))})

    first = start_service(inventory, extra_args=kube_args, name="first")
    held = poll_update_machine(
        first.client, name, spec, within=120, until=lambda m: m == "draining: 1 pod left"
    )
    assert held.message == "draining: 1 pod left", held.messages
    assert node(cluster, node_name)["spec"].get("unschedulable") is True
    assert node(cluster, node_name)["metadata"]["annotations"][CORDONED_BY] == f"{NAMESPACE}/{name}"
    first.kill()  # between cordon and uncordon
    cluster.kubectl("delete", "pdb", "guarded", "-n", pods_ns)

    second = start_service(inventory, runs_dir=first.runs_dir, extra_args=kube_args, name="second")
    done = poll_update_machine(second.client, name, spec, within=300)
    assert (done.status, done.message) == ("Success", "update applied"), done.messages
    after = node(cluster, node_name)
    assert not after["spec"].get("unschedulable") and CORDONED_BY not in after["metadata"].get(
        "annotations", {}
    )
    uncordons = [line for line in (first.log() + second.log()).splitlines() if " uncordoned" in line]
    assert len(uncordons) == 1, uncordons
    assert len(stamp_writes(lab, host)) == 1
    machine = objects.get(cluster, "machine.cluster.x-k8s.io", name, NAMESPACE)
    assert machine is not None and SKIP_REMEDIATION not in machine["metadata"].get("annotations", {})

    def seen() -> dict[str, list[str]]:
        found: dict[str, list[str]] = {}
        for event in machine_events(cluster, name):
            found.setdefault(event["reason"], []).append(event["message"])
        return found

    assert wait_until(lambda: "Done" in seen(), 10, 0.2), seen()
    events = seen()
    assert events["Started"] == [f"started on host {host.address} (machine status)"]
    assert events["Uncordoned"] == [f"uncordoned Node {node_name}"]
    assert sorted(events["Running"]) == ["running: kubelet_args", "running: kubernetes_version"]
    assert events["Done"] == ["update applied"]


def test_the_node_is_drained_right_before_the_first_disruptive_step(
    lab: Lab, nodes: list[Host], cluster: KubeLab, start_service: StartService, tmp_path: Path
) -> None:
    """A file (no disruption) lands before the drain; the kubelet restart comes after it. A budget that
    refuses the drain stops the play there: the Failure says the file step was applied."""
    host = nodes[0]
    name, node_name = machine_for(cluster, host)
    pods_ns = guarded_pods(cluster, node_name)
    inventory = host_only_inventory(lab, host, tmp_path)
    kube_args = ["--kubeconfig", str(cluster.kubeconfig), "--workload-kubeconfig", "management"]
    before = {
        "path": "/etc/e2e/before-drain.conf",
        "content": "early\n",
        "owner": "root:root",
        "permissions": "0644",
    }
    spec = NodeSpec(
        START_VERSION, {"files": [before], "joinConfiguration": kubelet_args(("max-pods", "150"))}
    )
    service = start_service(inventory, extra_args=kube_args)

    failed = poll_update_machine(service.client, name, spec, within=120)
    assert (failed.status, failed.message) == (
        "Failure",
        f"drain: PodDisruptionBudget {pods_ns}/guarded can never allow evicting Pod {pods_ns}/guarded from "
        f"Node {node_name} (maxUnavailable is 0); --drain-wait-for-blocking-pdbs waits instead; "
        "applied before the drain: kubeadm_files",
    ), failed.messages
    assert run_on(lab, host, ["cat", "/etc/e2e/before-drain.conf"]) == "early\n"  # landed before the drain
    kubelet_flags = lab.exec_in(host, ["grep", "-q", "max-pods=150", "/etc/default/kubelet"])
    assert kubelet_flags.returncode != 0  # the kubelet step did not run
    assert stamp_writes(lab, host) == []
    assert not node(cluster, node_name)["spec"].get("unschedulable")

    cluster.kubectl("delete", "pdb", "guarded", "-n", pods_ns)
    done = poll_update_machine(service.client, name, spec, {"inplace-extension.io/retry": "1"}, within=180)
    assert (done.status, done.message) == ("Success", "update applied"), done.messages
    assert "max-pods=150" in run_on(lab, host, ["cat", "/etc/default/kubelet"])
    assert len(stamp_writes(lab, host)) == 1
    # the retried run's order in the service log: the file step, then the cordon, then the kubelet step
    lines = service.log().splitlines()
    cordoned = [i for i, line in enumerate(lines) if f"node={node_name} cordoned" in line]
    assert len(cordoned) == 2, cordoned  # once per run
    files_step = [i for i, line in enumerate(lines) if "phase=kubeadm_files" in line]
    kubelet_step = [i for i, line in enumerate(lines) if "phase=kubelet_args" in line]
    assert len(kubelet_step) == 1, kubelet_step  # the failed run never got there
    assert files_step[-1] < cordoned[-1] < kubelet_step[0]
    assert not node(cluster, node_name)["spec"].get("unschedulable")
