"""The project's own update_machine.yml, once as a fresh ansible-playbook and once forked from the fork
server (plays/forkserver.py), on two lab hosts in the same state: the same job events (kind, task, role,
changed, rc, in order) and the same end state of the host."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hostlab.lab import Host, Lab

from .inputs import inputs
from .standins import install_standins, lab_run_on_host
from .support import (
    STATE_DIR,
    RunResult,
    RunSpec,
    calls,
    event_data,
    fork_server,
    fresh_plays,
    host_json_lines,
    new_fingerprint,
    run_update,
)

pytestmark = pytest.mark.lab

# as the service runs the play (plays/runner.py): its re-checks and the lock task left out, its lock token
SERVICE = "--skip-tags update_machine_recheck,update_machine_lock"
CAPS = ("kubeadm_files", "kubelet_args", "kubernetes_version")


def sequence(result: RunResult) -> list[tuple[Any, ...]]:
    out = []
    for event in result.events:
        data = event_data(event)
        res = data.get("res") or {}
        out.append(
            (event.get("event"), data.get("task"), data.get("role"), res.get("changed"), res.get("rc"))
        )
    return out


def end_state(lab: Lab, host: Host) -> dict[str, Any]:
    stamp = json.loads(lab.read_file(host, f"{STATE_DIR}/stamp.json"))
    return {
        "stamp": {key: stamp.get(key) for key in ("fingerprint", "steps")},
        "lock": [e["event"] for e in host_json_lines(lab, host, f"{STATE_DIR}/lock.log")],
        "files": {
            entry["path"]: lab.read_file(host, entry["path"])
            for entry in inputs("kubeadm_files")["kubeadm_files"]["kubeadm_files_files"]
        },
        "calls": calls(lab, host),
    }


def test_a_forked_play_is_the_fresh_play_on_the_host(lab: Lab, lab_hosts: list[Host], tmp_path: Path) -> None:
    fresh_host, forked_host = lab_hosts[0], lab_hosts[1]
    for host in (fresh_host, forked_host):
        install_standins(lab_run_on_host(lab, host), version="v1.30.2")
    changed = inputs(*CAPS)
    changed["kubeadm_files"]["kubeadm_files_files"][0]["content"] = "forked or fresh\n"
    rounds = [inputs(*CAPS), changed, changed]  # a first update, a change, the same fingerprint again
    fingerprints = [new_fingerprint(), new_fingerprint()]
    fingerprints.append(fingerprints[-1])
    fresh_before = fresh_plays()
    for number, update in enumerate(rounds):
        results = []
        for host, fresh in ((fresh_host, True), (forked_host, False)):
            spec = RunSpec(
                lab, host, tmp_path, update, step_fingerprints=True, cmdline=SERVICE, lock_token=True
            )
            spec.fresh = fresh
            spec.fingerprint = fingerprints[number]
            results.append(run_update(spec))
        fresh_run, forked_run = results
        assert fresh_run.status == forked_run.status == "successful", forked_run.failure_messages
        assert fresh_run.rc == forked_run.rc == 0
        assert sequence(fresh_run) == sequence(forked_run), number
        assert end_state(lab, fresh_host) == end_state(lab, forked_host), number
    assert fork_server().pid() is not None  # the forked plays had their server...
    assert fresh_plays() == fresh_before  # ...and it forked each of them
