"""``mcm-agent``'s identity in its Node claims: the flag, else the Pod's name (deploy/mcm), else random.
A restarted container keeps its Pod's name, so it resumes its own claims at once
(tests/mcm/test_agent_replicas.py shows what a kept identity does)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from inplace_extension.cli.mcm_agent import AGENT_ID_ENV, agent_id

REPO = Path(__file__).resolve().parents[2]


def test_the_agent_id_comes_from_the_flag_else_the_pod_name_else_is_random() -> None:
    assert agent_id("pod-1", {AGENT_ID_ENV: "pod-2"}) == "pod-1"
    assert agent_id(None, {AGENT_ID_ENV: "inplace-extension-mcm-agent-7d9f8-x2k4q"}) == (
        "inplace-extension-mcm-agent-7d9f8-x2k4q"
    )
    assert agent_id(None, {}) != agent_id(None, {})  # random: a new replica at every start
    with pytest.raises(ValueError, match="letters, digits"):
        agent_id("two words", {})


def test_the_shipped_agent_deployment_names_each_replica_by_its_pod() -> None:
    deployment = yaml.safe_load((REPO / "deploy" / "mcm" / "deployment.yaml").read_text())
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e for e in container["env"]}
    assert env[AGENT_ID_ENV]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
