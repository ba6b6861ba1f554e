"""A KubeadmControlPlane upgraded in place by the real CAPI v1.14.2 KCP controller through our hooks:
3 replicas (CAPI refuses ``maxSurge: 0`` below 3), ``maxSurge: 0``, ``spec.version`` bumped by one minor.
KCP asks CanUpdateMachine per Machine and calls UpdateMachine one Machine at a time; our
kubernetes_version role runs kubeadm's upgrade procedure on the Machine's lab host.

Simulated, as in test_capi_rollout.py: CAPD's in-memory machines, and kubeadm/kubelet/kubectl/systemctl
on the hosts (stand-ins that log every call; the new release binaries come from the lab release
server, tests/e2e/conftest.py). Machine -> host through the service's inventory.

What CAPD's in-memory backend cannot support, found in CAPI's source: KCP marks a Machine UpToDate only
once its Node's kubelet reports the new version, and CAPD's fake Node never changes its kubeletVersion
(see the end of the test). So the test waits for what KCP and our service do (every Machine at the new
version and not Updating, one apply per host, kubeadm upgrade on each host, one Machine at a time) and
asserts KCP's own message naming the fake Node's version as the one thing left.
"""

from __future__ import annotations

import re

import pytest
from e2e.conftest import NEXT_VERSION, START_VERSION
from e2e.hostcheck import run_on, stamp_writes
from hostlab.lab import Host
from hostlab.lab import Lab as HostLab
from kubelab import objects
from kubelab.flavours import capi_objects as co
from playbooks.standins import CALLS_LOG

from .conftest import Extension
from .rollout import KCP, ROLLOUT_TIMEOUT, create_cluster, wait

pytestmark = [pytest.mark.kube, pytest.mark.capi, pytest.mark.lab]

RUN_STATE = re.compile(
    r"machine=(\S+) run=\S+ state=(started|successful|task_failed|unreachable|interrupted)"
)


def test_a_control_plane_minor_upgrade_is_done_in_place_through_kubeadm(
    capi_extension: Extension, hosts: list[Host], lab: HostLab
) -> None:
    cluster = create_cluster(capi_extension, "kcp", START_VERSION, md_replicas=0, cp_replicas=3)
    before = cluster.identities(cluster.cp_machines())
    names = sorted(before)
    capi_extension.map_machines(names)
    cluster.patch(KCP, cluster.kcp, {"spec": {"version": NEXT_VERSION}})

    def upgraded() -> bool:
        machines = cluster.cp_machines()
        replaced = {m["metadata"]["name"] for m in machines} - set(before)
        # fail at once, not at the timeout: a new Machine is never mapped to a lab host
        assert not replaced, f"KCP created {sorted(replaced)} instead of updating in place\n{explain()}"
        return (
            len(machines) == 3
            and all(m["spec"]["version"] == NEXT_VERSION for m in machines)
            and all(co.condition_status(m, "Updating") == "False" for m in machines)
            and all(len(stamp_writes(lab, host)) == 1 for host in hosts)
        )

    def explain() -> str:  # the Machines' conditions and KCP's own (its preflight checks say why it waits)
        return co.conditions_text(
            [*cluster.cp_machines(), *co.list_objects(cluster.lab, KCP, cluster.namespace)]
        )

    wait(upgraded, 2 * ROLLOUT_TIMEOUT, "control plane upgraded in place", explain)
    assert cluster.identities(cluster.cp_machines()) == before  # in place: same Machines
    for name, host in zip(names, hosts, strict=False):
        assert NEXT_VERSION in run_on(lab, host, ["kubelet", "--version"]), name
        calls = run_on(lab, host, ["cat", CALLS_LOG])
        assert re.search(r"^kubeadm\S* upgrade (apply \S+|node)", calls, re.M), calls
        assert len(stamp_writes(lab, host)) == 1, name
    log = capi_extension.log()
    assert re.search(r"hook=CanUpdateMachine\b", log)
    # one Machine at a time: no two UpdateMachine runs of this control plane overlapped
    runs = [
        (m.group(1), m.group(2)) for m in RUN_STATE.finditer(log) if m.group(1).startswith(cluster.namespace)
    ]
    in_flight = 0
    for _, state in runs:
        in_flight += 1 if state == "started" else -1
        assert in_flight <= 1, runs
    # What CAPD's in-memory backend cannot show: KCP keeps each Machine UpToDate=False until the Node's
    # kubelet reports the new version (kubeadmcontrolplane_controller.go:1153), and CAPD's fake Node keeps
    # the kubeletVersion it was created with (inmemorymachine_backend.go:333, never updated). With a real
    # kubelet the restarted kubelet reports it; here the hosts' kubelets (stand-ins) do, checked above.
    kcp = co.list_objects(cluster.lab, KCP, cluster.namespace)[0]
    rolling = objects.condition(kcp, "RollingOut") or {}
    assert f"kubeletVersion {START_VERSION}, {NEXT_VERSION} required" in rolling.get("message", ""), rolling
