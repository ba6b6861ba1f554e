"""deploy/monitoring: the PrometheusRule's shape, its PromQL, and that every metric it uses is served.

The structure is checked against a model of the PrometheusRule resource (monitoring.coreos.com/v1:
groups of rules, each an alert or a recording rule with an expression, Prometheus durations, string
labels and annotations, no unknown fields), every expression is parsed by ``promql-parser`` (the Rust
PromQL parser's Python binding), and every metric an expression selects must be in the exposition of
the service's real ``/metrics``. What each alert does on the service's series is unit-tested by the
real promtool in ``test_alert_rules.py``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import anyio
import httpx
import promql_parser
import pytest
from prometheus_client.parser import text_string_to_metric_families
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from run_deps import run_service

from inplace_extension.app import create_app
from inplace_extension.metrics import Metrics
from inplace_extension.settings import Settings

from .support import ROOT, kustomize

MONITORING = ROOT / "deploy" / "monitoring"
# Prometheus' duration format (model.ParseDuration), as the resource's fields take it
DURATION = r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class Rule(_Strict):
    alert: str | None = Field(None, min_length=1)
    record: str | None = Field(None, pattern=r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
    expr: str = Field(min_length=1)
    for_: str | None = Field(None, alias="for", pattern=DURATION)
    keep_firing_for: str | None = Field(None, pattern=DURATION)
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _alert_or_record(self) -> Rule:
        if (self.alert is None) == (self.record is None):
            raise ValueError("exactly one of alert and record")
        if self.record is not None and (self.annotations or self.for_):
            raise ValueError("annotations and for are for alerting rules")
        return self


class Group(_Strict):
    name: str = Field(min_length=1)
    interval: str | None = Field(None, pattern=DURATION)
    rules: list[Rule] = Field(min_length=1)


class Spec(_Strict):
    groups: list[Group] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique_groups(self) -> Spec:
        names = [group.name for group in self.groups]
        if len(names) != len(set(names)):
            raise ValueError("group names are the list's map keys: they must be unique")
        return self


class Metadata(BaseModel):
    name: str = Field(min_length=1)
    namespace: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)


class PrometheusRule(_Strict):
    api_version: Literal["monitoring.coreos.com/v1"] = Field(alias="apiVersion")
    kind: Literal["PrometheusRule"]
    metadata: Metadata
    spec: Spec


def metric_names(node: Any) -> Iterator[str]:
    """Every metric name a PromQL expression selects (vector and matrix selectors, at any depth)."""
    name = getattr(node, "name", None)
    if type(node).__name__ == "VectorSelector" and isinstance(name, str):
        yield name
    for attribute in ("expr", "lhs", "rhs", "vector_selector", "param", "args"):
        child = getattr(node, attribute, None)
        for item in child if isinstance(child, list | tuple) else [child]:
            if item is not None and not isinstance(item, str | int | float):
                yield from metric_names(item)


@pytest.fixture(scope="module")
def rule() -> PrometheusRule:
    (doc,) = kustomize(MONITORING)
    return PrometheusRule.model_validate(doc)


def exposition(runs_dir: Path) -> str:
    """The text of the real service's ``/metrics`` (hooks app + run service, one registry), at rest."""
    settings = Settings(plain_http=True, runs_dir=runs_dir)
    metrics = Metrics()
    runs = run_service(settings, metrics)
    try:
        app = create_app(settings, runs, metrics)
        transport = httpx.ASGITransport(app=app)

        async def scrape() -> str:
            async with httpx.AsyncClient(transport=transport, base_url="http://svc") as client:
                return (await client.get("/metrics")).text

        return anyio.run(scrape)
    finally:
        runs.close()


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> set[str]:
    """The sample names of the real service's ``/metrics``."""
    text = exposition(tmp_path_factory.mktemp("runs"))
    return {sample.name for family in text_string_to_metric_families(text) for sample in family.samples}


def test_the_rule_has_the_resources_shape_and_alerts_on_stuck_and_blocked_updates(
    rule: PrometheusRule,
) -> None:
    alerts = {r.alert for group in rule.spec.groups for r in group.rules}
    assert {"InPlaceUpdateStuck", "InPlaceUpdateBlocked"} <= alerts
    assert all(r.labels.get("severity") for group in rule.spec.groups for r in group.rules)


def test_every_expression_parses_and_uses_only_served_metrics(rule: PrometheusRule, served: set[str]) -> None:
    for group in rule.spec.groups:
        for r in group.rules:
            names = set(metric_names(promql_parser.parse(r.expr)))
            assert names, f"{r.alert}: selects no metric"
            assert names <= served, f"{r.alert}: not served: {sorted(names - served)}"


def test_the_checks_catch_a_broken_expression_an_unknown_metric_and_a_bad_shape(served: set[str]) -> None:
    with pytest.raises(ValueError, match="parenthesis"):
        promql_parser.parse("max(inplace_extension_updates_blocked > 0")
    names = set(metric_names(promql_parser.parse("rate(inplace_extension_updates_blockd[5m]) > 0")))
    assert names == {"inplace_extension_updates_blockd"} and not names <= served
    with pytest.raises(ValidationError, match="exactly one of alert and record"):
        Rule.model_validate({"expr": "up == 0"})
    with pytest.raises(ValidationError, match="for"):
        Rule.model_validate({"alert": "A", "expr": "up == 0", "for": "5 minutes"})
