"""Two real MCM agent replicas at once against the kubelab's real apiserver: each Node is worked on by
one replica only (the resourceVersion-guarded claim annotation), and a replica that dies holding a
claim leaves its Node to the other one only once the claim expired.

Each replica is a real :class:`Agent` on its own event loop and its own connections, with its own
scripted executor standing in for the run service; the executors record which replica's claim the
Node carried when they were asked to apply it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pytest
from hostlab.proc import wait_until
from kubelab.lab import Lab

from inplace_extension.mcm import node_state as ns
from inplace_extension.mcm.agent import AgentOptions
from inplace_extension.runs.model import Progress, ProgressState, RunRequest

from .lab_objects import NAMESPACE, WAIT, label, make_node, make_pool, node, unique
from .support import AgentThread, ScriptedRuns

pytestmark = pytest.mark.kube

NODES = 5
RESYNC = 0.5  # short: a dead replica's expired claim is found by the other one's resync


@dataclass
class Replica:
    """One agent replica: its identity, its executor, and (node, claim holder, time) of every poll."""

    ident: str
    thread: AgentThread
    runs: ScriptedRuns
    polls: list[tuple[str, str, float]] = field(default_factory=list)
    stopped: bool = False

    def stop(self) -> None:
        """Like a killed Pod: the agent's tasks are cancelled, its claims stay on the Nodes."""
        if not self.stopped:
            self.stopped = True
            self.thread.stop()

    def applied(self) -> set[str]:
        return self.runs.nodes()

    def holders(self) -> set[str]:
        """The replicas the Node's claim named whenever this replica's executor was polled."""
        return {holder for _, holder, _ in list(self.polls)}


Answer = Callable[[RunRequest, int], Progress]
StartReplica = Callable[[str, float, Answer], Replica]


@pytest.fixture
def start_replica(kube: Lab) -> Iterator[StartReplica]:
    started: list[Replica] = []

    def start(ident: str, claim_seconds: float, answer: Answer) -> Replica:
        def recorded(request: RunRequest, calls: int) -> Progress:
            claim = ns.claim_of({"metadata": {"annotations": dict(request.annotations)}})
            replica.polls.append((request.name, claim.holder if claim else "", time.time()))
            return answer(request, calls)

        options = AgentOptions(
            namespace=NAMESPACE,
            poll_seconds=0.2,
            resync_seconds=RESYNC,
            claim_seconds=claim_seconds,
            agent_id=ident,
        )
        runs = ScriptedRuns(recorded)
        replica = Replica(ident, AgentThread(kube.kubeconfig, options, runs), runs)
        started.append(replica)
        return replica

    yield start
    for replica in started:
        replica.stop()


def _claim_holder(kube: Lab, name: str) -> str | None:
    claim = ns.claim_of(node(kube, name))
    return claim.holder if claim else None


def _claim(kube: Lab, name: str) -> ns.Claim:
    claim = ns.claim_of(node(kube, name))
    assert claim is not None, f"{name} is claimed"
    return claim


def test_two_replicas_apply_each_node_once(kube: Lab, start_replica: StartReplica) -> None:
    # the executors keep every update running until each Node is claimed: both replicas are then
    # live and racing for the same Nodes at the same time, none has answered yet
    all_claimed = threading.Event()

    def answer(request: RunRequest, calls: int) -> Progress:
        if not all_claimed.is_set():
            return Progress(ProgressState.IN_PROGRESS, "held until every Node is claimed", 1)
        return Progress(ProgressState.DONE, "update applied")

    replicas = [start_replica(ident, 60, answer) for ident in ("replica-a", "replica-b")]
    assert wait_until(lambda: all(r.thread.connected for r in replicas), WAIT, 0.1), "both watch Nodes"
    pool = unique("pool")
    machines = [unique("m") for _ in range(NODES)]
    make_pool(kube, pool, *machines)
    names = [unique("twin") for _ in machines]
    for name, machine in zip(names, machines, strict=True):
        make_node(kube, name, machine, ns.READY_FOR_UPDATE)

    assert wait_until(lambda: all(_claim_holder(kube, n) for n in names), WAIT, 0.1), "every Node claimed"
    claims = {n: _claim_holder(kube, n) for n in names}
    all_claimed.set()
    assert wait_until(lambda: all(label(kube, n) == ns.SUCCESSFUL for n in names), WAIT, 0.2)
    # the other replica sees every answer as a watch event and resyncs every RESYNC seconds: give it
    # several chances to act on a Node a second time (it must not)
    a, b = replicas
    assert not wait_until(lambda: bool(a.applied() & b.applied()), 6 * RESYNC, 0.1), (
        f"a Node applied by both replicas: {sorted(a.applied() & b.applied())}"
    )

    print(f"split: {a.ident} {sorted(a.applied())}, {b.ident} {sorted(b.applied())}")
    assert a.applied() | b.applied() == set(names)
    for replica in replicas:
        assert replica.holders() <= {replica.ident}, "an executor ran only under its own replica's claim"
        assert {n for n, holder in claims.items() if holder == replica.ident} == replica.applied()
    for name in names:
        assert ns.CLAIM_ANNOTATION not in ns.node_annotations(node(kube, name)), "released when answered"


def test_dead_replicas_claim_is_taken_over_once_it_expires(kube: Lab, start_replica: StartReplica) -> None:
    claim_seconds = 4.0
    victim_dead = threading.Event()

    def answer(request: RunRequest, calls: int) -> Progress:
        if not victim_dead.is_set() or calls < 1:
            return Progress(ProgressState.IN_PROGRESS, "running", 1)
        return Progress(ProgressState.DONE, "update applied")

    replicas = [start_replica(ident, claim_seconds, answer) for ident in ("replica-c", "replica-d")]
    assert wait_until(lambda: all(r.thread.connected for r in replicas), WAIT, 0.1), "both watch Nodes"
    pool, machine = unique("pool"), unique("m")
    make_pool(kube, pool, machine)
    name = unique("orphaned")
    make_node(kube, name, machine, ns.READY_FOR_UPDATE)

    assert wait_until(lambda: any(r.applied() for r in replicas), WAIT, 0.1), "one replica took the Node"
    victim, survivor = replicas if replicas[0].applied() else replicas[::-1]
    first = ns.claim_of(node(kube, name))
    assert first is not None and first.holder == victim.ident
    # the victim renews its claim while it polls (half-way through); the survivor respects it meanwhile
    assert wait_until(lambda: _claim(kube, name).expires > first.expires, WAIT, 0.2), "renewed"
    assert not survivor.applied()
    victim.stop()
    victim_polls = len(victim.polls)
    claim = _claim(kube, name)
    assert claim.holder == victim.ident, "a killed replica does not release its claim"
    victim_dead.set()

    assert wait_until(lambda: label(kube, name) == ns.SUCCESSFUL, WAIT + claim_seconds, 0.2)
    assert survivor.applied() == {name}
    first_poll = min(when for _, _, when in survivor.polls)
    assert first_poll >= claim.expires, (
        f"taken over {claim.expires - first_poll:.1f} s before the claim expired"
    )
    assert survivor.holders() == {survivor.ident}, "the survivor applied under its own claim"
    assert len({r.ident for r in survivor.runs.seen(name)}) == 1, "one run, polled until done"
    assert len(victim.polls) == victim_polls, "a stopped replica does nothing more"
    assert ns.CLAIM_ANNOTATION not in ns.node_annotations(node(kube, name))


def test_a_restarted_replica_resumes_its_own_claim_at_once(kube: Lab, start_replica: StartReplica) -> None:
    """The same identity after a restart (deploy/mcm: the Pod's name): its Node goes on at once, long
    before the claim would expire, and the other live replica never touches it."""
    claim_seconds = 120.0
    restarted = threading.Event()

    def answer(request: RunRequest, calls: int) -> Progress:
        if not restarted.is_set():
            return Progress(ProgressState.IN_PROGRESS, "running", 1)
        return Progress(ProgressState.DONE, "update applied")

    first = start_replica("agent-pod-e", claim_seconds, answer)
    assert wait_until(lambda: first.thread.connected, WAIT, 0.1), "the replica watches Nodes"
    pool, machine = unique("pool"), unique("m")
    make_pool(kube, pool, machine)
    name = unique("resumed")
    make_node(kube, name, machine, ns.READY_FOR_UPDATE)
    assert wait_until(lambda: first.applied() == {name}, WAIT, 0.1), "the first life took the Node"
    first.stop()  # killed: its claim stays on the Node
    claim = _claim(kube, name)
    assert claim.holder == "agent-pod-e"
    other = start_replica("agent-pod-f", claim_seconds, answer)
    restarted.set()
    again = start_replica("agent-pod-e", claim_seconds, answer)  # the same Pod, its container restarted
    assert wait_until(lambda: label(kube, name) == ns.SUCCESSFUL, WAIT, 0.2), "resumed at once"
    assert time.time() < claim.expires - claim_seconds / 2, "well before the old claim would expire"
    assert again.applied() == {name} and not other.applied()
