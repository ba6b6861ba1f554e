"""``plan --machines-of md/NAME`` against the kubelab's real API server with CAPI's MachineDeployment and
Machine CRDs (from the pinned module): the owner's Machines are listed by CAPI's deployment label, and
each one's host resolves from its live ``status.addresses`` as UpdateMachine resolves it in the
Kubernetes-aware mode. Read-only: the objects are the same afterwards. No controller runs; the Machines
are bare objects with their status set as CAPI sets it.
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import pytest
import yaml
from kubelab import manifests, objects
from kubelab.flavours import capi_objects as co
from kubelab.flavours import mcm, mcm_objects
from kubelab.lab import Lab

from inplace_extension.cli import main

from .conftest import MACHINES_CRD, create_machine

pytestmark = pytest.mark.kube
ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "plan"
DEPLOYMENT_LABEL = "cluster.x-k8s.io/deployment-name"


@pytest.fixture(autouse=True)
def no_settings_from_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in [name for name in os.environ if name.startswith("INPLACE_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))


def test_the_machines_of_a_machine_deployment_come_from_the_cluster_with_their_addresses(
    kubelab: Lab, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    deployments = manifests.capi_crd(kubelab, "cluster.x-k8s.io_machinedeployments.yaml")
    manifests.install_crds(
        kubelab, [manifests.capi_crd(kubelab, MACHINES_CRD), deployments], only_missing=True
    )
    # the namespace of the example objects (the preview's): names of this test's own
    ns, md = "default", f"md-{uuid.uuid4().hex[:6]}"
    objects.apply(kubelab, co.machine_deployment(md, ns, "c1", 2, "v1.30.0", "md-0-v1", "md-0-v1"))
    for name, owner, address in (
        (f"{md}-b", md, "10.77.3.12"),
        (f"{md}-a", md, "10.77.3.11"),
        (f"{md}-other", f"{md}-other", "10.77.3.13"),
    ):
        create_machine(kubelab, ns, name, [{"type": "InternalIP", "address": address}], None)
        kubelab.kubectl("label", "machine.cluster.x-k8s.io", name, "-n", ns, f"{DEPLOYMENT_LABEL}={owner}")
    before = objects.get(kubelab, "machine.cluster.x-k8s.io", f"{md}-a", ns)
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(
        yaml.safe_dump({"defaults": {"user": "ansible", "insecure_skip_host_key_check": True}})
    )
    code = main(
        [
            "plan",
            "--old",
            str(EXAMPLES / "capi-old.yaml"),
            "--new",
            str(EXAMPLES / "capi-new.yaml"),
            f"--machines-of=md/{md}",
            "--namespace",
            ns,
            "--kubeconfig",
            str(kubelab.kubeconfig),
            "--inventory",
            str(inventory),
            "--allowed-cidrs",
            "10.77.0.0/16",
            "-o",
            "json",
        ]
    )
    out, err = capsys.readouterr()
    assert code == 0, err
    machines = json.loads(out)["machines"]
    assert [m["name"] for m in machines] == [f"{ns}/{md}-a", f"{ns}/{md}-b"]
    assert [(m["host"]["address"], m["host"]["source"]) for m in machines] == [
        ("10.77.3.11", "machine status"),
        ("10.77.3.12", "machine status"),
    ]
    after = objects.get(kubelab, "machine.cluster.x-k8s.io", f"{md}-a", ns)
    assert after is not None and before is not None
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]  # read-only


def test_the_nodes_of_an_mcm_machine_deployment_come_from_the_cluster_with_their_addresses(
    kubelab: Lab, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--machines-of mcd/NAME``: the MCM MachineDeployment's Machines (those its selector selects, MCM's
    CRDs from the pinned module) and each one's Node (MCM's ``node.gardener.cloud/machine-name`` label),
    whose host resolves from the Node's live ``status.addresses``; a Machine of another deployment and its
    Node are left out. Read-only."""
    manifests.install_crds(kubelab, mcm.crd_files(kubelab), only_missing=True)
    ns, md = "machines", f"pool-{uuid.uuid4().hex[:6]}"
    kubelab.kubectl("create", "namespace", ns, check=False)
    deployment = mcm_objects.machine_deployment(md, "pool-a-v1", 2)
    deployment["metadata"]["namespace"] = ns
    objects.apply(kubelab, deployment)
    for machine, labels, address in (
        (f"{md}-b", {"name": md}, "10.77.4.12"),
        (f"{md}-a", {"name": md}, "10.77.4.11"),
        (f"{md}-other", {"name": f"{md}-other"}, "10.77.4.13"),
    ):
        objects.apply(
            kubelab,
            {
                "apiVersion": mcm_objects.API_VERSION,
                "kind": "Machine",
                "metadata": {"name": machine, "namespace": ns, "labels": labels},
                "spec": {"class": {"kind": "MachineClass", "name": "pool-a-v1"}},
            },
        )
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": f"node-{machine}", "labels": {"node.gardener.cloud/machine-name": machine}},
        }
        objects.apply(kubelab, node)
        status = {"status": {"addresses": [{"type": "InternalIP", "address": address}]}}
        kubelab.kubectl(
            "patch",
            "node",
            f"node-{machine}",
            "--subresource=status",
            "--type=merge",
            "-p",
            json.dumps(status),
        )
    before = objects.get(kubelab, "node", f"node-{md}-a", None)
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(
        yaml.safe_dump({"defaults": {"user": "ansible", "insecure_skip_host_key_check": True}})
    )
    try:
        code = main(
            [
                "plan",
                "--old",
                str(EXAMPLES / "mcm-old.yaml"),
                "--new",
                str(EXAMPLES / "mcm-new.yaml"),
                f"--machines-of=mcd/{md}",
                "--namespace",
                ns,
                "--kubeconfig",
                str(kubelab.kubeconfig),
                "--inventory",
                str(inventory),
                "--allowed-cidrs",
                "10.77.0.0/16",
                "-o",
                "json",
            ]
        )
        out, err = capsys.readouterr()
        assert code == 0, err
        machines = json.loads(out)["machines"]
        assert [m["name"] for m in machines] == [f"{ns}/node-{md}-a", f"{ns}/node-{md}-b"], machines
        assert [(m["host"]["address"], m["host"]["source"]) for m in machines] == [
            ("10.77.4.11", "machine status"),
            ("10.77.4.12", "machine status"),
        ]
        after = objects.get(kubelab, "node", f"node-{md}-a", None)
        assert after is not None and before is not None
        assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]  # read-only
        # a MachineDeployment that does not exist, and a CAPI owner with MachineClass files: precise errors
        for owner, message in ((f"mcd/{md}-gone", "not found"), (f"md/{md}", "give mcd/NAME")):
            code = main(
                [
                    "plan",
                    "--old",
                    str(EXAMPLES / "mcm-old.yaml"),
                    "--new",
                    str(EXAMPLES / "mcm-new.yaml"),
                    f"--machines-of={owner}",
                    "--namespace",
                    ns,
                    "--kubeconfig",
                    str(kubelab.kubeconfig),
                ]
            )
            out, err = capsys.readouterr()
            assert code == 2 and message in err, (code, err)
    finally:
        for machine in (f"{md}-a", f"{md}-b", f"{md}-other"):
            kubelab.kubectl("delete", "node", f"node-{machine}", "--ignore-not-found", check=False)
