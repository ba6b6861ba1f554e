"""Which PodDisruptionBudgets can never allow an eviction (the drain fails at once on them), and label
selector matching. No API server: the budgets are built as the disruption controller leaves them."""

from __future__ import annotations

from typing import Any

import pytest
from lightkube.models.meta_v1 import LabelSelector, LabelSelectorRequirement, ObjectMeta
from lightkube.models.policy_v1 import PodDisruptionBudgetSpec, PodDisruptionBudgetStatus
from lightkube.resources.policy_v1 import PodDisruptionBudget

from inplace_extension.kube.budgets import (
    ALL_HEALTHY_NONE_ALLOWED,
    MAX_UNAVAILABLE_ZERO,
    never_allows,
    selects,
)


def budget(spec: dict[str, Any], generation: int = 2, **status: Any) -> PodDisruptionBudget:
    return PodDisruptionBudget(
        metadata=ObjectMeta(name="web", namespace="default", generation=generation),
        spec=PodDisruptionBudgetSpec(selector=LabelSelector(matchLabels={"app": "web"}), **spec),
        status=PodDisruptionBudgetStatus(**status) if status else None,
    )


JUDGED: dict[str, Any] = {"observedGeneration": 2, "expectedPods": 3}


@pytest.mark.parametrize(
    ("pdb", "reason"),
    [
        (budget({"maxUnavailable": 0}), MAX_UNAVAILABLE_ZERO),
        (budget({"maxUnavailable": "0%"}), MAX_UNAVAILABLE_ZERO),
        # minAvailable equal to its healthy Pods: none may go and none else can become ready
        (
            budget({"minAvailable": 3}, **JUDGED, currentHealthy=3, desiredHealthy=3, disruptionsAllowed=0),
            ALL_HEALTHY_NONE_ALLOWED,
        ),
        (
            budget(
                {"minAvailable": "100%"}, **JUDGED, currentHealthy=3, desiredHealthy=3, disruptionsAllowed=0
            ),
            ALL_HEALTHY_NONE_ALLOWED,
        ),
        # exhausted for now, one Pod is not healthy yet: a replacement may become ready, so wait
        (
            budget({"minAvailable": 2}, **JUDGED, currentHealthy=2, desiredHealthy=2, disruptionsAllowed=0),
            None,
        ),
        # allows one right now
        (
            budget({"minAvailable": 2}, **JUDGED, currentHealthy=3, desiredHealthy=2, disruptionsAllowed=1),
            None,
        ),
        (budget({"maxUnavailable": 1}), None),
        # the status is of an older generation of the spec: not judged yet
        (
            budget(
                {"minAvailable": 3},
                observedGeneration=1,
                expectedPods=3,
                currentHealthy=3,
                disruptionsAllowed=0,
            ),
            None,
        ),
        # no Pods expected: nothing to say
        (
            budget(
                {"minAvailable": 1},
                observedGeneration=2,
                expectedPods=0,
                currentHealthy=0,
                disruptionsAllowed=0,
            ),
            None,
        ),
    ],
)
def test_never_allows(pdb: PodDisruptionBudget, reason: str | None) -> None:
    assert never_allows(pdb) == reason


def test_selectors_match_labels_and_expressions() -> None:
    labels = {"app": "web", "tier": "front"}
    assert selects(LabelSelector(), labels)  # empty: every Pod of the namespace
    assert not selects(None, labels)
    assert selects(LabelSelector(matchLabels={"app": "web"}), labels)
    assert not selects(LabelSelector(matchLabels={"app": "db"}), labels)

    def expr(operator: str, *values: str, key: str = "tier") -> LabelSelector:
        return LabelSelector(
            matchExpressions=[LabelSelectorRequirement(key=key, operator=operator, values=list(values))]
        )

    assert selects(expr("In", "front", "back"), labels)
    assert not selects(expr("In", "back"), labels)
    assert selects(expr("NotIn", "back"), labels)
    assert not selects(expr("NotIn", "front"), labels)
    assert selects(expr("Exists"), labels)
    assert not selects(expr("Exists", key="zone"), labels)
    assert selects(expr("DoesNotExist", key="zone"), labels)
    assert not selects(expr("DoesNotExist"), labels)
