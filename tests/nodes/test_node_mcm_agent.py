"""The MCM agent's node-side path on a real node: ``inplace-extension mcm-agent`` (a subprocess, Ansible
over SSH with the project's playbooks) against the node lab's kube-apiserver, whose Node is the one the
node's real kubelet registered with ``kubeadm join``.

No MCM controllers run here. The real machine-controller-manager runs in tests/mcm_lab, whose Machines
are lab hosts with kwok Nodes (its static-hosts machine controller makes a Node per Machine); making it
adopt kubeadm-joined Nodes would put MCM's lab and the node lab into one group, the two heaviest of the
suite. Here the test plays MCM's half of the contract on the real Node, as MCM v0.62.1 leaves a Node
for its node-side updater: MCM's own CRDs with the objects of a pool in the middle of an in-place
update (a MachineDeployment on a new MachineClass, the old and the new MachineSet, the Machine still
owned by the old one: tests/mcm/lab_objects.py), the Node's machine-name and candidate labels, the cordon
and the ``InPlaceUpdate`` condition ``ReadyForUpdate`` in the Node's status, beside the conditions the
kubelet keeps posting. The agent then finds the Node, reads the desired state along MCM's objects,
updates the real node (the kubelet restarted by systemd with the new flag) and answers on the Node.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hostlab.inventory import render
from hostlab.proc import wait_until
from kubelab import manifests, objects
from kubelab.flavours import mcm
from mcm.lab_objects import NAMESPACE, make_pool, mcm_state, unique
from mcm_lab.agentproc import AgentProcess

from inplace_extension.mcm import node_state as ns
from inplace_extension.plays.ssh import close_control_masters

from .conftest import REPO, Cluster, capabilities
from .test_node_capabilities import kubelet_pid, node, on_node, ready

pytestmark = [pytest.mark.lab, pytest.mark.kube]

PAYLOAD = "written by the mcm-agent $(id)\n"


@pytest.fixture
def agent(node_cluster: Cluster, tmp_path: Path) -> Iterator[AgentProcess]:
    kube = node_cluster.kube
    manifests.install_crds(kube, mcm.crd_files(kube), only_missing=True)
    objects.ensure_namespace(kube, NAMESPACE)
    inventory = tmp_path / "inventory.yaml"  # entries matched by Node name (= the node's name)
    inventory.write_text(render(node_cluster.lab, "service", [h.name for h in node_cluster.hosts]))
    caps = tmp_path / "capabilities.yaml"
    caps.write_text(capabilities(node_cluster))
    runs, port = tmp_path / "runs", kube.free_port()
    flags = {
        "--target-kubeconfig": str(kube.kubeconfig),
        "--namespace": NAMESPACE,
        "--inventory": str(inventory),
        "--allowed-cidrs": str(node_cluster.lab.network),
        "--runs-dir": str(runs),
        "--playbooks-dir": str(REPO / "playbooks"),
        "--capabilities-file": str(caps),
        "--retry-after-seconds": "1",
        "--listen": f"127.0.0.1:{port}",
        "--poll-seconds": "0.5",
        "--resync-seconds": "2",
    }
    argv = [sys.executable, "-m", "inplace_extension", "mcm-agent", *(a for f in flags.items() for a in f)]
    process = AgentProcess(argv, tmp_path / "agent.log", port, runs)
    yield process
    process.stop()
    close_control_masters(runs)


def test_the_mcm_agent_updates_a_real_node_and_answers_on_its_node(
    node_cluster: Cluster, agent: AgentProcess
) -> None:
    kube, host = node_cluster.kube, node_cluster.hosts[0]
    version = node(node_cluster, host)["status"]["nodeInfo"]["kubeletVersion"]
    files = [{"path": "/etc/mcm-agent/hello.conf", "content": PAYLOAD, "permissions": "0644"}]
    flags = {"nodeRegistration": {"kubeletExtraArgs": [{"name": "max-pods", "value": "55"}]}}
    new = {"kubernetesVersion": version, "kubeadmConfigSpec": {"files": files, "joinConfiguration": flags}}
    pool, machine = unique("pool"), unique("m")
    make_pool(kube, pool, machine, old={"kubernetesVersion": version}, new=new)
    before = kubelet_pid(node_cluster, host)

    mcm_state(kube, host.name, machine)
    try:
        answered = wait_until(lambda: ns.RESULT_LABEL in ns.node_labels(node(node_cluster, host)), 300, 0.5)
        after = node(node_cluster, host)
        assert answered and ns.node_labels(after)[ns.RESULT_LABEL] == ns.SUCCESSFUL, agent.log()[-3000:]
        # the real node was updated: the file, and the kubelet restarted by systemd with the flag
        assert on_node(node_cluster, host, "cat", "/etc/mcm-agent/hello.conf") == PAYLOAD
        assert kubelet_pid(node_cluster, host) != before
        cmdline = on_node(node_cluster, host, "cat", f"/proc/{kubelet_pid(node_cluster, host)}/cmdline")
        assert "--max-pods=55" in cmdline.split("\0")
        # the agent answered and wrote only its own keys: MCM's cordon and condition are MCM's to end
        assert after["spec"].get("unschedulable") is True
        assert ns.in_place_reason(after) == ns.READY_FOR_UPDATE
        assert ns.FAILED_REASON_ANNOTATION not in after["metadata"].get("annotations", {})
        # the Node the kubelet reports on took the new flag
        assert wait_until(lambda: node(node_cluster, host)["status"]["capacity"]["pods"] == "55", 60, 1)
    finally:
        mcm_state(kube, host.name, None)  # MCM's end of the update: labels, cordon, condition gone
    assert wait_until(lambda: ready(node_cluster, host), 60, 1)
