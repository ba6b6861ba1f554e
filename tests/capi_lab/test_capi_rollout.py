"""Real in-place rollouts, end to end: the real CAPI v1.14.2 controllers decide and call our hooks, our
service runs Ansible over SSH onto hostlab hosts. No emulator anywhere.

Real: kube-apiserver, CAPI core/KCP/CABPK/CAPD controllers, our service (TLS, registered through an
ExtensionConfig), ansible-runner + SSH, the hosts' files and users. Simulated: the machines' cloud
(CAPD's in-memory backend: no VMs, a fake workload API server per cluster), the Kubernetes binaries on
the hosts (stand-ins, tests/playbooks/standins.py) and their download source (the lab release server).

Machine -> host: through the service's **inventory** (one entry per Machine name, with the host's
address and its pinned SSH host key), written once CAPI has named the Machines; the service enforces
``--allowed-cidrs`` (the hostlab network) as in production. Not the address annotation: an annotation
in the MachineDeployment template would give every Machine the same host, and the inventory is where
production keeps the host keys anyway. In-place updates keep the Machine names, so the mapping holds
through a rollout.
"""

from __future__ import annotations

import re

import pytest
from e2e.hostcheck import run_on, stamp_writes
from hostlab.lab import Host
from hostlab.lab import Lab as HostLab
from kubelab.flavours import capi_objects as co

from .rollout import HOST_FILE, ROLLOUT_TIMEOUT, Cluster, files_and_user, rolled_out, wait

pytestmark = [pytest.mark.kube, pytest.mark.capi, pytest.mark.lab]


def test_a_new_kubeadm_config_template_is_applied_in_place(
    md_cluster: Cluster, hosts: list[Host], lab: HostLab
) -> None:
    before = md_cluster.identities(md_cluster.md_machines())
    names = sorted(before)
    md_cluster.ext.map_machines(names)
    template = md_cluster.new_bootstrap_template(files_and_user("set by CAPI", "capilab"))
    explain = lambda: co.conditions_text(md_cluster.md_machines())  # noqa: E731
    wait(lambda: rolled_out(md_cluster, template), ROLLOUT_TIMEOUT, "in-place rollout finished", explain)
    # moved, not replaced: same names, same UIDs; CAPI's own conditions say UpToDate, not Updating
    assert md_cluster.identities(md_cluster.md_machines()) == before
    for name, host in zip(names, hosts, strict=False):
        assert run_on(lab, host, ["cat", HOST_FILE]) == "set by CAPI\n", name
        assert run_on(lab, host, ["getent", "passwd", "capilab"]).startswith("capilab:"), name
        assert len(stamp_writes(lab, host)) == 1, name
    log = md_cluster.ext.log()
    assert "hook=CanUpdateMachineSet" in log
    assert re.search(rf"hook=UpdateMachine machine={md_cluster.namespace}/\S+ .*decision=done", log)
