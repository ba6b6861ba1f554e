"""KubeClusterSide: the runs layer's ``ClusterSide`` in a real cluster (drain, MHC, health gate, Events).

Called from worker threads (never the event loop); every cluster error is turned into a stable message
or a log line, never an exception into the runs layer. Which steps are disruptive comes from the one
table of disruption classes (``inplace/capabilities.py`` and the capabilities file).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

from inplace_extension.inplace.capabilities import disruption_of, drain_point
from inplace_extension.inplace.custom import CustomTable, Disruption
from inplace_extension.kube.cluster import connect_management
from inplace_extension.kube.errors import KubeError, Unreachable
from inplace_extension.kube.events import machine_event
from inplace_extension.kube.port import (
    ClusterObjects,
    DrainError,
    DrainPolicy,
    MachineFacts,
    ManagementCluster,
)
from inplace_extension.kube.update_condition import CONDITION as UPDATE_CONDITION
from inplace_extension.kubeaware import health
from inplace_extension.kubejobs.manifest import ATTEMPT_POD_LABELS
from inplace_extension.runs import holds, progress
from inplace_extension.runs.model import Blocked, Hold, Progress, ProgressState, RunRequest
from inplace_extension.settings import Settings

log = logging.getLogger(__name__)

VERSION_STEP = "kubernetes_version"
CLUSTER_LABEL = "cluster.x-k8s.io/cluster-name"  # CAPI sets it on every Machine
VERSION_INPUT = "kubernetes_version_target"
# the objects a Machine's labels name, most specific first (CAPI sets these labels on every Machine)
HOLD_OWNERS = (
    ("MachineDeployment", "cluster.x-k8s.io/deployment-name"),
    ("KubeadmControlPlane", "cluster.x-k8s.io/control-plane-name"),
    ("Cluster", CLUSTER_LABEL),
)


class KubeClusterSide:
    """``ClusterSide`` over the management cluster's port. Each step reads the Machine once and hands
    its facts to what it does next."""

    def __init__(self, management: ManagementCluster, settings: Settings, custom: CustomTable) -> None:
        self._management = management
        self._custom = custom
        self._drain = settings.drain
        self._policy = DrainPolicy(
            timeout_seconds=settings.drain_timeout_seconds,
            grace_seconds=settings.drain_grace_seconds,
            delete_empty_dir_data=settings.drain_delete_emptydir_data,
            wait_for_blocking_budgets=settings.drain_wait_for_blocking_pdbs,
            # the kubernetes executor's Jobs updating other Machines may run on this Node: never a user's
            # workload (kube/drain.py)
            attempt_labels=ATTEMPT_POD_LABELS,
        )
        self._gate_seconds = settings.health_gate_timeout_seconds
        # run ident -> steps found not to disrupt the node this time (before the play; read by its steps)
        self._idle: dict[str, frozenset[str]] = {}

    def close(self) -> None:
        """Post the queued Events, then close every connection."""
        self._management.close()

    # -- what the runs layer calls -------------------------------------------------------------------

    def addresses(self, request: RunRequest) -> Sequence[tuple[str, str]]:
        try:
            facts = self._machine(request)
        except Unreachable:
            raise  # the API server away or busy: in progress, never HostNotFound
        except KubeError as exc:  # HostNotFound now; the next poll asks again
            log.warning("machine=%s: cannot read the Machine: %s", request.machine, exc.message)
            return ()
        return facts.addresses if facts is not None else ()

    def hold(self, request: RunRequest) -> Hold | None:
        """The pause annotation on the Machine's MachineDeployment or control plane, then its Cluster;
        ``cancel`` on any of them wins. An owner that cannot be read holds too (a pause must not be
        missed because the API server did not answer)."""
        found: list[Hold] = []
        for kind, label in HOLD_OWNERS:
            name = request.labels.get(label)
            if not name:
                continue
            owner = f"{kind} {request.namespace}/{name}"
            try:
                annotations = self._management.owner_annotations(kind, request.namespace, name)
            except Unreachable:
                raise  # the API server away or busy: in progress with nothing posted, nothing starts
            except KubeError as exc:
                return holds.unreadable(owner, exc.message)
            hold = holds.hold_of(owner, annotations)
            if hold is not None and hold.cancel:
                return hold
            if hold is not None:
                found.append(hold)
        return found[0] if found else None

    def before_play(self, request: RunRequest) -> Blocked | None:
        try:
            facts = self._machine(request)
            self._idle[request.ident] = self._idle_steps(request, facts)
        except KubeError as exc:  # the API, not the workloads: try again with backoff
            message = f"drain: {exc.message}"
            self.state(request, "DrainFailed", message, warning=True)
            return Blocked(message, retriable=True)
        if self.drain_point(request) is not None and (facts is None or facts.node_name is None):
            return Blocked("drain: the Machine has no status.nodeRef, so there is no Node to drain")
        return None

    def drain_point(self, request: RunRequest) -> str | None:
        """Right before the first step that disrupts the node this time (``--drain auto``), or the first
        step (``always``): the steps before it run on a schedulable Node."""
        idle = self._idle.get(request.ident, frozenset())
        return drain_point(request.capabilities, self._drain, self._custom, idle)

    def drain(self, request: RunRequest, report: Callable[[str], None]) -> Blocked | None:
        try:
            facts = self._machine(request)
            if facts is None or facts.node_name is None:
                return Blocked("drain: the Machine has no status.nodeRef, so there is no Node to drain")
            workload, node = self._management.workload(facts.namespace, facts.cluster), facts.node_name
            ours = workload.cordon(node, request.machine)
            log.info(
                "machine=%s run=%s node=%s cordoned (ours=%s)", request.machine, request.ident, node, ours
            )
            workload.drain(node, self._policy, lambda n: report(progress.draining(n)))
        except DrainError as exc:  # remembered, unless what held it up goes away by itself
            self.state(request, "DrainFailed", str(exc), warning=True)
            return Blocked(str(exc), retriable=exc.retriable)
        except KubeError as exc:  # the API, not the workloads: try again with backoff
            message = f"drain: {exc.message}"
            self.state(request, "DrainFailed", message, warning=True)
            return Blocked(message, retriable=True)
        self.state(request, "Drained", f"drained Node {node}")
        return None

    def step_started(self, request: RunRequest, capability: str) -> None:
        """A step that restarts the kubelet or more: skip-remediation on the Machine and the Node condition
        ``DisruptiveInPlaceUpdate`` True (MachineHealthCheck leaves the Machine alone); any other step:
        both undone."""
        self.state(request, "Running", progress.running(capability))
        try:
            facts = self._machine(request)
            if facts is None:
                return
            if self._disruption(request, capability) >= Disruption.RESTART_KUBELET:
                self._management.mark_skip_remediation(facts, request.ident)
                if facts.node_name is not None:
                    workload = self._management.workload(facts.namespace, facts.cluster)
                    if workload.show_updating(facts.node_name, updating_message(request, capability)):
                        log.info(
                            "machine=%s run=%s node=%s: condition %s True",
                            request.machine,
                            request.ident,
                            facts.node_name,
                            UPDATE_CONDITION,
                        )
            else:
                self._release_marks(request, facts)
        except KubeError as exc:
            log.warning(
                "machine=%s run=%s: skip-remediation: %s", request.machine, request.ident, exc.message
            )

    def after_play(self, request: RunRequest) -> None:
        self._idle.pop(request.ident, None)
        self._release(request, self._machine_for_cleanup(request))

    def failed(self, request: RunRequest, message: str) -> bool:
        try:
            unclean = self._release(request, self._machine(request))
        except KubeError as exc:  # the Machine could not be read: nothing is known to be clean
            log.warning("machine=%s run=%s: clean-up: %s", request.machine, request.ident, exc.message)
            unclean = exc.message
        self.state(request, "Failed", message, warning=True)  # the same Event when told again
        return unclean is None

    def settle(self, request: RunRequest, applied_at: float, address: str | None) -> Progress:
        """Clean up, then the health gate: Node Ready and, for an upgrade, the kubelet at the target,
        then the user-defined HTTP checks (``health_checks`` of the capabilities file) against ``address``
        (their command checks ran in the play, before the stamp)."""
        target = request.inputs.get(VERSION_STEP, {}).get(VERSION_INPUT)
        unclean: str | None = None  # why our cordon, skip-remediation or condition is still there
        try:
            facts = self._machine(request)
        except Unreachable:
            raise  # the API server away or busy: in progress, the gate's timeout never fails it
        except KubeError as exc:
            log.warning("machine=%s run=%s: clean-up: %s", request.machine, request.ident, exc.message)
            waiting: str | None = f"cannot read the Node yet ({exc.message})"
        else:
            # never done while something of ours is left: a clean-up the API server missed (an outage
            # at the end of the play, or now) is tried again on the next poll
            unclean = self._release(request, facts, outage_raises=True)
            waiting = f"cannot clean up yet ({unclean})" if unclean else self._gate(facts, target)
        waiting = waiting or health.first_failing(self._custom.http_checks, address)
        if waiting is None:  # the run service says Done once the checks of cluster objects hold too
            return Progress(ProgressState.DONE, progress.APPLIED)
        if time.time() - applied_at < self._gate_seconds:
            return Progress(ProgressState.IN_PROGRESS, progress.health_waiting(waiting))
        wanted = "Ready" + (f" with kubelet {target}" if target else "")
        checks = f" and passing {', '.join(c.name for c in self._custom.http_checks)}"
        wanted += checks if self._custom.http_checks else ""
        message = f"health gate: the Node was not {wanted} within {self._gate_seconds}s after the update"
        if unclean:
            message = (
                f"health gate: could not clean up within {self._gate_seconds}s after the update ({unclean})"
            )
        self.state(request, "Failed", message, warning=True)
        return Progress(ProgressState.FAILED, message)

    @property
    def management(self) -> ManagementCluster:
        """The management cluster (the infrastructure machines whose tags UpdateMachine waits for, and the
        Machines that keep that wait's clock)."""
        return self._management

    def reported_version(self, request: RunRequest) -> str | None:
        """The kubelet version the Machine's Node reports (None: no Machine, no Node yet); KubeError when
        the cluster cannot be read."""
        facts = self._machine(request)
        if facts is None or facts.node_name is None:
            return None
        node = self._management.workload(facts.namespace, facts.cluster).node_health(facts.node_name)
        return node.kubelet_version if node.exists else None

    def objects_of(self, request: RunRequest) -> ClusterObjects:
        """The Machine's workload cluster, where the ``kubernetes`` health checks read their objects
        (the Machine's cluster label, else its ``spec.clusterName``); KubeError when it cannot be told."""
        cluster = request.labels.get(CLUSTER_LABEL)
        if not cluster:
            facts = self._machine(request)
            if facts is None:
                raise KubeError(f"no Machine {request.machine}, so no workload cluster to read")
            cluster = facts.cluster
        return self._management.workload(request.namespace, cluster)

    def state(self, request: RunRequest, reason: str, message: str, warning: bool = False) -> None:
        kind = "Warning" if warning else "Normal"
        self._management.record(
            machine_event(request.namespace, request.name, None, request.ident, kind, reason, message)
        )

    # -- helpers --------------------------------------------------------------------------------------

    def _disruption(self, request: RunRequest, capability: str) -> Disruption:
        if capability in self._idle.get(request.ident, ()):
            return Disruption.NONE
        return disruption_of(capability, self._custom)

    def _idle_steps(self, request: RunRequest, facts: MachineFacts | None) -> frozenset[str]:
        """Steps that will not disrupt the node although their class says so: UpdateMachine plans
        ``kubernetes_version`` whenever the Machine has a version (CAPI sends no ``current``), and the
        role does nothing when the kubelet already runs the target; the Node says which it runs."""
        target = request.inputs.get(VERSION_STEP, {}).get(VERSION_INPUT)
        if target is None or facts is None or facts.node_name is None:
            return frozenset()
        node = self._management.workload(facts.namespace, facts.cluster).node_health(facts.node_name)
        return frozenset({VERSION_STEP}) if node.kubelet_version == target else frozenset()

    def _machine(self, request: RunRequest) -> MachineFacts | None:
        return self._management.machine(request.namespace, request.name)

    def _machine_for_cleanup(self, request: RunRequest) -> MachineFacts | None:
        try:
            return self._machine(request)
        except KubeError as exc:  # the next poll (settle / failed) tries again
            log.warning("machine=%s run=%s: clean-up: %s", request.machine, request.ident, exc.message)
            return None

    def _gate(self, facts: MachineFacts | None, target: str | None) -> str | None:
        """None when healthy, else what the gate waits for (deterministic for the same cluster state)."""
        if facts is None or facts.node_name is None:
            return "waiting for the Machine's status.nodeRef"
        node = facts.node_name
        try:
            health = self._management.workload(facts.namespace, facts.cluster).node_health(node)
        except Unreachable:
            raise  # the API server away or busy: in progress, the gate's timeout never fails it
        except KubeError as exc:
            return f"cannot read the Node yet ({exc.message})"
        if not health.exists:
            return f"waiting for Node {node} to exist"
        if not health.ready:
            return f"waiting for Node {node} to be Ready"
        if target is not None and health.kubelet_version != target:
            return f"waiting for Node {node} to report kubelet {target} (it reports {health.kubelet_version})"
        return None

    def _release_marks(self, request: RunRequest, facts: MachineFacts) -> None:
        """Remove our skip-remediation and set ``DisruptiveInPlaceUpdate`` False: each at most once, any
        caller (the run, or a restarted service that finds them on the Machine and the Node after a crash)."""
        if self._management.unmark_skip_remediation(facts):
            log.info("machine=%s run=%s: skip-remediation removed", request.machine, request.ident)
        if facts.node_name is None:
            return
        try:
            cleared = self._management.workload(facts.namespace, facts.cluster).clear_updating(
                facts.node_name
            )
        except Unreachable:
            raise  # the condition must not stay True: the next poll tries again
        except KubeError as exc:  # e.g. no nodes/status patch: the condition only informs, go on
            log.warning(
                "machine=%s run=%s: condition %s: %s",
                request.machine,
                request.ident,
                UPDATE_CONDITION,
                exc.message,
            )
            return
        if cleared:
            log.info(
                "machine=%s run=%s node=%s: condition %s False",
                request.machine,
                request.ident,
                facts.node_name,
                UPDATE_CONDITION,
            )

    def _release(
        self, request: RunRequest, facts: MachineFacts | None, outage_raises: bool = False
    ) -> str | None:
        """Undo our marks, and uncordon a Node we cordoned: each at most once, any caller. None when
        nothing of ours is left (or no Machine to read), else the API server's error; with
        ``outage_raises``, the API server away or busy raises (settle: in progress, never past the gate)."""
        if facts is None:
            return None
        try:
            self._release_marks(request, facts)
            if facts.node_name is None:
                return None
            workload = self._management.workload(facts.namespace, facts.cluster)
            if workload.uncordon(facts.node_name, request.machine):
                log.info(
                    "machine=%s run=%s node=%s uncordoned", request.machine, request.ident, facts.node_name
                )
                self.state(request, "Uncordoned", f"uncordoned Node {facts.node_name}")
        except KubeError as exc:  # the next poll (settle / failed) tries again
            if outage_raises and isinstance(exc, Unreachable):
                raise
            log.warning("machine=%s run=%s: clean-up: %s", request.machine, request.ident, exc.message)
            return exc.message
        return None


def updating_message(request: RunRequest, capability: str) -> str:
    """The ``DisruptiveInPlaceUpdate`` condition's message while ``capability`` runs (names the Machine
    and step)."""
    return f"in-place update of Machine {request.machine}: {capability} runs (it may restart the kubelet)"


def connect_cluster_side(settings: Settings, custom: CustomTable) -> KubeClusterSide:
    """The cluster side for ``serve``: the management cluster from ``--kubeconfig`` or the in-cluster
    account, workload clusters as ``--workload-kubeconfig`` says."""
    return KubeClusterSide(
        connect_management(settings.kubeconfig, settings.workload_kubeconfig), settings, custom
    )
