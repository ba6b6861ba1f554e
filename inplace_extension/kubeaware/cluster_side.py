"""KubeClusterSide: the runs layer's ``ClusterSide`` in a real cluster (drain, MHC, health gate, Events).

Called from worker threads (never the event loop); every cluster error is turned into a stable message
or a log line, never an exception into the runs layer. Which steps are disruptive comes from the one
table of disruption classes (``inplace/capabilities.py`` and the capabilities file).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from inplace_extension.inplace.capabilities import disruption_of, first_disruptive
from inplace_extension.inplace.custom import CustomTable, Disruption
from inplace_extension.kube import drain, machines, nodes
from inplace_extension.kube.client import connect
from inplace_extension.kube.events import EventRecorder, MachineEvent
from inplace_extension.kube.machines import KubeError, MachineFacts, Unreachable
from inplace_extension.kube.workload import WorkloadClients
from inplace_extension.kubeaware import health
from inplace_extension.runs import progress
from inplace_extension.runs.model import Blocked, Progress, ProgressState, RunRequest
from inplace_extension.settings import Settings

log = logging.getLogger(__name__)

VERSION_STEP = "kubernetes_version"
VERSION_INPUT = "kubernetes_version_target"


def _why(exc: Exception) -> str:
    """A stable, secret-free reason: our KubeError's message, or the transport error's class."""
    if isinstance(exc, KubeError):
        return exc.message
    return f"the API server is unreachable ({type(exc).__name__})"


class KubeClusterSide:
    """``ClusterSide`` over a management-cluster client (opaque here: only ``inplace_extension.kube``
    knows the client library)."""

    def __init__(self, management: Any, settings: Settings, custom: CustomTable) -> None:
        self._management = management
        self._workload = WorkloadClients(management, settings.workload_kubeconfig)
        self._events = EventRecorder(management, self._machine_uid)
        self._custom = custom
        self._drain = settings.drain
        self._policy = drain.DrainPolicy(
            timeout_seconds=settings.drain_timeout_seconds,
            grace_seconds=settings.drain_grace_seconds,
            delete_empty_dir_data=settings.drain_delete_emptydir_data,
            wait_for_blocking_budgets=settings.drain_wait_for_blocking_pdbs,
        )
        self._gate_seconds = settings.health_gate_timeout_seconds
        # run ident -> steps found not to disrupt the node this time (before the play; read by its steps)
        self._idle: dict[str, frozenset[str]] = {}

    def close(self) -> None:
        """Post the queued Events, then close every client."""
        self._events.close()
        self._workload.close()
        self._management.close()

    # -- what the runs layer calls -------------------------------------------------------------------

    def addresses(self, request: RunRequest) -> Sequence[tuple[str, str]]:
        try:
            facts = self._machine(request)
        except (KubeError, Unreachable) as exc:  # HostNotFound now; the next poll asks again
            log.warning("machine=%s: cannot read the Machine: %s", request.machine, _why(exc))
            return ()
        return facts.addresses if facts is not None else ()

    def before_play(self, request: RunRequest, report: Callable[[str], None]) -> Blocked | None:
        try:
            self._idle[request.ident] = self._idle_steps(request)
            if not self.needs_drain(request):
                return None
            facts = self._machine(request)
            if facts is None or facts.node_name is None:
                return Blocked("drain: the Machine has no status.nodeRef, so there is no Node to drain")
            client, node = self._workload.get(facts.namespace, facts.cluster), facts.node_name
            ours = drain.cordon(client, node, request.machine)
            log.info(
                "machine=%s run=%s node=%s cordoned (ours=%s)", request.machine, request.ident, node, ours
            )
            drain.drain(client, node, self._policy, lambda n: report(progress.draining(n)))
        except drain.DrainError as exc:
            self.state(request, "DrainFailed", str(exc), warning=True)
            return Blocked(str(exc))
        except (KubeError, Unreachable) as exc:  # the API, not the workloads: try again with backoff
            message = f"drain: {_why(exc)}"
            self.state(request, "DrainFailed", message, warning=True)
            return Blocked(message, retriable=True)
        self.state(request, "Drained", f"drained Node {node}")
        return None

    def step_started(self, request: RunRequest, capability: str) -> None:
        self.state(request, "Running", progress.running(capability))
        try:
            if self._disruption(request, capability) >= Disruption.RESTART_KUBELET:
                machines.mark_skip_remediation(
                    self._management, request.namespace, request.name, request.ident
                )
            else:
                machines.unmark_skip_remediation(self._management, request.namespace, request.name)
        except (KubeError, Unreachable) as exc:
            log.warning("machine=%s run=%s: skip-remediation: %s", request.machine, request.ident, _why(exc))

    def after_play(self, request: RunRequest) -> None:
        self._idle.pop(request.ident, None)
        self._release(request)

    def failed(self, request: RunRequest, message: str) -> None:
        self._release(request)
        self.state(request, "Failed", message, warning=True)

    def settle(self, request: RunRequest, applied_at: float, address: str | None) -> Progress:
        """Clean up, then the health gate: Node Ready and, for an upgrade, the kubelet at the target,
        then the user-defined HTTP checks (``health_checks`` of the capabilities file) against ``address``
        (their command checks ran in the play, before the stamp)."""
        self._release(request)
        target = request.inputs.get(VERSION_STEP, {}).get(VERSION_INPUT)
        waiting = self._gate(request, target) or health.first_failing(self._custom.http_checks, address)
        if waiting is None:
            self.state(request, "Done", progress.APPLIED)
            return Progress(ProgressState.DONE, progress.APPLIED)
        if time.time() - applied_at < self._gate_seconds:
            return Progress(ProgressState.IN_PROGRESS, progress.health_waiting(waiting))
        wanted = "Ready" + (f" with kubelet {target}" if target else "")
        checks = f" and passing {', '.join(c.name for c in self._custom.http_checks)}"
        wanted += checks if self._custom.http_checks else ""
        message = f"health gate: the Node was not {wanted} within {self._gate_seconds}s after the update"
        self.state(request, "Failed", message, warning=True)
        return Progress(ProgressState.FAILED, message)

    def state(self, request: RunRequest, reason: str, message: str, warning: bool = False) -> None:
        kind = "Warning" if warning else "Normal"
        event = MachineEvent(request.namespace, request.name, None, request.ident, kind, reason, message)
        self._events.record(event)

    # -- helpers --------------------------------------------------------------------------------------

    def needs_drain(self, request: RunRequest) -> bool:
        if self._drain == "never":
            return False
        steps = [c for c in request.capabilities if c not in self._idle.get(request.ident, ())]
        return self._drain == "always" or first_disruptive(steps, self._custom) is not None

    def _disruption(self, request: RunRequest, capability: str) -> Disruption:
        if capability in self._idle.get(request.ident, ()):
            return Disruption.NONE
        return disruption_of(capability, self._custom)

    def _idle_steps(self, request: RunRequest) -> frozenset[str]:
        """Steps that will not disrupt the node although their class says so: UpdateMachine plans
        ``kubernetes_version`` whenever the Machine has a version (CAPI sends no ``current``), and the
        role does nothing when the kubelet already runs the target; the Node says which it runs."""
        target = request.inputs.get(VERSION_STEP, {}).get(VERSION_INPUT)
        if target is None:
            return frozenset()
        facts = self._machine(request)
        if facts is None or facts.node_name is None:
            return frozenset()
        node = nodes.node_health(self._workload.get(facts.namespace, facts.cluster), facts.node_name)
        return frozenset({VERSION_STEP}) if node.kubelet_version == target else frozenset()

    def _machine_uid(self, namespace: str, name: str) -> str | None:
        facts = machines.get_machine(self._management, namespace, name)
        return facts.uid if facts is not None else None

    def _machine(self, request: RunRequest) -> MachineFacts | None:
        return machines.get_machine(self._management, request.namespace, request.name)

    def _gate(self, request: RunRequest, target: str | None) -> str | None:
        """None when healthy, else what the gate waits for (deterministic for the same cluster state)."""
        try:
            facts = self._machine(request)
            if facts is None or facts.node_name is None:
                return "waiting for the Machine's status.nodeRef"
            health = nodes.node_health(self._workload.get(facts.namespace, facts.cluster), facts.node_name)
        except (KubeError, Unreachable) as exc:
            return f"cannot read the Node yet ({_why(exc)})"
        node = facts.node_name
        if not health.exists:
            return f"waiting for Node {node} to exist"
        if not health.ready:
            return f"waiting for Node {node} to be Ready"
        if target is not None and health.kubelet_version != target:
            return f"waiting for Node {node} to report kubelet {target} (it reports {health.kubelet_version})"
        return None

    def _release(self, request: RunRequest) -> None:
        """Uncordon a Node we cordoned and remove our skip-remediation: each at most once, any caller."""
        try:
            if machines.unmark_skip_remediation(self._management, request.namespace, request.name):
                log.info("machine=%s run=%s: skip-remediation removed", request.machine, request.ident)
            facts = self._machine(request)
            if facts is None or facts.node_name is None:
                return
            client = self._workload.get(facts.namespace, facts.cluster)
            if drain.uncordon(client, facts.node_name, request.machine):
                log.info(
                    "machine=%s run=%s node=%s uncordoned", request.machine, request.ident, facts.node_name
                )
                self.state(request, "Uncordoned", f"uncordoned Node {facts.node_name}")
        except (KubeError, Unreachable) as exc:  # the next poll (settle / failed) tries again
            log.warning("machine=%s run=%s: clean-up: %s", request.machine, request.ident, _why(exc))


def connect_cluster_side(settings: Settings, custom: CustomTable) -> KubeClusterSide:
    """The cluster side for ``serve``: a management client from ``--kubeconfig`` or the in-cluster account."""
    return KubeClusterSide(connect(settings.kubeconfig), settings, custom)
