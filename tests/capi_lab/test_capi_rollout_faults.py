"""In-place rollouts by the real CAPI v1.14.2 when things go wrong, and a change we do not claim: a task
failure on one host, the service SIGKILLed mid-update, a DevMachineTemplate change (replaced).

Real and simulated parts, and the Machine -> host mapping (the service's inventory), as in
test_capi_rollout.py.
"""

from __future__ import annotations

import re
import time

import pytest
from e2e.hostcheck import run_on, stamp_writes
from hostlab import faults
from hostlab.lab import Host
from hostlab.lab import Lab as HostLab
from kubelab import objects
from kubelab.flavours import capi_objects as co

from .rollout import (
    CAPI_FAILURE,
    HOST_FILE,
    MACHINES,
    MD,
    ROLLOUT_TIMEOUT,
    Cluster,
    files_and_user,
    rolled_out,
    updating,
    wait,
)

pytestmark = [pytest.mark.kube, pytest.mark.capi, pytest.mark.lab]

RETRY = "inplace-extension.io/retry"
STALL_OBSERVATION = 10.0  # how long the stalled rollout is watched for a second Machine going down


def test_a_task_failure_stalls_the_rollout_until_the_retry_annotation(
    md_cluster: Cluster, hosts: list[Host], lab: HostLab
) -> None:
    before = md_cluster.identities(md_cluster.md_machines())
    names = sorted(before)
    md_cluster.ext.map_machines(names)
    broken, broken_host = names[0], hosts[0]
    faults.fail_next(lab, broken_host, "useradd")  # the users role's useradd fails once on this host
    template = md_cluster.new_bootstrap_template(files_and_user("after a failure", "capifail"))

    def shows_failure() -> bool:
        machine = next(m for m in md_cluster.md_machines() if m["metadata"]["name"] == broken)
        updating = objects.condition(machine, "Updating") or {}
        return updating.get("message") == CAPI_FAILURE

    wait(
        shows_failure,
        ROLLOUT_TIMEOUT,
        f"{broken} shows CAPI's hook failure",
        lambda: co.conditions_text(md_cluster.md_machines()),
    )
    # CAPI keeps backing off on the failed Machine; the rollout never takes a second one down
    deadline = time.monotonic() + STALL_OBSERVATION
    while time.monotonic() < deadline:
        down = updating(md_cluster)
        assert down == [broken], down
        assert not rolled_out(md_cluster, template)
        time.sleep(1.0)
    # what CAPI v1.14 shows is only its generic message; ours is in the service's log and metrics
    machine = next(m for m in md_cluster.md_machines() if m["metadata"]["name"] == broken)
    assert co.condition_status(machine, "UpToDate") == "False"
    log = md_cluster.ext.log()
    assert re.search(
        rf"machine={md_cluster.namespace}/{broken} run=\S+ failed: capability=users task=", log
    ), log[-3000:]
    assert re.search(rf"hook=UpdateMachine machine={md_cluster.namespace}/{broken} .*decision=failed", log)
    scrape = md_cluster.ext.metrics()
    assert re.search(r'^inplace_extension_runs_total\{outcome="task_failed"\} [1-9]', scrape, re.M), scrape
    # a new retry value: the Machine update event makes CAPI reconcile (and call UpdateMachine) at once,
    # without waiting out its exponential backoff
    md_cluster.annotate(MACHINES, broken, RETRY, "1")
    wait(
        lambda: rolled_out(md_cluster, template),
        ROLLOUT_TIMEOUT,
        "rollout finished after the retry",
        lambda: co.conditions_text(md_cluster.md_machines()),
    )
    assert md_cluster.identities(md_cluster.md_machines()) == before
    for name, host in zip(names, hosts, strict=False):
        assert run_on(lab, host, ["cat", HOST_FILE]) == "after a failure\n", name
        assert len(stamp_writes(lab, host)) == 1, name


def test_a_service_killed_mid_update_finishes_after_restart_with_one_apply(
    md_cluster: Cluster, hosts: list[Host], lab: HostLab
) -> None:
    ext = md_cluster.ext
    before = md_cluster.identities(md_cluster.md_machines())
    names = sorted(before)
    ext.map_machines(names)
    started = ext.log().count("state=started")
    template = md_cluster.new_bootstrap_template(files_and_user("after a kill", "capifail", "capikill"))
    wait(lambda: ext.log().count("state=started") > started, ROLLOUT_TIMEOUT, "an UpdateMachine run started")
    ext.kill()  # SIGKILL while the play runs (it goes on, detached, and releases the host lock)
    ext.restart()
    wait(
        lambda: rolled_out(md_cluster, template),
        ROLLOUT_TIMEOUT,
        "rollout finished after the restart",
        lambda: co.conditions_text(md_cluster.md_machines()),
    )
    assert md_cluster.identities(md_cluster.md_machines()) == before
    for name, host in zip(names, hosts, strict=False):
        assert run_on(lab, host, ["cat", HOST_FILE]) == "after a kill\n", name
        assert len(stamp_writes(lab, host)) == 1, name  # one apply per host, the killed run's or the retry's


def test_a_dev_machine_template_change_replaces_the_machines(md_cluster: Cluster) -> None:
    # runs last in this module: the Machines it leaves have new names
    before = md_cluster.identities(md_cluster.md_machines())
    template = f"{md_cluster.md}-slower"
    objects.apply(
        md_cluster.lab,
        co.dev_machine_template(
            template, md_cluster.namespace, {"vm": {"provisioning": {"startupDuration": "2s"}}}
        ),
    )
    decisions = md_cluster.ext.log().count("hook=CanUpdateMachineSet")
    md_cluster.patch(
        MD, md_cluster.md, {"spec": {"template": {"spec": {"infrastructureRef": {"name": template}}}}}
    )

    def replaced() -> bool:
        machines = md_cluster.md_machines()
        status = md_cluster.deployment().get("status", {})
        return (
            len(machines) == 3
            and not set(md_cluster.identities(machines)) & set(before)
            and all(co.running(m) for m in machines)
            and status.get("upToDateReplicas") == 3
        )

    wait(replaced, ROLLOUT_TIMEOUT, "Machines replaced", lambda: co.conditions_text(md_cluster.md_machines()))
    assert md_cluster.ext.log().count("hook=CanUpdateMachineSet") > decisions  # CAPI asked; we declined
