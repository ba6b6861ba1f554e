"""The MCM agent's own metrics, registered in the service's :class:`inplace_extension.metrics.Metrics`
registry (which also carries the run metrics of the shared run service). Label values come from our
own tables (results), never from Node names, so the series stay bounded."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

from inplace_extension.metrics import NAMESPACE, Metrics


class AgentMetrics:
    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics
        self._updating_nodes: set[str] = set()
        self._updating = Gauge(
            "mcm_nodes_updating",
            "Nodes whose in-place update this agent is running now.",
            namespace=NAMESPACE,
            registry=metrics.registry,
        )
        self._updating.set_function(lambda: len(self._updating_nodes))
        self._results = Counter(
            "mcm_update_results",
            "Results written to Nodes (update-result label) by value.",
            ["result"],
            namespace=NAMESPACE,
            registry=metrics.registry,
        )
        self._taints = Counter(
            "mcm_critical_taints_removed",
            "critical-components-not-ready taints removed after MCM finished a Node.",
            namespace=NAMESPACE,
            registry=metrics.registry,
        )

    def set_updating(self, node: str, updating: bool) -> None:
        if updating:
            self._updating_nodes.add(node)
        else:
            self._updating_nodes.discard(node)

    def is_updating(self, node: str) -> bool:
        return node in self._updating_nodes

    def result(self, value: str) -> None:
        self._results.labels(result=value).inc()

    def taint_removed(self) -> None:
        self._taints.inc()
