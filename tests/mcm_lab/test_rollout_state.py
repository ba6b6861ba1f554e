"""The waits on MCM's rollout themselves (no lab: a pool whose objects the test hands out): a wait ends
at once when MCM deletes a Machine the pool started with, and its report says what the CI log needs."""

from __future__ import annotations

import os
import re
import subprocess
import sys
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
from .rollout_state import MOVE_RACE, SELECTED_LABEL, wait_on_mcm

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
    assert report[0] == (
        f"the second run started: {MOVE_RACE}: 08:02:03.161 deployment_inplace.go:385] Attempting to "
        f"transfer machine {MOVED} to new machine set pool-new / 08:02:03.217 machineset.go:469] Deleting "
        f"stale machines [{MOVED}]"
    ), "the race named, with MCM's two lines that show it"
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


@pytest.mark.parametrize(
    "log",
    [
        [line for line in CONTROLLER_LOG if "Attempting to transfer" not in line],  # no move started
        [line.replace(f"[{MOVED}]", "[pool-old-c]") for line in CONTROLLER_LOG],  # another Machine's
        [],
    ],
    ids=["no-move", "another-machine", "no-log-lines"],
)
def test_a_deletion_the_log_does_not_show_as_the_race_is_not_called_it(
    pool: HandedPool, log: list[str]
) -> None:
    """Only the race is named as the race (the tests rerun on it): any other deletion fails as it is."""
    (pool.lab.dir / f"{mcm.CONTROLLER}.log").write_text("".join(f"{line}\n" for line in log))
    pool.listed = [machine(MOVED, deleting=True), machine(WAITING)]
    with pytest.raises(AssertionError) as failed:
        wait_on_mcm(pool, lambda: False, 3, "the second run started", poll=0.01)
    assert str(failed.value).splitlines()[0] == (
        f"the second run started: MCM deleted Machine {MOVED} during the rollout"
    )
    assert MOVE_RACE not in str(failed.value)


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


RERUN_PROBE = """
import pytest
from pathlib import Path

from mcm_lab.rollout_state import MOVE_RACE, RERUN_ON_MOVE_RACE

pytestmark = [RERUN_ON_MOVE_RACE]
TRIES = Path(__file__).with_name("tries")


def fail_first(message: str) -> None:
    tries = int(TRIES.read_text()) if TRIES.exists() else 0
    TRIES.write_text(str(tries + 1))
    assert tries > 0, message


def test_race() -> None:
    fail_first(f"the second run started: {MOVE_RACE}: the two lines")


def test_other() -> None:
    fail_first("the second run started: MCM deleted Machine pool-old-a during the rollout")
"""


@pytest.mark.parametrize(
    ("test", "outcomes", "tries"),
    [("test_race", {"passed": 1, "rerun": 1}, 2), ("test_other", {"failed": 1}, 1)],
)
def test_the_mcm_modules_run_a_test_again_only_when_it_met_the_race(
    test: str, outcomes: dict[str, int], tries: int, tmp_path: Path
) -> None:
    """The marker of the MCM modules, run by pytest in a subprocess on a probe that fails at its first try."""
    probe = tmp_path / "test_probe.py"
    probe.write_text(RERUN_PROBE)
    tests_dir = Path(__file__).resolve().parents[1]
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-q",
            "-n",
            "0",
            "-o",
            "addopts=",
            f"--rootdir={tmp_path}",
            f"{probe}::{test}",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(tests_dir), *sys.path])},
    )
    summary = done.stdout.strip().splitlines()[-1]
    said = {kind: int(count) for count, kind in re.findall(r"(\d+) (passed|failed|rerun)", summary)}
    assert said == outcomes, done.stdout
    assert (tmp_path / "tries").read_text() == str(tries)
