"""The mcm flavour: the real machine-controller-manager v0.62.1 with our static-hosts machine
controller makes Machines of a MachineDeployment, backs each by one host of the list with a Node named
like the Machine (kwok keeps it Ready), and frees the hosts again when the pool shrinks."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hostlab.proc import wait_until
from kubelab import objects
from kubelab.flavours import mcm, mcm_objects
from kubelab.lab import Lab

pytestmark = [pytest.mark.kube, pytest.mark.mcm]

HOST_LABEL = "static-hosts.inplace-extension.io/host"
ADDRESS_ANNOTATION = "inplace-extension.io/address"
WAIT = 120.0


def ready(node: dict[str, Any]) -> bool:
    return (objects.condition(node, "Ready") or {}).get("status") == "True"


def test_machine_deployment_of_three_makes_three_machines_and_ready_nodes(kubelab_mcm: Lab) -> None:
    lab = kubelab_mcm
    pool = "flavour-pool"
    deployment = mcm_objects.machine_deployment(pool, "flavour-class", replicas=3)
    mcm_objects.apply_pool(lab, deployment, mcm_objects.machine_class("flavour-class"))

    def running() -> bool:
        found = mcm_objects.machines(lab, pool)
        return len(found) == 3 and all(mcm_objects.phase(m) == "Running" for m in found)

    assert wait_until(running, WAIT, 0.5), [mcm_objects.phase(m) for m in mcm_objects.machines(lab, pool)]
    machines = mcm_objects.machines(lab, pool)
    names = sorted(m["metadata"]["name"] for m in machines)
    nodes = [objects.get(lab, "node", name) for name in names]
    assert all(n is not None and ready(n) for n in nodes), "every Machine has a Ready Node of its name"
    hosts = {n["metadata"]["labels"][HOST_LABEL] for n in nodes if n}
    addresses = {n["metadata"]["annotations"][ADDRESS_ANNOTATION] for n in nodes if n}
    assert len(hosts) == 3 and len(addresses) == 3, "three different hosts back the three Machines"
    configured = json.loads(mcm.hosts_file(lab).read_text())["hosts"]  # another test may have set its own
    known = {h["name"]: h["address"] for h in configured}
    assert all(n is not None and known[n["metadata"]["labels"][HOST_LABEL]] in addresses for n in nodes)
    assert all(m["metadata"]["labels"].get("node") == m["metadata"]["name"] for m in machines)

    def mapped() -> set[str]:  # MCM's machine controller labels each Node with its Machine's name
        found = (objects.get(lab, "node", name) or {} for name in names)
        return {
            n.get("metadata", {}).get("labels", {}).get("node.gardener.cloud/machine-name", "") for n in found
        }

    assert wait_until(lambda: mapped() == set(names), WAIT, 0.5), mapped()

    lab.kubectl("scale", mcm_objects.MACHINE_DEPLOYMENTS, pool, "-n", mcm.NAMESPACE, "--replicas=0")
    assert wait_until(lambda: not mcm_objects.machines(lab, pool), WAIT, 0.5), "Machines deleted"
    for name in names:
        objects.wait_gone(lab, "node", name, timeout=WAIT)
    lab.kubectl("delete", mcm_objects.MACHINE_DEPLOYMENTS, pool, "-n", mcm.NAMESPACE, "--wait=false")
