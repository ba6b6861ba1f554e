"""The waits on MCM's rollout themselves (no lab: a pool whose objects the test hands out): a wait ends
at once when MCM deletes a Machine the pool started with, and its report says what the CI log needs."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from hostlab.errors import LabError
from kubelab.config import Config
from kubelab.flavours import mcm
from kubelab.lab import Lab

from inplace_extension.mcm import node_state as ns

from .agentproc import Pool
from .rollout_state import SELECTED_LABEL, wait_on_mcm

MOVED, WAITING = "pool-old-a", "pool-old-b"
CONTROLLER_LOG = [  # as MCM v0.62.1 logs the race (the CI run of ba585de), with lines of no interest
    "I1129 08:02:03.161040   15882 deployment_inplace.go:385] Attempting to transfer machine pool-old-a "
    "to new machine set pool-new",
    'I1129 08:02:03.161045   15882 deployment_rolling.go:400] Trying to annotate nodes under "pool-old"',
    "I1129 08:02:03.217099   15882 machineset.go:457] Too many replicas for  machines/pool-old, need 1, "
    "deleting 1",
    "I1129 08:02:03.217139   15882 machineset.go:469] Deleting stale machines [pool-old-a]",
    "I1129 08:02:04.100000   15882 worker.go:57] Error syncing ClusterMachineDeployment machines/pool: node "
    "label not found for machine pool-new-x",
    "I1129 08:02:05.100000   15882 worker.go:57] Error syncing ClusterMachineDeployment machines/pool: node "
    "label not found for machine pool-new-x",
    "I1129 08:02:05.200000   15882 machineset.go:457] Too many replicas for machines/other-old, need 0",
]


class HandedPool(Pool):
    """A pool whose MachineDeployment, MachineSets, Machines and Nodes the test hands out (no kubectl)."""

    def __init__(self, lab: Lab) -> None:  # no MachineDeployment to create
        self.lab, self.name, self.hosts, self.initial = lab, "pool", [], [MOVED, WAITING]
        self.listed: list[dict[str, Any]] = [machine(MOVED), machine(WAITING)]
        self.looks = 0

    def machines(self) -> list[dict[str, Any]]:
        self.looks += 1
        return self.listed

    def machine_sets(self) -> list[dict[str, Any]]:
        return [{"metadata": {"name": "pool-old"}, "spec": {"replicas": 1}, "status": {"replicas": 2}}]

    def deployment(self) -> dict[str, Any]:
        return {"status": {"replicas": 2, "updatedReplicas": 1}}

    def node(self, name: str) -> dict[str, Any]:
        if name != WAITING:
            return {}
        labels = {ns.CANDIDATE_LABEL: "true", SELECTED_LABEL: "true"}
        taints = [{"key": ns.CRITICAL_TAINT[0], "effect": "NoSchedule"}]
        conditions = [{"type": ns.CONDITION, "status": "True", "reason": ns.READY_FOR_UPDATE}]
        return {
            "metadata": {"name": name, "labels": labels, "annotations": {ns.CLAIM_ANNOTATION: "me 1"}},
            "spec": {"unschedulable": True, "taints": taints},
            "status": {"conditions": conditions},
        }


def machine(name: str, deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": {"node": name}}
    meta["ownerReferences"] = [{"name": "pool-old", "controller": True}]
    if deleting:
        meta["deletionTimestamp"] = "2026-11-29T08:02:03Z"
    return {"metadata": meta, "status": {"currentStatus": {"phase": "Running"}}}


@pytest.fixture
def pool(tmp_path: Path) -> HandedPool:
    lab = Lab("handed", Config(cache_dir=tmp_path, run_dir=tmp_path, go="go"))
    lab.dir.mkdir(parents=True)
    (lab.dir / f"{mcm.CONTROLLER}.log").write_text("\n".join(CONTROLLER_LOG) + "\n")
    return HandedPool(lab)


def test_a_wait_that_holds_lists_no_machine(pool: HandedPool) -> None:
    wait_on_mcm(pool, lambda: True, 5, "done")
    assert pool.looks == 0


def test_a_machine_mcm_deletes_ends_the_wait_with_the_report(pool: HandedPool) -> None:
    pool.listed = [machine(MOVED, deleting=True), machine(WAITING)]
    started = time.monotonic()
    with pytest.raises(AssertionError) as failed:
        wait_on_mcm(pool, lambda: False, 3, "the second run started", poll=0.01)
    assert time.monotonic() - started < 1, "at the first look, not at the end of the wait"
    report = str(failed.value).splitlines()
    assert report[0] == f"the second run started: MCM deleted Machine {MOVED} during the rollout"
    assert "MachineDeployment pool: replicas=2 updatedReplicas=1 availableReplicas=0" in report
    assert "MachineSet pool-old (): spec.replicas=1 replicas=2 availableReplicas=0" in report
    assert f"Machine {MOVED}: phase=Running set=pool-old DELETING / ''" in report
    assert f"Node {MOVED}: gone" in report
    assert (
        f"Node {WAITING}: inplace=ReadyForUpdate ready=False labels=candidate-for-update,selected-for-update "
        "taints=critical-components-not-ready unschedulable=True ours=mcm-agent-claim"
    ) in report
    tail = report[report.index(f"--- {mcm.CONTROLLER}: the last 20 of 4 messages of interest") + 1 :]
    assert tail[:2] == [
        "08:02:03.161 deployment_inplace.go:385] Attempting to transfer machine pool-old-a to new machine "
        "set pool-new",
        "08:02:03.217 machineset.go:457] Too many replicas for  machines/pool-old, need 1, deleting 1",
    ]
    assert tail[3].endswith("label not found for machine pool-new-x (x2)"), "a run of one message, counted"
    assert tail[4].startswith("--- static-hosts-machine-controller: [Errno 2]"), "no log: said so"


def test_a_wait_that_runs_out_says_so(pool: HandedPool) -> None:
    with pytest.raises(AssertionError, match=r"^MCM hands over: not within 0 s\nMachineDeployment pool"):
        wait_on_mcm(pool, lambda: False, 0.05, "MCM hands over", poll=0.01)


def test_a_report_without_the_api_server_still_has_the_logs(pool: HandedPool) -> None:
    def unanswered() -> dict[str, Any]:
        raise LabError("kubectl get: connection refused")

    pool.deployment = unanswered  # type: ignore[method-assign]
    with pytest.raises(AssertionError) as failed:
        wait_on_mcm(pool, lambda: False, 0.05, "MCM hands over", poll=0.01)
    report = str(failed.value).splitlines()
    assert report[1] == "the pool's objects could not be read: kubectl get: connection refused"
    assert report[5].endswith("Deleting stale machines [pool-old-a]"), "the logs still"
