"""The hand-made MCM objects and Nodes the MCM agent tests write into the kubelab (no MCM controllers
here: tests/mcm_lab runs those), MCM's half of an update on a real Node (tests/nodes, bench/nodes.py),
and the small readers and scripted answers those tests share."""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from typing import Any

from kubelab import objects
from kubelab.flavours import mcm_objects
from kubelab.lab import Lab

from inplace_extension.mcm import node_state as ns
from inplace_extension.runs.model import Progress, ProgressState, RunRequest

NAMESPACE = "mcm-agent-test"
MACHINE_NAME_LABEL = "node.gardener.cloud/machine-name"
WAIT = 90.0  # generous: the 2 cores are shared with builds and other suites
OLD = {"kubernetesVersion": "v1.31.0"}
NEW = {
    "kubernetesVersion": "v1.31.1",
    "kubeadmConfigSpec": {"ntp": {"enabled": True, "servers": ["ntp.test"]}},
}


def _uid(kube: Lab, kind: str, name: str) -> str:
    obj = objects.get(kube, kind, name, NAMESPACE)
    assert obj is not None
    return str(obj["metadata"]["uid"])


def _owner(kind: str, name: str, uid: str) -> dict[str, Any]:
    return {
        "apiVersion": "machine.sapcloud.io/v1alpha1",
        "kind": kind,
        "name": name,
        "uid": uid,
        "controller": True,
    }


def _template(klass: str, template_hash: str | None = None) -> dict[str, Any]:
    labels = {"name": "pool"} | ({"machine-template-hash": template_hash} if template_hash else {})
    return {"metadata": {"labels": labels}, "spec": {"class": {"kind": "MachineClass", "name": klass}}}


def meta(name: str) -> dict[str, Any]:
    return {"name": name, "namespace": NAMESPACE}


def make_pool(
    kube: Lab, pool: str, *machines: str, old: Mapping[str, Any] = OLD, new: Mapping[str, Any] = NEW
) -> None:
    """MachineClasses old/new (their ``inPlaceUpdate`` specs), a MachineDeployment on the new one, an old
    and a new MachineSet, and Machines still owned by the old MachineSet (as during MCM's update)."""
    api = "machine.sapcloud.io/v1alpha1"
    classes = [
        {
            "apiVersion": api,
            "kind": "MachineClass",
            "metadata": meta(f"{pool}-{v}"),
            "provider": "static-hosts",
            "providerSpec": {"inPlaceUpdate": dict(spec)},
        }
        for v, spec in (("v1", old), ("v2", new))
    ]
    selector = {"matchLabels": {"name": "pool"}}
    deployment = {
        "apiVersion": api,
        "kind": "MachineDeployment",
        "metadata": meta(pool),
        "spec": {"replicas": 1, "selector": selector, "template": _template(f"{pool}-v2")},
    }
    objects.apply(kube, *classes, deployment)
    owner = _owner("MachineDeployment", pool, _uid(kube, mcm_objects.MACHINE_DEPLOYMENTS, pool))
    sets = [
        {
            "apiVersion": api,
            "kind": "MachineSet",
            "metadata": meta(f"{pool}-{h}") | {"ownerReferences": [owner]},
            "spec": {"replicas": 1, "selector": selector, "template": _template(f"{pool}-{v}", h)},
        }
        for v, h in (("v1", "h1"), ("v2", "h2"))
    ]
    objects.apply(kube, *sets)
    old_set = _owner("MachineSet", f"{pool}-h1", _uid(kube, mcm_objects.MACHINE_SETS, f"{pool}-h1"))
    objects.apply(
        kube,
        *(
            {
                "apiVersion": api,
                "kind": "Machine",
                "metadata": meta(machine) | {"ownerReferences": [old_set]},
                "spec": {"class": {"kind": "MachineClass", "name": f"{pool}-v1"}},
            }
            for machine in machines
        ),
    )


def make_node(
    kube: Lab, name: str, machine: str, reason: str | None, candidate: bool = True, **meta: Any
) -> None:
    """A Node nobody else manages (no kwok label): its status is what the test writes."""
    labels = {ns.CANDIDATE_LABEL: "true"} if candidate else {}
    labels |= {MACHINE_NAME_LABEL: machine, "keep": "me"}
    node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels, **meta}}
    objects.apply(kube, node)
    conditions = [{"type": "Ready", "status": "True", "reason": "Test", "message": "test"}]
    if reason:
        conditions.append({"type": "InPlaceUpdate", "status": "True", "reason": reason, "message": reason})
    patch = '{"status": {"conditions": ' + json.dumps(conditions) + "}}"
    kube.kubectl("patch", "node", name, "--subresource=status", "--type=merge", "-p", patch)


def mcm_state(kube: Lab, name: str, machine: str | None) -> None:
    """MCM's half of an in-place update on the real Node ``name``, as MCM v0.62.1 leaves it for its
    node-side updater: the machine-name and candidate labels, the cordon and the
    ``InPlaceUpdate=ReadyForUpdate`` condition; ``machine`` None: all of it removed, as MCM does when it is
    done."""
    labels = {ns.CANDIDATE_LABEL: "true" if machine else None, MACHINE_NAME_LABEL: machine}
    if machine is None:
        labels[ns.RESULT_LABEL] = None
    patch = {"metadata": {"labels": labels}, "spec": {"unschedulable": True if machine else None}}
    kube.kubectl("patch", "node", name, "-p", json.dumps(patch))
    # strategic merge on conditions (merge key "type"): the kubelet's own conditions stay
    condition: dict[str, Any] = {"type": ns.CONDITION}
    if machine is None:
        condition["$patch"] = "delete"
    else:
        condition |= {
            "status": "True",
            "reason": ns.READY_FOR_UPDATE,
            "message": "set by the lab, standing in for MCM",
        }
    status = json.dumps({"status": {"conditions": [condition]}})
    kube.kubectl("patch", "node", name, "--subresource=status", "-p", status)


def node(kube: Lab, name: str) -> dict[str, Any]:
    found = objects.get(kube, "node", name)
    assert found is not None
    return found


def label(kube: Lab, name: str) -> str | None:
    return ns.node_labels(node(kube, name)).get(ns.RESULT_LABEL)


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def done_after_two(request: RunRequest, calls: int) -> Progress:
    if calls < 2:
        return Progress(ProgressState.IN_PROGRESS, "running", 1)
    return Progress(ProgressState.DONE, "update applied")
