"""KubeClusterSide (the Kubernetes-aware steps around a play) against the in-memory fake of the adapter's
ports: a drain point before the first disruptive step and only then, skip-remediation while a
kubelet-restarting step runs, clean-up exactly once, the health gate's messages, API trouble as a
retriable Blocked, and one read of the Machine per step. tests/kube runs the same class against the real
API server."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from kubefake import FakeManagement, failing_with

from inplace_extension.inplace.custom import NO_CUSTOM
from inplace_extension.kube.drain import CORDONED_BY
from inplace_extension.kube.errors import Forbidden, KubeError, Unreachable
from inplace_extension.kube.machines import SKIP_REMEDIATION, SKIP_REMEDIATION_BY
from inplace_extension.kube.update_condition import IDLE_MESSAGE
from inplace_extension.kubeaware.cluster_side import KubeClusterSide, updating_message
from inplace_extension.kubejobs.manifest import ATTEMPT_POD_LABELS
from inplace_extension.runs.model import Blocked, Hold, ProgressState, RunRequest
from inplace_extension.settings import Settings

NS, NAME, NODE = "default", "md-0-abc", "node-1"


def request(*capabilities: str, target: str | None = None) -> RunRequest:
    inputs: dict[str, dict[str, str]] = {c: {} for c in capabilities}
    if target is not None:
        inputs["kubernetes_version"] = {"kubernetes_version_target": target}
    return RunRequest(NS, NAME, "ab" * 32, tuple(capabilities), inputs)


@pytest.fixture
def cluster() -> FakeManagement:
    fake = FakeManagement()
    fake.add_machine(NS, NAME, NODE)
    return fake


def side_for(cluster: FakeManagement, **settings: object) -> KubeClusterSide:
    return KubeClusterSide(cluster, Settings(health_gate_timeout_seconds=60, **settings), NO_CUSTOM)  # type: ignore[arg-type]


def test_a_disruptive_step_is_drained_first_and_uncordoned_once(cluster: FakeManagement) -> None:
    side, run = side_for(cluster), request("kubelet_args")
    cluster.cluster.nodes[NODE].pods = 3
    reports: list[str] = []
    assert side.before_play(run) is None
    assert side.drain_point(run) == "kubelet_args"
    assert side.drain(run, reports.append) is None
    node = cluster.cluster.nodes[NODE]
    assert node.unschedulable and node.annotations[CORDONED_BY] == run.machine and node.pods == 0
    assert reports == ["draining: 3 pods left", "draining: 0 pods left"]
    side.after_play(run)
    side.after_play(run)  # a second clean-up (a restarted service) finds nothing of ours left
    assert not node.unschedulable and CORDONED_BY not in node.annotations
    assert cluster.reasons() == ["Drained", "Uncordoned"]


def test_a_step_that_disrupts_nothing_is_not_drained(cluster: FakeManagement) -> None:
    side = side_for(cluster)
    run = request("users", "ntp")
    assert side.before_play(run) is None and side.drain_point(run) is None
    assert cluster.calls.count["cordon"] == 0 and not cluster.cluster.nodes[NODE].unschedulable


def test_a_version_the_kubelet_already_runs_needs_no_drain(cluster: FakeManagement) -> None:
    side = side_for(cluster)
    same = request("kubernetes_version", target="v1.31.0")
    assert side.before_play(same) is None and side.drain_point(same) is None
    other = request("users", "kubernetes_version", target="v1.32.0")
    assert side.before_play(other) is None and side.drain_point(other) == "kubernetes_version"
    assert cluster.calls.count["cordon"] == 0  # the play drains at its drain point, not before


def test_a_node_someone_else_cordoned_is_drained_but_left_cordoned(cluster: FakeManagement) -> None:
    node = cluster.cluster.nodes[NODE]
    node.unschedulable, node.annotations[CORDONED_BY] = True, "someone/else"
    side, run = side_for(cluster), request("kubelet_args")
    assert side.before_play(run) is None and side.drain(run, lambda message: None) is None
    side.after_play(run)
    assert node.unschedulable and node.annotations[CORDONED_BY] == "someone/else"


def test_a_refused_drain_is_a_remembered_failure_and_an_unreachable_api_a_retriable_one(
    cluster: FakeManagement,
) -> None:
    side, run = side_for(cluster), request("kubelet_args")
    cluster.cluster.nodes[NODE].pods, cluster.cluster.nodes[NODE].stuck = 2, True
    assert side.before_play(run) is None
    blocked = side.drain(run, lambda message: None)
    assert blocked == Blocked("drain: timed out after 300s with 2 pods left")
    cluster.calls.failing.add("machine")
    assert side.before_play(run) == Blocked(
        "drain: the API server is unreachable (ConnectError)", retriable=True
    )
    assert cluster.reasons() == ["DrainFailed", "DrainFailed"]


def test_a_drain_held_up_by_other_updates_attempts_is_retried_and_drains_once_they_ended(
    cluster: FakeManagement,
) -> None:
    """Two Machines updated at once, the other's attempt Pod on this Node: the drain does not take it
    for a user's workload (the policy names the attempts' labels), and what holds it up goes away by
    itself, so the play's block is retriable, not remembered; once that Pod has ended the drain ends."""
    side, run = side_for(cluster), request("kubelet_args")
    node = cluster.cluster.nodes[NODE]
    node.attempts = 1
    assert side.before_play(run) is None
    blocked = side.drain(run, lambda message: None)
    assert blocked is not None and blocked.retriable
    assert blocked.message.endswith("still running: the attempts of other updates")
    assert cluster.cluster.policies[-1].attempt_labels == ATTEMPT_POD_LABELS
    node.attempts = 0  # that Job ended
    assert side.drain(run, lambda message: None) is None
    assert cluster.reasons() == ["DrainFailed", "Drained"]


def test_no_node_ref_blocks_the_drain(cluster: FakeManagement) -> None:
    cluster.add_machine(NS, NAME, None)
    blocked = side_for(cluster).before_play(request("kubelet_args"))
    assert blocked == Blocked("drain: the Machine has no status.nodeRef, so there is no Node to drain")


def test_skip_remediation_while_a_kubelet_restarting_step_runs_and_only_ours_is_removed(
    cluster: FakeManagement,
) -> None:
    side, run = side_for(cluster), request("users", "kubelet_args")

    def annotations() -> dict[str, str]:
        return cluster.machines[(NS, NAME)].annotations

    side.step_started(run, "kubelet_args")
    assert annotations() == {SKIP_REMEDIATION: "", SKIP_REMEDIATION_BY: run.ident}
    side.step_started(run, "users")  # a step that does not restart the kubelet: removed again
    assert annotations() == {}
    cluster.annotate(NS, NAME, {SKIP_REMEDIATION: ""})  # someone else's: never ours to remove
    side.step_started(run, "kubelet_args")
    side.after_play(run)
    assert annotations() == {SKIP_REMEDIATION: ""}


def test_skip_remediation_is_set_only_on_the_machine_as_read_and_decided_again_after_a_change(
    cluster: FakeManagement,
) -> None:
    run = request("kubelet_args")
    stale = cluster.machine(NS, NAME)
    assert stale is not None
    cluster.annotate(NS, NAME, {SKIP_REMEDIATION: ""})  # someone else marks it after our read
    assert not cluster.mark_skip_remediation(stale, run.ident)  # the precondition fails; re-read: theirs
    assert cluster.machines[(NS, NAME)].annotations == {SKIP_REMEDIATION: ""}
    cluster.annotate(NS, NAME, {SKIP_REMEDIATION: None, "other": "x"})  # another change, not a mark
    assert cluster.mark_skip_remediation(stale, run.ident)  # re-read, then set on the Machine as it is now
    assert cluster.machines[(NS, NAME)].annotations == {
        "other": "x",
        SKIP_REMEDIATION: "",
        SKIP_REMEDIATION_BY: run.ident,
    }
    assert cluster.annotation_writes == 1


def test_the_in_place_update_condition_is_true_only_while_a_disruptive_step_runs(
    cluster: FakeManagement,
) -> None:
    side, run = side_for(cluster), request("kubelet_args", "users")
    node = cluster.cluster.nodes[NODE]
    side.step_started(run, "kubelet_args")
    assert node.updating == ("True", updating_message(run, "kubelet_args"))
    assert "kubelet_args" in node.updating[1] and run.machine in node.updating[1]
    side.step_started(run, "kubelet_args")  # the same step reported again: no second write
    assert node.condition_writes == 1
    side.step_started(run, "users")
    assert node.updating == ("False", IDLE_MESSAGE)
    side.after_play(run)
    assert node.condition_writes == 2


def test_after_a_crash_a_new_service_removes_the_marks_exactly_once(cluster: FakeManagement) -> None:
    run = request("kubelet_args")
    side_for(cluster).step_started(run, "kubelet_args")  # then the process dies
    assert cluster.annotation_writes == 1 and cluster.cluster.nodes[NODE].updating is not None
    restarted = side_for(cluster)  # nothing in memory: the marks on the Machine and the Node say it all
    restarted.after_play(run)
    restarted.settle(run, applied_at=0.0, address=None)
    restarted.failed(run, "retried and failed")
    assert cluster.machines[(NS, NAME)].annotations == {}
    assert cluster.annotation_writes == 2  # one mark, one removal
    assert cluster.cluster.nodes[NODE].updating == ("False", IDLE_MESSAGE)
    assert cluster.cluster.nodes[NODE].condition_writes == 2


def test_the_health_gate_waits_for_ready_and_the_target_version_then_fails_after_its_timeout(
    cluster: FakeManagement,
) -> None:
    side, run = side_for(cluster), request("kubernetes_version", target="v1.32.0")
    node = cluster.cluster.nodes[NODE]
    node.ready = False
    waiting = side.settle(run, applied_at=1e12, address="10.0.0.7")
    assert (waiting.state, waiting.message) == (
        ProgressState.IN_PROGRESS,
        f"health gate: waiting for Node {NODE} to be Ready",
    )
    node.ready = True
    waiting = side.settle(run, applied_at=1e12, address="10.0.0.7")
    assert (
        waiting.message
        == f"health gate: waiting for Node {NODE} to report kubelet v1.32.0 (it reports v1.31.0)"
    )
    failed = side.settle(run, applied_at=0.0, address="10.0.0.7")
    assert (failed.state, failed.message) == (
        ProgressState.FAILED,
        "health gate: the Node was not Ready with kubelet v1.32.0 within 60s after the update",
    )
    node.kubelet = "v1.32.0"
    assert side.settle(run, applied_at=0.0, address="10.0.0.7").state is ProgressState.DONE
    assert "Done" not in cluster.reasons()  # the run service says Done once every check holds


def test_each_step_reads_the_machine_once(cluster: FakeManagement) -> None:
    side, run = side_for(cluster), request("kubelet_args")
    steps: list[Callable[[], object]] = [
        lambda: side.addresses(run),
        lambda: side.before_play(run),
        lambda: side.drain(run, lambda message: None),
        lambda: side.step_started(run, "kubelet_args"),
        lambda: side.after_play(run),
        lambda: side.settle(run, applied_at=1e12, address=None),
        lambda: side.failed(run, "ntp: task failed"),
    ]
    for step in steps:
        before = cluster.calls.count["machine"]
        step()
        assert cluster.calls.count["machine"] - before == 1


def test_the_address_comes_from_the_machine_and_api_trouble_means_none_yet(
    cluster: FakeManagement, monkeypatch: pytest.MonkeyPatch
) -> None:
    side, run = side_for(cluster), request("users")
    assert side.addresses(run) == (("InternalIP", "10.0.0.7"),)
    cluster.calls.failing.add("machine")
    with pytest.raises(Unreachable):  # the API server away: in progress, never HostNotFound
        side.addresses(run)
    forbidden = Forbidden("get Machine default/m1: the API server answered 403", 403)
    monkeypatch.setattr(cluster, "machine", failing_with(forbidden))
    assert side.addresses(run) == ()


def test_events_are_one_per_state(cluster: FakeManagement) -> None:
    side, run = side_for(cluster), request("users")
    for _ in range(3):
        side.state(run, "Queued", "queued")
    side.state(run, "Running", "running: users")
    assert cluster.reasons() == ["Queued", "Running"]
    assert {event.about.kind for event in cluster.events} == {"Machine"}


def labelled(*pairs: tuple[str, str]) -> RunRequest:
    return RunRequest(NS, NAME, "ab" * 32, ("users",), {"users": {}}, labels=dict(pairs))


MD_LABEL = ("cluster.x-k8s.io/deployment-name", "md-0")
CLUSTER_LABEL = ("cluster.x-k8s.io/cluster-name", "c1")


def test_the_pause_annotation_on_the_deployment_or_cluster_holds_and_cancel_wins(
    cluster: FakeManagement,
) -> None:
    side, run = side_for(cluster), labelled(MD_LABEL, CLUSTER_LABEL)
    assert side.hold(run) is None
    cluster.owners[("Cluster", NS, "c1")] = {"inplace-extension.io/pause": "true", "other": "x"}
    assert side.hold(run) == Hold("paused by Cluster default/c1 (annotation inplace-extension.io/pause)")
    cluster.owners[("MachineDeployment", NS, "md-0")] = {"inplace-extension.io/pause": ""}
    assert side.hold(run) == Hold(
        "paused by MachineDeployment default/md-0 (annotation inplace-extension.io/pause)"
    )
    cluster.owners[("Cluster", NS, "c1")] = {"inplace-extension.io/pause": "cancel"}
    assert side.hold(run) == Hold(
        "cancelled by Cluster default/c1 (annotation inplace-extension.io/pause=cancel)", cancel=True
    )
    assert side.hold(labelled(("cluster.x-k8s.io/cluster-name", "other"))) is None  # not its cluster


def test_an_owner_that_cannot_be_read_holds_with_the_reason(
    cluster: FakeManagement, monkeypatch: pytest.MonkeyPatch
) -> None:
    def forbidden(kind: str, namespace: str, name: str) -> None:
        raise Forbidden("get Cluster default/c1: the API server answered 403", 403)

    monkeypatch.setattr(cluster, "owner_annotations", forbidden)
    held = side_for(cluster).hold(labelled(CLUSTER_LABEL))
    assert held == Hold(
        "pause: cannot read Cluster default/c1 (get Cluster default/c1: the API server answered 403)"
    )


@pytest.mark.parametrize("call", ["owner_annotations", "machine"])
def test_the_api_server_away_or_busy_is_raised_for_the_service_to_answer_in_progress(
    cluster: FakeManagement, monkeypatch: pytest.MonkeyPatch, call: str
) -> None:
    """Not a hold (its Waiting Event), not HostNotFound, not a health gate that times out: the run
    service answers ``cluster API unavailable: ...`` and posts nothing."""
    busy = Unreachable("get Cluster default/c1: the API server answered 429", 429)
    monkeypatch.setattr(cluster, call, failing_with(busy))
    side, run = side_for(cluster), labelled(CLUSTER_LABEL)
    with pytest.raises(Unreachable):
        side.hold(run) if call == "owner_annotations" else side.addresses(run)
    if call == "machine":
        with pytest.raises(Unreachable):
            side.settle(run, applied_at=0.0, address=None)
    assert cluster.events == []


def test_a_clean_up_the_api_server_missed_is_done_before_the_update_counts_as_done(
    cluster: FakeManagement, monkeypatch: pytest.MonkeyPatch
) -> None:
    side, run = side_for(cluster), request("kubelet_args")
    assert side.before_play(run) is None and side.drain(run, lambda message: None) is None
    side.step_started(run, "kubelet_args")
    cluster.calls.failing.add("machine")  # the API server is away when the play ends
    side.after_play(run)
    node = cluster.cluster.nodes[NODE]
    assert node.unschedulable and SKIP_REMEDIATION in cluster.machines[(NS, NAME)].annotations
    assert node.updating is not None and node.updating[0] == "True"
    # back, but each clean-up call still fails once (restarting): the Node is Ready, yet not done
    # the API server away is the run service's "cluster API unavailable" (never past the gate's timeout)
    for call in ("clear_updating", "uncordon"):
        cluster.calls.failing = {call}
        with pytest.raises(Unreachable):
            side.settle(run, applied_at=0.0, address=None)
    refused = "clear the condition: the API server answered 422"
    cluster.calls.failing.clear()
    monkeypatch.setattr(cluster, "unmark_skip_remediation", failing_with(KubeError(refused, 422)))
    waiting = side.settle(run, applied_at=1e12, address=None)
    assert (waiting.state, waiting.message) == (
        ProgressState.IN_PROGRESS,
        f"health gate: cannot clean up yet ({refused})",
    )
    failed = side.settle(run, applied_at=0.0, address=None)  # past the gate's timeout: it says why
    assert (failed.state, failed.message) == (
        ProgressState.FAILED,
        f"health gate: could not clean up within 60s after the update ({refused})",
    )
    monkeypatch.undo()
    cluster.calls.failing.clear()
    assert side.settle(run, applied_at=0.0, address=None).state is ProgressState.DONE
    assert not node.unschedulable and CORDONED_BY not in node.annotations
    assert node.updating is not None and node.updating[0] == "False"
    assert cluster.machines[(NS, NAME)].annotations == {}
    assert cluster.reasons().count("Uncordoned") == 1


def test_a_failure_says_whether_its_clean_up_is_done(cluster: FakeManagement) -> None:
    side, run = side_for(cluster), request("kubelet_args")
    assert side.before_play(run) is None and side.drain(run, lambda message: None) is None
    cluster.calls.failing.add("machine")  # the API server is away as the play ends and fails
    side.after_play(run)
    assert side.failed(run, "kubelet_args: task failed") is False
    cluster.calls.failing = {"uncordon"}
    assert side.failed(run, "kubelet_args: task failed") is False
    cluster.calls.failing.clear()
    assert side.failed(run, "kubelet_args: task failed") is True
    assert not cluster.cluster.nodes[NODE].unschedulable
    assert cluster.reasons().count("Failed") == 1 and cluster.reasons().count("Uncordoned") == 1
