"""A maintenance window that opens during a real in-place rollout: the real CAPI controllers call
UpdateMachine, our service answers "waiting for maintenance window" with retryAfterSeconds up to the
opening, nothing is started on the host before it, and the rollout finishes once the window is open.

The service is restarted with a capabilities file that adds a window scoped to this test's cluster
(its ``cluster.x-k8s.io/cluster-name`` label), so the other clusters of the session are not held.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from e2e.conftest import START_VERSION
from e2e.hostcheck import run_on, stamp_writes
from hostlab.lab import Host
from hostlab.lab import Lab as HostLab
from kubelab import objects
from kubelab.flavours import capi_objects as co

from .conftest import Extension
from .rollout import (
    HOST_FILE,
    ROLLOUT_TIMEOUT,
    Cluster,
    create_cluster,
    files_and_user,
    owned_by_template,
    updated_in_place,
    wait,
)

pytestmark = [pytest.mark.kube, pytest.mark.capi, pytest.mark.lab]
CLUSTER = "win"
WINDOW = "win-nights"
# long enough for CAPI to reach UpdateMachine (CanUpdateMachineSet, the new MachineSet, the move)
LEAD = timedelta(seconds=100)


def next_minute_after(moment: datetime) -> datetime:
    return (moment + timedelta(minutes=1)).replace(second=0, microsecond=0)


@pytest.fixture
def window_cluster(capi_extension: Extension, e2e_capabilities: Path) -> Iterator[tuple[Cluster, datetime]]:
    """A cluster of one worker, and the service restarted with a window for it that opens soon."""
    cluster = create_cluster(capi_extension, CLUSTER, START_VERSION, md_replicas=1)
    opens = next_minute_after(datetime.now(UTC) + LEAD)
    lab_settings = e2e_capabilities.read_text()
    window = (
        "maintenance_windows:\n"
        f"  - name: {WINDOW}\n"
        f"    cron: '{opens.minute} {opens.hour} * * *'\n"
        "    duration: 1h\n"
        f"    labels: {{cluster.x-k8s.io/cluster-name: {CLUSTER}}}\n"
    )
    e2e_capabilities.write_text(lab_settings + window)
    capi_extension.kill()
    capi_extension.restart()
    try:
        yield cluster, opens
    finally:
        e2e_capabilities.write_text(lab_settings)
        capi_extension.kill()
        capi_extension.restart()


def test_a_rollout_waits_for_its_window_and_finishes_once_it_opens(
    window_cluster: tuple[Cluster, datetime], hosts: list[Host], lab: HostLab
) -> None:
    cluster, opens = window_cluster
    (name,) = sorted(cluster.identities(cluster.md_machines()))
    cluster.ext.map_machines([name])
    template = cluster.new_bootstrap_template(files_and_user("in its window", "capiwin"))
    expected = f'waiting for maintenance window "{WINDOW}" (opens {opens:%Y-%m-%dT%H:%M}Z)'

    def machine() -> dict[str, object]:
        return next(m for m in cluster.md_machines() if m["metadata"]["name"] == name)

    def waiting() -> bool:
        updating = objects.condition(machine(), "Updating") or {}
        return expected in str(updating.get("message", ""))

    explain = lambda: co.conditions_text(cluster.md_machines())  # noqa: E731
    wait(waiting, LEAD.total_seconds(), f"{name} shows: {expected}", explain)
    assert datetime.now(UTC) < opens, "the test saw the wait only after the opening: raise LEAD"
    assert not list(cluster.ext.runs_dir.glob(f"{cluster.namespace}.{name}.*")), "nothing started yet"
    assert lab.exec_in(hosts[0], ["cat", HOST_FILE]).stdout != "in its window\n"

    until_done = (opens - datetime.now(UTC)).total_seconds() + ROLLOUT_TIMEOUT
    wait(
        lambda: owned_by_template(cluster, template) and updated_in_place(cluster.md_machines(), 1),
        until_done,
        "the rollout finished after the window opened",
        explain,
    )
    assert run_on(lab, hosts[0], ["cat", HOST_FILE]) == "in its window\n"
    assert len(stamp_writes(lab, hosts[0])) == 1
    (meta,) = cluster.ext.runs_dir.glob(f"{cluster.namespace}.{name}.*/attempt-*/meta.json")
    started = json.loads(meta.read_text())["started"]
    assert started >= opens.timestamp(), "the attempt started only once the window was open"
    assert time.time() >= opens.timestamp()
