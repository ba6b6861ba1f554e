"""A Metal3 kubelet-args change on a lab host: the plan leaves the templated entries to kubeadm's join.

The host is prepared as kubeadm leaves a Metal3 node after join: ``kubeadm-flags.env`` holds the
rendered ``node-labels`` and ``provider-id`` (cloud-init rendered ``{{ ds.meta_data.* }}`` at
bootstrap). The plan of a ``max-pods`` change beside the unchanged templated entries runs through the
real playbook; ``kubelet``/``systemctl`` are STAND-INS (standins.py), as in test_roles.py.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from hostlab.lab import Host, Lab

from inplace_extension.inplace.plan import plan_update

from .support import RunSpec, host_root, run_update

pytestmark = pytest.mark.lab

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "capi" / "update_machine" / "6B.request.json"
FLAGS = "/var/lib/kubelet/kubeadm-flags.env"
RENDERED = 'KUBELET_KUBEADM_ARGS="--node-labels=metal3.io/uuid=4f1c2d --provider-id=metal3://ns/bmh-0/m-0"\n'
METAL3_ARGS = [
    {"name": "node-labels", "value": "metal3.io/uuid={{ ds.meta_data.uuid }}"},
    {"name": "provider-id", "value": "metal3://{{ ds.meta_data.providerid }}"},
    {"name": "max-pods", "value": "120"},
]


def desired() -> dict[str, Any]:
    body = json.loads(FIXTURE.read_text())
    spec = body["desired"]["bootstrapConfig"]["spec"]
    spec.clear()
    spec["joinConfiguration"] = {"nodeRegistration": {"kubeletExtraArgs": copy.deepcopy(METAL3_ARGS)}}
    body["desired"]["machine"]["spec"].pop("version", None)
    return dict(body["desired"])


def test_max_pods_lands_and_the_join_rendered_templates_stay(lab: Lab, host: Host, tmp_path: Path) -> None:
    host_root(lab, host, ["sh", "-c", f"mkdir -p /var/lib/kubelet && cat >{FLAGS}"], stdin=RENDERED)
    plan = plan_update(desired())
    assert [step.capability for step in plan.steps] == ["kubelet_args"]
    inputs = {step.capability: step.inputs for step in plan.steps}
    assert inputs == {"kubelet_args": {"kubelet_args_extra_args": [{"name": "max-pods", "value": "120"}]}}
    result = run_update(RunSpec(lab, host, tmp_path, inputs, fingerprint=plan.fingerprint))
    assert result.status == "successful", result.failure_messages
    env = lab.read_file(host, "/etc/default/kubelet")
    assert "--max-pods=120" in env
    assert "{{" not in env and "node-labels" not in env and "provider-id" not in env
    assert lab.read_file(host, FLAGS) == RENDERED  # kubelet keeps the label and provider ID from join
