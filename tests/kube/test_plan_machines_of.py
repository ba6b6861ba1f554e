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
