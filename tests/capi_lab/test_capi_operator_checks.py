"""Operator controls with the real CAPI v1.14.2 controllers (kubelab capi flavour): a ``kubernetes``
health check whose object flips, and the retry budget of a Machine whose host cannot be reached.

Real: the apiserver, CAPI core/KCP/CABPK/CAPD, our service (``serve --kubeconfig``, registered through
this module's own ExtensionConfig), the CEL check read from the API server, the playbooks over SSH on a
hostlab host. Simulated, as in ``test_capi_kube_aware.py``: CAPD's in-memory machines (a Machine's
operating system is the lab host its DevMachine's ``status.addresses`` names) and the workload cluster:
the service reads the Nodes and the checked object in the kubelab's own API server
(``--workload-kubeconfig management``). The checked object is a stand-in for Rook's CephCluster: a small
CRD of that name (``lab.inplace-extension.io``) with a status subresource that only the test writes, as
the Ceph operator would write the real one's ``status``.

The check holds every Machine of this module's service, so a fixture leaves the object healthy after
each test that changes it. A ``command`` check of the same file (a file on the host must exist) keeps a
play on its host until the test lets it end, so the test flips the object while the play runs without
racing the play's end.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from e2e import conftest as e2e_fixtures
from e2e.conftest import NEXT_VERSION, START_VERSION
from e2e.hostcheck import stamp_writes
from hostlab import faults
from hostlab.lab import Host
from hostlab.lab import Lab as HostLab
from kubelab import objects, reads
from kubelab.flavours import capi_objects as co
from kubelab.lab import Lab
from playbooks.standins import install_standins, lab_run_on_host

from inplace_extension.runs.policy import BACKOFF_CAP_SECONDS

from .conftest import unique_namespace
from .kube_aware import MACHINES, KubeExtension, Worker, create_worker, run_attempts, serving
from .rollout import CAPI_FAILURE, CP_MACHINE_HEALTH_CONDITIONS, KCP, KCP_HEALTH_CONDITIONS, wait

pytestmark = [pytest.mark.lab, pytest.mark.kube, pytest.mark.capi]

# this module's ExtensionConfig and the label of its namespaces (test_capi_kube_aware.py has its own)
EXTENSION = "inplace-extension-ops"
SELECTOR = {"inplace-extension.io/capi-operator-checks": "yes"}
GROUP, KIND, PLURAL = "lab.inplace-extension.io", "CephCluster", "cephclusters"
CHECK = "ceph"
EXPRESSION = 'object.status.health == "HEALTH_OK"'
# the check's timeout before an update starts: well beyond the test's look at the wait (a few kubectl calls)
HEALTH_TIMEOUT = 30
PLAY_GATE = "/tmp/inplace-ops-play-gate"  # the play's command check passes once this file exists
BUDGET = 2  # --max-failed-attempts
GATE_SECONDS = 120  # the health gate outlasts the test's flip back (the gate's timeout is not tested here)
RETRY = "inplace-extension.io/retry"
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGV4YW1wbGUta2V5LWZvci1lMmUtdGVzdHMtb25seQ ops@test"
release_server = e2e_fixtures.release_server
e2e_capabilities = e2e_fixtures.e2e_capabilities


@dataclass
class Ceph:
    """The checked object: a CephCluster stand-in whose ``status.health`` the test sets."""

    kube: Lab
    namespace: str
    name: str = "ceph"

    def set(self, health: str) -> None:
        objects.set_status(self.kube, f"{PLURAL}.{GROUP}", self.name, self.namespace, {"health": health})

    @property
    def where(self) -> str:
        return f"{KIND} {self.namespace}/{self.name}"


@pytest.fixture(scope="module")
def ceph(kubelab_capi: Lab) -> Ceph:
    objects.define_kind(kubelab_capi, GROUP, KIND, PLURAL)
    found = Ceph(kubelab_capi, unique_namespace("ops-ceph"))
    objects.ensure_namespace(kubelab_capi, found.namespace)
    metadata = {"name": found.name, "namespace": found.namespace}
    objects.apply(kubelab_capi, {"apiVersion": f"{GROUP}/v1", "kind": KIND, "metadata": metadata, "spec": {}})
    found.set("HEALTH_OK")
    return found


@pytest.fixture(scope="module")
def ops_extension(
    kubelab_capi: Lab,
    lab: HostLab,
    e2e_capabilities: Path,
    ceph: Ceph,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[KubeExtension]:
    """The Kubernetes-aware service with a ``kubernetes`` health check on the CephCluster stand-in (with a
    timeout before the start) and a retry budget of 2 attempts (backoff: ``--retry-after-seconds`` 1,
    doubled per failure)."""
    work = tmp_path_factory.mktemp("capi-operator-checks")  # kept after the run
    capabilities = work / "capabilities.yaml"
    capabilities.write_text(
        e2e_capabilities.read_text()
        + "health_checks:\n"
        + "  - name: play_gate\n"
        + f"    command: [test, -e, {PLAY_GATE}]\n"
        + f"  - name: {CHECK}\n"
        + "    kubernetes:\n"
        + f"      api_version: {GROUP}/v1\n"
        + f"      kind: {KIND}\n"
        + f"      namespace: {ceph.namespace}\n"
        + f"      name: {ceph.name}\n"
        + f"      expression: '{EXPRESSION}'\n"
        + f"      timeout: {HEALTH_TIMEOUT}s\n"
    )
    extra = ["--max-failed-attempts", str(BUDGET), "--health-gate-timeout-seconds", str(GATE_SECONDS)]
    with serving(kubelab_capi, lab, EXTENSION, SELECTOR, capabilities, work / "service.log", extra) as ext:
        yield ext


@pytest.fixture
def healthy(ceph: Ceph) -> Iterator[Ceph]:
    """The checked object, healthy again after the test whatever it did (the check holds every Machine)."""
    try:
        yield ceph
    finally:
        ceph.set("HEALTH_OK")


@pytest.fixture
def gated(lab: HostLab, lab_hosts: list[Host]) -> Iterator[list[Host]]:
    """The lab hosts with the play gate open (the file the command check wants); removed after the test."""
    try:
        for host in lab_hosts:
            lab.exec_in(host, ["touch", PLAY_GATE])
        yield lab_hosts
    finally:
        for host in lab_hosts:
            lab.exec_in(host, ["rm", "-f", PLAY_GATE])


def on_host(ext: KubeExtension, lab: HostLab, host: Host, prefix: str) -> Worker:
    """A cluster whose one worker Machine is the lab host (with the Kubernetes stand-ins)."""
    install_standins(lab_run_on_host(lab, host), version=START_VERSION)
    ext.serve_host(host)
    return create_worker(ext, host, prefix)


def updating_message(worker: Worker) -> str:
    """The message of the Machine's ``Updating`` condition, as CAPI wrote it from our last answer."""
    return str((objects.condition(worker.machine_obj(), "Updating") or {}).get("message", ""))


def add_user(name: str) -> dict[str, object]:
    """A bootstrap template change our service updates in place without a drain (a users change)."""
    return {"format": "cloud-config", "users": [{"name": name, "sshAuthorizedKeys": [KEY]}]}


def test_a_cel_check_on_an_object_that_flips_holds_the_update_before_it_starts_and_in_its_health_gate(
    ops_extension: KubeExtension, healthy: Ceph, lab: HostLab, gated: list[Host]
) -> None:
    """The CephCluster stand-in says unhealthy -> CAPI's UpdateMachine calls are held with a message naming
    the check, and nothing starts on the host; past the check's timeout CAPI gets the Failure naming it,
    still nothing started; it flips healthy (and the retry annotation makes CAPI call at once) -> the
    update starts; it flips unhealthy while the play runs -> the play finishes and the health gate holds
    the Machine; healthy again -> the Machine is UpToDate, updated once."""
    ext, ceph, host = ops_extension, healthy, gated[0]
    worker = on_host(ext, lab, host, "ops-cel")
    lab.exec_in(host, ["rm", "-f", PLAY_GATE])  # the play waits on the host until the test has flipped
    machine = f"{worker.namespace}/{worker.machine}"
    ceph.set("HEALTH_WARN")
    worker.change(add_user("opscel"))
    reason = f"{EXPRESSION} is false on {ceph.where}"
    waiting = f'waiting for health check "{CHECK}" ({reason})'
    # the Event, not the condition: the condition says it only until the timeout
    wait(lambda: "Waiting" in worker.events(), 240, f"the Waiting Event: {waiting}", worker.explain)
    assert worker.events()["Waiting"] == [waiting]
    assert waiting in updating_message(worker), "the Machine shows why it waits"

    # CAPI asks again (retryAfterSeconds 1) and is held again: nothing has started on the host
    def polls() -> int:
        return ext.log().count(f"hook=UpdateMachine machine={machine} ")

    asked = polls()
    wait(lambda: polls() > asked, 60, "CAPI asks about the held Machine again", worker.explain)
    assert run_attempts(ext, machine) == [], "no attempt while the check does not hold"
    assert stamp_writes(lab, host) == []

    # past the timeout: the Failure names the check (CAPI shows its generic message), nothing runs
    timed_out = (
        f'health check "{CHECK}" did not hold within {HEALTH_TIMEOUT}s before the update '
        f"({EXPRESSION} on {ceph.where})"
    )
    wait(
        lambda: timed_out in worker.events().get("Failed", []),
        HEALTH_TIMEOUT + 60,
        f"the Failed Event: {timed_out}",
        worker.explain,
    )
    wait(lambda: updating_message(worker) == CAPI_FAILURE, 60, "CAPI shows the Failure", worker.explain)
    assert run_attempts(ext, machine) == [] and stamp_writes(lab, host) == [], "nothing started"

    ceph.set("HEALTH_OK")
    # CAPI calls a failed hook again on its backoff; the retry annotation (a change of the Machine)
    # makes it call at once
    worker.kube.kubectl("annotate", MACHINES, worker.machine, "-n", worker.namespace, f"{RETRY}=1")
    # the object flips back to unhealthy while the started play waits on its gate, then the play ends
    wait(lambda: bool(run_attempts(ext, machine)), 60, "the update started", worker.explain)
    ceph.set("HEALTH_ERR")
    assert run_attempts(ext, machine)[0]["outcome"] is None, "flipped while the play runs"
    lab.exec_in(host, ["touch", PLAY_GATE])
    gate = f'health gate: waiting for health check "{CHECK}" ({reason})'
    wait(lambda: gate in updating_message(worker), 120, f"the Machine shows: {gate}", worker.explain)
    assert [a["outcome"] for a in run_attempts(ext, machine)] == ["successful"]
    assert not worker.updated_in_place() and "Done" not in worker.events()

    ceph.set("HEALTH_OK")
    wait(worker.updated_in_place, 120, "the Machine updated in place once the check holds", worker.explain)
    wait(lambda: "Done" in worker.events(), 30, "the Done Event", worker.explain)
    assert len(stamp_writes(lab, host)) == 1, "one apply"
    assert [a["outcome"] for a in run_attempts(ext, machine)] == ["successful"]
    events = worker.events()
    assert (events["Waiting"], events["Failed"]) == ([waiting], [timed_out]), "each said once"


def test_a_machine_whose_host_cannot_be_reached_is_blocked_after_2_attempts_until_the_retry_annotation(
    ops_extension: KubeExtension, healthy: Ceph, lab: HostLab, gated: list[Host]
) -> None:
    """sshd stopped on the host -> two unreachable attempts -> the update is blocked (a Failure CAPI
    shows, our Failed Event and the blocked gauge say why); sshd back -> still blocked when CAPI calls
    again; the retry annotation on the Machine -> a full budget, and the update completes with one
    apply."""
    ext, host = ops_extension, gated[1]
    worker = on_host(ext, lab, host, "ops-budget")
    machine = f"{worker.namespace}/{worker.machine}"
    blocked = f"blocked after {BUDGET} failed attempts: host unreachable"
    faults.sshd(lab, host, running=False)
    try:
        worker.change(add_user("opsbudget"))
        wait(
            lambda: blocked in worker.events().get("Failed", []), 240, f"the Event: {blocked}", worker.explain
        )
        assert [a["outcome"] for a in run_attempts(ext, machine)] == ["unreachable"] * BUDGET
        assert re.search(r"^inplace_extension_updates_blocked 1(\.0)?$", ext.metrics(), re.M), ext.metrics()
        wait(lambda: updating_message(worker) == CAPI_FAILURE, 60, "CAPI shows the Failure", worker.explain)
    finally:
        faults.sshd(lab, host, running=True)

    # the host is back, the budget stays spent: a change of the Machine makes CAPI call at once, and it
    # gets the same Failure; nothing is tried on the host
    def failures() -> int:
        return len(re.findall(rf"hook=UpdateMachine machine={machine} .*decision=failed", ext.log()))

    told = failures()
    worker.kube.kubectl("annotate", MACHINES, worker.machine, "-n", worker.namespace, "lab.example/poke=1")
    wait(lambda: failures() > told, 60, "CAPI calls again and is answered the Failure", worker.explain)
    assert len(run_attempts(ext, machine)) == BUDGET and stamp_writes(lab, host) == []
    assert worker.events()["Failed"] == [blocked]

    worker.kube.kubectl("annotate", MACHINES, worker.machine, "-n", worker.namespace, f"{RETRY}=1")
    wait(worker.updated_in_place, 240, "the Machine updated in place after the retry", worker.explain)
    assert [a["outcome"] for a in run_attempts(ext, machine)] == ["unreachable"] * BUDGET + ["successful"]
    assert len(stamp_writes(lab, host)) == 1, "one apply"
    assert re.search(r"^inplace_extension_updates_blocked 0(\.0)?$", ext.metrics(), re.M), ext.metrics()


def _minute(moment: datetime) -> datetime:
    return moment.replace(second=0, microsecond=0)


@contextmanager
def restarted_with(ext: KubeExtension, more_capabilities: str, budget: int) -> Iterator[None]:
    """This module's service restarted with ``more_capabilities`` added to its file and another retry
    budget; as it was again afterwards (it is this module's own service)."""
    argv = list(ext.argv)
    path = Path(argv[argv.index("--capabilities-file") + 1])
    original = path.read_text()
    changed = list(argv)
    changed[changed.index("--max-failed-attempts") + 1] = str(budget)
    path.write_text(original + more_capabilities)
    ext.stop()
    ext.argv = changed
    ext.start()
    try:
        yield
    finally:
        path.write_text(original)
        ext.stop()
        ext.argv = argv
        ext.start()


# CAPI reaches UpdateMachine within this long of a template change (CanUpdateMachineSet, the new
# MachineSet, the move): the first attempt happens inside the window that closes after it
FIRST_ATTEMPT_LEAD = timedelta(seconds=90)


def test_a_retry_after_an_unreachable_host_meets_a_closed_window_and_a_failing_check_then_runs(
    ops_extension: KubeExtension, healthy: Ceph, lab: HostLab, gated: list[Host]
) -> None:
    """Every attempt obeys the operator (docs/operator-controls.md), with the real CAPI controllers: the
    Machine's first attempt finds its host unreachable (sshd stopped) inside a maintenance window; its
    retries go on until the window closes, and the retry due then waits for the next window (nothing
    tried on the host, sshd back meanwhile); when that one opens, the retry waits for the CEL check on
    the CephCluster stand-in, which the test made fail; once it holds the retry runs and the Machine is
    updated in place, with no retry annotation."""
    ext, ceph, host = ops_extension, healthy, gated[2]
    worker = on_host(ext, lab, host, "ops-every")
    machine = f"{worker.namespace}/{worker.machine}"
    now = datetime.now(UTC)
    # the first window is open from this minute until the first attempt has surely happened; the next
    # opens a minute after it closed
    first_opened = _minute(now)
    minutes = math.ceil((now + FIRST_ATTEMPT_LEAD - first_opened).total_seconds() / 60)
    closes = first_opened + timedelta(minutes=minutes)
    # the retry due after the close must fall in the gap: its backoff is at most the window's length (the
    # backoffs double from 1 s, so the last is about the sum of those before it); with a gap of one minute,
    # fast failures of the host had the window's retries reach attempt 9 and the retry due after the close
    # fall past the gap, into the next window (two runs)
    gap = timedelta(minutes=minutes + 1)
    opens = closes + gap
    scope = f"    labels: {{cluster.x-k8s.io/cluster-name: {worker.cluster}}}\n"
    windows = (
        "maintenance_windows:\n"
        f"  - name: ops-now\n    cron: '{first_opened.minute} {first_opened.hour} * * *'\n"
        f"    duration: {minutes}m\n{scope}"
        f"  - name: ops-next\n    cron: '{opens.minute} {opens.hour} * * *'\n    duration: 1h\n{scope}"
    )
    closed = f'waiting for maintenance window "ops-next" (opens {opens:%Y-%m-%dT%H:%M}Z)'
    checking = f'waiting for health check "{CHECK}" ({EXPRESSION} is false on {ceph.where})'
    faults.sshd(lab, host, running=False)
    try:
        # a budget the retries until the window closes do not spend (backoff 1, 2, 4, ... s)
        with restarted_with(ext, windows, budget=20):
            worker.change(add_user("opsevery"))
            wait(lambda: bool(run_attempts(ext, machine)), 240, "the first attempt", worker.explain)
            assert datetime.now(UTC) < closes, "the first attempt came after its window: raise the lead"
            # the retry due after the window closed comes after its backoff (at most the window's length)
            wait(
                lambda: closed in worker.events().get("Waiting", []),
                BACKOFF_CAP_SECONDS + 120,
                closed,
                worker.explain,
            )
            tried = run_attempts(ext, machine)
            assert tried and all(a["outcome"] == "unreachable" for a in tried), tried
            faults.sshd(lab, host, running=True)  # the host is back: the window alone holds the retry
            ceph.set("HEALTH_WARN")  # and when it opens, the check
            wait(
                lambda: checking in worker.events().get("Waiting", []),
                gap.total_seconds() + 150,
                checking,
                worker.explain,
            )
            assert datetime.now(UTC) >= opens
            assert run_attempts(ext, machine) == tried, "no attempt while the window was closed"
            assert stamp_writes(lab, host) == []
            ceph.set("HEALTH_OK")
            wait(worker.updated_in_place, 180, "updated once the check holds", worker.explain)
            attempts = run_attempts(ext, machine)
            assert [a["outcome"] for a in attempts] == [a["outcome"] for a in tried] + ["successful"]
            assert attempts[-1]["started"] >= opens.timestamp(), "the retry ran only in the next window"
            assert len(stamp_writes(lab, host)) == 1, "one apply"
            assert RETRY not in (worker.machine_obj()["metadata"].get("annotations") or {})
    finally:
        faults.sshd(lab, host, running=True)


def test_the_pause_annotation_on_a_kubeadm_control_plane_holds_its_in_place_upgrade(
    ops_extension: KubeExtension, healthy: Ceph
) -> None:
    """docs/operator-controls.md, pause on a control plane, with the real KCP controller: a
    KubeadmControlPlane of 3 (maxSurge 0) paused, then bumped one minor -> KCP asks UpdateMachine for a
    Machine, and our service answers it paused by that KubeadmControlPlane (its label names it on every
    control plane Machine): a Waiting Event on the Machine, nothing started; the annotation removed ->
    the same Machine is no longer held (its update goes on to host resolution; these in-memory Machines
    have no host, which is not what is tested here)."""
    ext, kube = ops_extension, ops_extension.kube
    namespace = unique_namespace("ops-kcp")
    objects.apply(
        kube,
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace, "labels": ext.selector}},
    )
    name = "ops-kcp"
    kcp = f"{name}-cp"
    objects.apply(
        kube,
        co.dev_cluster(name, namespace),
        co.cluster(name, namespace, control_plane=kcp),
        co.dev_machine_template(kcp, namespace),
        co.kubeadm_control_plane(kcp, namespace, 3, START_VERSION, kcp, max_surge=0),
    )

    def machines() -> list[dict[str, Any]]:
        return co.machines(kube, namespace)

    def explain() -> str:
        return co.conditions_text([*machines(), *co.list_objects(kube, KCP, namespace)])

    def stable() -> bool:
        found, kcps = machines(), co.list_objects(kube, KCP, namespace)
        return (
            len(found) == 3
            and all(co.running(m) for m in found)
            and len(kcps) == 1
            and all(co.condition_status(kcps[0], c) == "True" for c in KCP_HEALTH_CONDITIONS)
            and all(co.condition_status(m, c) == "True" for m in found for c in CP_MACHINE_HEALTH_CONDITIONS)
        )

    wait(stable, 300, f"control plane {kcp} of 3 stable (KCP preflight checks would pass)", explain)
    before = {m["metadata"]["name"]: m["metadata"]["uid"] for m in machines()}
    kube.kubectl("annotate", KCP, kcp, "-n", namespace, "inplace-extension.io/pause=true")
    bump = json.dumps({"spec": {"version": NEXT_VERSION}})
    kube.kubectl("patch", KCP, kcp, "-n", namespace, "--type=merge", "-p", bump)
    paused = f"paused by KubeadmControlPlane {namespace}/{kcp} (annotation inplace-extension.io/pause)"

    def machine_events() -> dict[str, dict[str, list[str]]]:
        found: dict[str, dict[str, list[str]]] = {}
        for event in reads.list_objects(kube, "events", namespace):
            involved = event["involvedObject"]
            if involved.get("uid") in before.values():
                found.setdefault(involved["name"], {}).setdefault(event["reason"], []).append(
                    event["message"]
                )
        return found

    def held() -> list[str]:
        return [m for m, reasons in machine_events().items() if paused in reasons.get("Waiting", [])]

    wait(lambda: bool(held()), 300, f"a Waiting Event: {paused}", explain)
    (machine,) = held()
    assert {m["metadata"]["name"]: m["metadata"]["uid"] for m in machines()} == before, "none replaced"
    assert not list(ext.runs_dir.glob(f"{namespace}.*/attempt-*")), "nothing started while paused"
    updating = objects.condition(next(m for m in machines() if m["metadata"]["name"] == machine), "Updating")
    assert paused in str((updating or {}).get("message", "")), updating

    def resolved() -> bool:  # the hold lifted, the update went on to find its host (these have none)
        pattern = rf"machine={namespace}/{machine} run=\S+: Host(NotFound|NotAllowed)"
        return re.search(pattern, ext.log()) is not None

    assert not resolved(), "held before host resolution"
    kube.kubectl("annotate", KCP, kcp, "-n", namespace, "inplace-extension.io/pause-")
    # CAPI asks again within retryAfterSeconds (30 s while paused); a Machine change makes it ask at once
    kube.kubectl("annotate", MACHINES, machine, "-n", namespace, f"{RETRY}=1")
    wait(resolved, 120, "resumed: no longer held by the KubeadmControlPlane", explain)
    # its Machines have no host: CAPI would ask about them for the rest of the session
    kube.kubectl("delete", "clusters.cluster.x-k8s.io", name, "-n", namespace, "--wait=false")
