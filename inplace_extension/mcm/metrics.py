"""The MCM agent's own metrics, registered in the service's :class:`inplace_extension.metrics.Metrics`
registry (which also carries the run metrics of the shared run service); their names, help and labels
are rows of :data:`inplace_extension.metrics.FAMILIES`. Label values come from our own tables
(results), never from Node names, so the series stay bounded."""

from __future__ import annotations

from inplace_extension.metrics import Metrics


class AgentMetrics:
    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics
        self._updating_nodes: set[str] = set()
        self._updating = metrics.gauge("mcm_nodes_updating")
        self._updating.set_function(lambda: len(self._updating_nodes))
        self._results = metrics.counter("mcm_update_results")
        self._taints = metrics.counter("mcm_critical_taints_removed")

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
