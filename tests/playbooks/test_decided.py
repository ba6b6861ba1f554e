"""The service's ``update_machine_decided`` (plays/runner.py's ``decided``) is what update_machine.yml decides
by its own rules (no lab needed).

The service gives the play three of its decisions per host (where the first step takes the host lock,
whether kubeadm_files and kubelet_args run in one module execution, whether the run is the host's whole
update and may stamp), so that ansible-core does not compile the play's biggest templates at every use
(bench/README.md, issue 40). A play run by hand makes them itself (``update_machine_*_by_play``). Here a
real ``ansible-playbook`` (through ansible-runner, ``connection: local``, nothing runs on a host) templates
the play's own rules with update_machine.yml's very ``vars:``, the host variables the service writes and the
``--skip-tags`` it passes, for batches of every shape, and the answers must be the service's.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import ansible_runner
import pytest
import yaml

from inplace_extension.plays import runner
from inplace_extension.runs.model import CommandCheck
from inplace_extension.runs.resolve import HostTarget

PLAYBOOKS = Path(__file__).resolve().parents[2] / "playbooks"
DECISIONS = ("lock_rides_on", "joint", "whole_run")
TARGET = HostTarget("127.0.0.1", 22, None, None, True, (), True, None, "inventory")


def host(tmp: Path, name: str, capabilities: tuple[str, ...], **fields: Any) -> runner.HostRun:
    attempt = tmp / name
    attempt.mkdir()
    return runner.HostRun(
        ident=name,
        host_name=name,
        fingerprint="f" * 64,
        capabilities=capabilities,
        inputs={cap: {} for cap in capabilities},
        target=TARGET,
        attempt_dir=attempt,
        **fields,
    )


def batches(tmp: Path) -> dict[str, runner.BatchSpec]:
    """Batches of the shapes the service makes: one host; hosts that differ in their first step, lock token,
    drain point, user-defined step and joint steps; and one with the health gate's command checks."""

    def spec(name: str, hosts: list[runner.HostRun], **fields: Any) -> runner.BatchSpec:
        return runner.BatchSpec(
            ident=name,
            batch_dir=tmp,
            hosts=tuple(hosts),
            playbook=PLAYBOOKS / "update_machine.yml",
            ansible_cfg=None,
            state_dir=tmp,
            wrapper=tmp,
            **fields,
        )

    token = {"lock_token": "t" * 32}
    files_args = ("kubeadm_files", "kubelet_args")
    return {
        "one host, files and flags": spec("one", [host(tmp, "one-a", files_args, **token)]),
        "every host rides and joins": spec(
            "all",
            [host(tmp, "all-a", files_args, **token), host(tmp, "all-b", ("ntp", *files_args), **token)],
        ),
        "mixed": spec(
            "mixed",
            [
                host(tmp, "mixed-a", files_args, **token),
                host(tmp, "mixed-b", ("users", "ntp"), **token),
                host(tmp, "mixed-c", ("kubernetes_version",), **token),
                host(tmp, "mixed-d", ("kubeadm_files",)),  # no lock token: the lock task takes it
                host(tmp, "mixed-e", ("ntp", *files_args), drain_before="kubelet_args", **token),
                host(tmp, "mixed-f", ("kubelet_args", "extra"), roles={"extra": "extra_role"}, **token),
                host(tmp, "mixed-g", ("kubeadm_files", "kubernetes_version"), drain_before="kubeadm_files"),
            ],
        ),
        "health gate": spec(
            "health",
            [host(tmp, "health-a", files_args, **token), host(tmp, "health-b", ("users",), **token)],
            host_checks=(CommandCheck("ready", ("true",), 5.0),),
        ),
    }


def play_rules(tmp: Path) -> Path:
    """A play with update_machine.yml's own ``vars:`` (no ``update_machine_decided``: its rules) that
    answers the three decisions per host, on the controller."""
    vars_ = yaml.safe_load((PLAYBOOKS / "update_machine.yml").read_text())[0]["vars"]
    answer = {d: f"{{{{ update_machine_{d}_by_play }}}}" for d in DECISIONS}
    play = [
        {
            "hosts": "all",
            "gather_facts": False,
            "connection": "local",
            "vars": vars_,
            "tasks": [
                {
                    "name": "The play's own decisions",
                    "ansible.builtin.debug": {"msg": answer},
                    "tags": ["always"],
                }
            ],
        }
    ]
    path = tmp / "rules.yml"
    path.write_text(yaml.safe_dump(play, sort_keys=False))
    return path


def by_play(tmp: Path, spec: runner.BatchSpec) -> dict[str, dict[str, Any]]:
    """What update_machine.yml's rules decide for each host of ``spec``, with the service's host variables
    and ``--skip-tags``."""
    hosts: dict[str, Any] = {}
    for run in spec.hosts:
        inputs = run.attempt_dir / "inputs.json"
        inputs.write_text(json.dumps({cap: {} for cap in run.capabilities}))
        hosts[run.host_name] = runner.run_parameters(run, inputs)
        if spec.host_checks:  # as runner.start writes it
            hosts[run.host_name]["update_machine_health_file"] = str(run.attempt_dir / "health_checks.json")
    data = tmp / f"runner-{spec.ident}"
    data.mkdir()
    result = ansible_runner.run(
        private_data_dir=str(data),
        playbook=str(play_rules(tmp)),
        inventory={"all": {"hosts": hosts}},
        cmdline=f"--skip-tags {','.join(runner.skip_tags(spec))}",
        # ansible-playbook of this interpreter's environment, as the service's plays (runner.py)
        envvars={"PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])},
        quiet=True,
    )
    assert result.status == "successful", result.stdout.read()
    answers = {
        event["event_data"]["host"]: event["event_data"]["res"]["msg"]
        for event in result.events
        if event.get("event") == "runner_on_ok"
    }
    assert set(answers) == {run.host_name for run in spec.hosts}
    return answers


@pytest.mark.parametrize(
    "shape", ["one host, files and flags", "every host rides and joins", "mixed", "health gate"]
)
def test_the_services_decisions_are_the_plays_own(tmp_path: Path, shape: str) -> None:
    spec = batches(tmp_path)[shape]
    played = by_play(tmp_path, spec)
    for run in spec.hosts:
        assert runner.decided(spec, run) == played[run.host_name], run.host_name
        # what the service leaves out of a batch is never what one of its hosts needs: each may stamp
        assert played[run.host_name]["whole_run"] is True, run.host_name


def test_the_cases_cover_every_answer(tmp_path: Path) -> None:
    """Each decision takes each of its values in the batches above (else the comparison proves less)."""
    seen: dict[str, set[Any]] = {d: set() for d in DECISIONS}
    for spec in batches(tmp_path).values():
        for run in spec.hosts:
            for name, value in runner.decided(spec, run).items():
                seen[name].add(value)
    assert seen["lock_rides_on"] == {"", "ntp", "kubeadm_files", "kubelet_args"}
    assert seen["joint"] == {True, False}


def test_the_play_takes_the_services_decisions_only_when_given() -> None:
    """update_machine.yml's three variables read ``update_machine_decided`` when it is defined and ask the
    play's own rule (through the vars lookup, so that it is not templated otherwise) when it is not."""
    vars_ = yaml.safe_load((PLAYBOOKS / "update_machine.yml").read_text())[0]["vars"]
    for name in DECISIONS:
        expression = " ".join(str(vars_[f"update_machine_{name}"]).split())
        assert expression == (
            f"{{{{ update_machine_decided.{name} if update_machine_decided is defined "
            f"else lookup('ansible.builtin.vars', 'update_machine_{name}_by_play') }}}}"
        )
