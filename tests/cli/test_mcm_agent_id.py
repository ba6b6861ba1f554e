"""``mcm-agent``'s identity in its Node claims: the flag, else the Pod's name (deploy/mcm), else random.
A restarted container keeps its Pod's name, so it resumes its own claims at once
(tests/mcm/test_agent_replicas.py shows what a kept identity does)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from inplace_extension.cli import build_parser
from inplace_extension.cli.flags import given_as
from inplace_extension.cli.mcm_agent import AGENT_ID_ENV, agent_id

REPO = Path(__file__).resolve().parents[2]


def parsed_agent_id(flags: list[str], monkeypatch: pytest.MonkeyPatch, variable: str | None) -> str:
    if variable is None:
        monkeypatch.delenv(AGENT_ID_ENV, raising=False)
    else:
        monkeypatch.setenv(AGENT_ID_ENV, variable)
    args = build_parser().parse_args(["mcm-agent", "--namespace", "n", *flags])
    return agent_id(args.agent_id, given_as(args, "agent_id"))


def test_the_agent_id_comes_from_the_flag_else_the_pod_name_else_is_random(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert parsed_agent_id(["--agent-id", "pod-1"], monkeypatch, "pod-2") == "pod-1"
    pod = "inplace-extension-mcm-agent-7d9f8-x2k4q"
    assert parsed_agent_id([], monkeypatch, pod) == pod
    assert parsed_agent_id([], monkeypatch, None) != parsed_agent_id([], monkeypatch, None)  # a new replica
    with pytest.raises(ValueError, match=r"^--agent-id 'two words': letters, digits"):
        parsed_agent_id(["--agent-id", "two words"], monkeypatch, None)
    with pytest.raises(ValueError, match=r"^INPLACE_AGENT_ID='two words': letters, digits"):
        parsed_agent_id([], monkeypatch, "two words")


def test_the_shipped_agent_deployment_names_each_replica_by_its_pod() -> None:
    deployment = yaml.safe_load((REPO / "deploy" / "mcm" / "deployment.yaml").read_text())
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e for e in container["env"]}
    assert env[AGENT_ID_ENV]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
