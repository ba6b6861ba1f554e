"""deploy/mcm/ against a real API server: the agent's Deployment and RBAC pass a server-side dry run
(nothing is stored), and the RBAC grants exactly what the agent does and no more."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from kubelab import manifests, objects
from kubelab.lab import Lab

pytestmark = pytest.mark.kube

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "mcm"


def test_deploy_mcm_passes_a_server_side_dry_run(kubelab: Lab) -> None:
    # namespaced resources are judged inside their namespace, which a dry run would not create
    for namespace in ("inplace-extension-mcm", "machines"):
        objects.ensure_namespace(kubelab, namespace)
    result = manifests.dry_run_kustomize(kubelab, DEPLOY)
    assert result.returncode == 0, result.stderr
    kinds = {
        line.split("/")[0].split(".")[0] for line in result.stdout.splitlines() if "server dry run" in line
    }
    assert {"deployment", "serviceaccount", "clusterrole", "clusterrolebinding", "rolebinding"} <= kinds


def test_rbac_is_what_the_agent_needs() -> None:
    docs = [d for d in yaml.safe_load_all((DEPLOY / "rbac.yaml").read_text()) if d]
    rules = {
        (d["metadata"]["name"], res): tuple(rule["verbs"])
        for d in docs
        if d["kind"] == "ClusterRole"
        for rule in d["rules"]
        for res in rule["resources"]
    }
    target, control = "inplace-extension-mcm-agent-target", "inplace-extension-mcm-agent-control"
    assert rules == {
        (target, "nodes"): ("get", "list", "watch", "patch"),
        (target, "pods"): ("list", "delete"),
        (target, "events"): ("create",),
        **{
            (control, r): ("get", "list", "watch")
            for r in ("machines", "machinesets", "machinedeployments", "machineclasses")
        },
        (control, "secrets"): ("get",),  # an AWS MachineClass's credentials (mcm/aws_tags.py)
    }
