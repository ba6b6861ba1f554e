"""PodDisruptionBudgets that can never allow an eviction, so a drain fails at once instead of timing out.

A refused eviction (HTTP 429) usually clears by itself: a replacement Pod becomes ready elsewhere and
the budget allows the next one. Two budgets never clear while the drain waits:

- ``maxUnavailable: 0`` (or ``0%``): no Pod it selects may ever be disrupted;
- a budget whose every expected Pod is healthy and that still allows no disruption (``minAvailable``
  equal to the number of its Pods): there is nothing else that could become ready first. Judged from
  the status the disruption controller wrote for the budget's current generation, as
  machine-controller-manager's drain judges a misconfigured budget.

:func:`blocking_budget` names the first such budget selecting a Pod whose eviction was refused. The label
selector is matched here (``matchLabels`` and ``matchExpressions``), as the API server does.
"""

from __future__ import annotations

from collections.abc import Mapping

from lightkube import Client
from lightkube.models.meta_v1 import LabelSelector
from lightkube.resources.core_v1 import Pod
from lightkube.resources.policy_v1 import PodDisruptionBudget

from inplace_extension.kube.client import translated

MAX_UNAVAILABLE_ZERO = "maxUnavailable is 0"
ALL_HEALTHY_NONE_ALLOWED = "it allows no disruption with all of its Pods healthy"


def never_allows(pdb: PodDisruptionBudget) -> str | None:
    """Why ``pdb`` can never allow an eviction (one of the reasons above), or None."""
    spec, status, metadata = pdb.spec, pdb.status, pdb.metadata
    if spec is not None and str(spec.maxUnavailable) in ("0", "0%"):
        return MAX_UNAVAILABLE_ZERO
    if status is None or metadata is None or status.observedGeneration != metadata.generation:
        return None  # not judged yet for this spec: the controller may still allow disruptions
    expected = status.expectedPods or 0
    if expected > 0 and (status.currentHealthy or 0) >= expected and (status.disruptionsAllowed or 0) == 0:
        return ALL_HEALTHY_NONE_ALLOWED
    return None


def selects(selector: LabelSelector | None, labels: Mapping[str, str]) -> bool:
    """The label selector matches ``labels``. A budget with an empty selector selects every Pod of its
    namespace (policy/v1), and a missing one none."""
    if selector is None:
        return False
    if any(labels.get(key) != value for key, value in (selector.matchLabels or {}).items()):
        return False
    for requirement in selector.matchExpressions or []:
        present, values = requirement.key in labels, requirement.values or []
        operator = requirement.operator
        if operator == "In" and not (present and labels[requirement.key] in values):
            return False
        if operator == "NotIn" and present and labels[requirement.key] in values:
            return False
        if operator == "Exists" and not present:
            return False
        if operator == "DoesNotExist" and present:
            return False
    return True


def blocking_budget(client: Client, pod: Pod) -> tuple[str, str] | None:
    """(``namespace/name`` of a budget selecting ``pod`` that can never allow its eviction, why), or None."""
    metadata = pod.metadata
    if metadata is None or metadata.namespace is None:
        return None
    with translated(f"list PodDisruptionBudgets in {metadata.namespace}"):
        budgets = list(client.list(PodDisruptionBudget, namespace=metadata.namespace))
    labels = metadata.labels or {}
    for pdb in sorted(budgets, key=lambda b: str(b.metadata.name if b.metadata else "")):
        if selects(pdb.spec.selector if pdb.spec else None, labels):
            reason = never_allows(pdb)
            if reason is not None:
                return f"{metadata.namespace}/{pdb.metadata.name if pdb.metadata else ''}", reason
    return None
