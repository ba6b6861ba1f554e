"""deploy/monitoring's alerts evaluated by the real promtool on the series the service exports.

promtool (Prometheus' own rule checker and rule unit tester) is built by kubelab from
``github.com/prometheus/prometheus/cmd/promtool`` (labs/kubelab/build.py). ``promtool check rules``
checks the PrometheusRule's groups as Prometheus loads them; ``promtool test rules`` runs the unit tests
this module writes: for each shipped alert a case where it fires (its labels and annotations checked)
and cases where it stays silent, every alert checked at every evaluation time.

The input series are not written by hand: they are the real service's ``/metrics`` at rest (every
sample, named and labelled as it exports them), once per replica of ``deploy/`` with the labels a
Prometheus scrape adds, and a case only changes the values of the series it is about, found by its
family in :data:`inplace_extension.metrics.FAMILIES`. A metric renamed in the service, or a rule that
no longer selects what the service exports, fails here.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from hostlab.errors import LabError
from kubelab import build
from kubelab.config import Config
from kubelab.pytest_plugin import unavailable
from prometheus_client.parser import text_string_to_metric_families

from inplace_extension.metrics import FAMILIES, NAMESPACE

from .support import kustomize, one
from .test_monitoring import MONITORING, exposition

pytestmark = pytest.mark.kube

INTERVAL_MINUTES = 1  # the scrape interval of the input series and the rules' evaluation interval
# samples (minutes) of every input series: past the longest alert's threshold (2 h) and its for (5 min);
# the cases' values have as many
SAMPLES = 150
# The templates the shipped annotations use; a case gives the text each prints for its alert's value.
TEMPLATES = ("{{ $value }}", "{{ $value | humanizeDuration }}")


@dataclass(frozen=True)
class Case:
    """One promtool test group: the service at rest on every replica but for ``series``; at each
    evaluation time of ``checks`` the alerts named fire (each with the text its ``$value`` prints in
    the annotations) and every other shipped alert fires nothing."""

    name: str
    # FAMILIES key of an unlabelled gauge -> its promtool values on each replica (at rest elsewhere)
    series: Mapping[str, tuple[str, ...]]
    checks: Mapping[str, Mapping[str, str]]  # eval time ("130m") -> alert -> its $value as printed


CASES = (
    Case("at rest: nothing fires", {}, {"5m": {}, "30m": {}, "140m": {}}),
    # the age counts from the first attempt's start and grows with the clock (docs/operator-controls.md);
    # both replicas answered for the update, so both report it
    Case(
        "an update going on for over 2 hours fires after 5 minutes",
        {"oldest_update_age_seconds": ("0+60x149", "0+60x149")},
        # over 7200 from minute 121 (7260): pending, then firing from minute 126
        {"120m": {}, "125m": {}, "130m": {"InPlaceUpdateStuck": "2h 10m 0s"}},
    ),
    Case(
        "an update done before 2 hours does not fire; the age is 0 when none",
        {"oldest_update_age_seconds": ("0+60x110 0x38", "0+60x110 0x38")},
        {"110m": {}, "130m": {}, "145m": {}},
    ),
    Case(
        "an update over 2 hours that finishes within 5 minutes does not fire",
        {"oldest_update_age_seconds": ("0+60x123 0x25", "0x149")},
        {"123m": {}, "126m": {}, "130m": {}},
    ),
    Case(
        "a blocked update fires after a minute, counted once though both replicas report it",
        {"updates_blocked": ("0x4 1x144", "0x6 1x142")},
        {"5m": {}, "6m": {"InPlaceUpdateBlocked": "1"}, "30m": {"InPlaceUpdateBlocked": "1"}},
    ),
    Case(
        "two blocked updates only one replica answered for fire",
        {"updates_blocked": ("0x149", "0x9 2x139")},
        {"9m": {}, "11m": {"InPlaceUpdateBlocked": "2"}},
    ),
    Case(
        "an update blocked for less than a minute (retried at once) does not fire",
        {"updates_blocked": ("0x4 1 0x143", "0x149")},
        {"5m": {}, "6m": {}, "7m": {}},
    ),
    Case(
        "failed updates fire after 15 minutes",
        {"updates_failed": ("0x9 2x139", "0x9 1 2x138")},
        {"20m": {}, "24m": {}, "25m": {"InPlaceUpdateFailed": "2"}},
    ),
    Case(
        "an update failing for 10 minutes, then retried successfully, does not fire",
        {"updates_failed": ("0x9 1x10 0x128", "0x9 1x10 0x128")},
        {"15m": {}, "25m": {}, "40m": {}},
    ),
)


@pytest.fixture(scope="module")
def promtool() -> Path:
    """The promtool binary (kubelab's cached build; built once per machine and Prometheus release)."""
    try:
        return build.ensure_built(["promtool"], Config.from_env())["promtool"]
    except LabError as exc:
        unavailable(f"promtool cannot be built: {exc}")


@pytest.fixture(scope="module")
def rule() -> dict[str, Any]:
    """The shipped PrometheusRule as kustomize renders it."""
    (doc,) = kustomize(MONITORING)
    assert doc["kind"] == "PrometheusRule"
    return doc


@dataclass(frozen=True)
class Sample:
    """One sample of the service's exposition."""

    name: str
    labels: Mapping[str, str]
    value: float


@pytest.fixture(scope="module")
def at_rest(tmp_path_factory: pytest.TempPathFactory) -> tuple[Sample, ...]:
    """Every sample of the real service's ``/metrics`` at rest (no update asked about)."""
    text = exposition(tmp_path_factory.mktemp("runs"))
    return tuple(
        Sample(sample.name, dict(sample.labels), float(sample.value))
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    )


def series_key(name: str, labels: Mapping[str, str]) -> str:
    """A series as promtool's ``input_series`` writes it: ``name{label="value",...}``."""
    pairs = ",".join(f"{key}={json.dumps(value)}" for key, value in sorted(labels.items()))
    return f"{name}{{{pairs}}}"


def scrape_labels() -> list[dict[str, str]]:
    """The labels a Prometheus scrape adds to each replica's series (job, instance and, from the
    Prometheus Operator's monitors, namespace and pod): one set per replica of ``deploy/``."""
    deployment = one("Deployment", "inplace-extension")
    replicas = int(deployment["spec"]["replicas"])
    assert replicas >= 2, "the replica cases below assume more than one replica"
    namespace = deployment["metadata"]["namespace"]
    return [
        {
            "job": "inplace-extension",
            "instance": f"10.0.0.{index + 1}:9443",
            "namespace": namespace,
            "pod": f"inplace-extension-5d8f7c6b9-r{index}",
        }
        for index in range(replicas)
    ]


def exported(family: str, at_rest: tuple[Sample, ...]) -> str:
    """The sample name of an unlabelled gauge of FAMILIES in the service's exposition."""
    name = f"{NAMESPACE}_{family}"
    spec = FAMILIES[family]
    assert spec.kind == "gauge" and not spec.labels, f"{family}: the cases set unlabelled gauges"
    served = sorted(sample.name for sample in at_rest)
    assert (name, {}) in ((s.name, s.labels) for s in at_rest), f"not exported: {name}; served: {served}"
    return name


def rest_values(value: float) -> str:
    """A constant series of SAMPLES samples in promtool's expanding notation."""
    text = f"{value:.6f}".rstrip("0").rstrip(".")
    return f"{text}x{SAMPLES - 1}"


def sample_count(values: str) -> int:
    """How many samples promtool's expanding notation stands for (``axn`` and ``a+bxn``: n + 1)."""
    return sum(int(m.group(1)) + 1 if (m := re.search(r"x(\d+)$", term)) else 1 for term in values.split())


def expected_alert(rule: Mapping[str, Any], value: str) -> dict[str, Any]:
    """The alert promtool must see: the rule's labels; its annotations with ``$value`` printed."""
    annotations = {}
    for key, template in rule.get("annotations", {}).items():
        text = template
        for expression in TEMPLATES:
            text = text.replace(expression, value)
        # a template this module does not know would be compared unexpanded: say so instead
        assert "{{" not in text, f"{rule['alert']}.{key}: unknown template in {template!r}"
        annotations[key] = text
    return {"exp_labels": dict(rule.get("labels", {})), "exp_annotations": annotations}


def unit_tests(rule: Mapping[str, Any], at_rest: tuple[Sample, ...], rule_file: str) -> dict[str, Any]:
    """The ``promtool test rules`` file of :data:`CASES`."""
    alerts = {r["alert"]: r for group in rule["spec"]["groups"] for r in group["rules"] if "alert" in r}
    replicas = scrape_labels()
    tests = []
    for case in CASES:
        changed = {exported(family, at_rest): values for family, values in case.series.items()}
        for family, per_replica in case.series.items():
            assert len(per_replica) == len(replicas), f"{case.name}: {family} needs values per replica"
            assert all(sample_count(v) == SAMPLES for v in per_replica), f"{case.name}: {family}"
        input_series = []
        for index, target in enumerate(replicas):
            for sample in at_rest:
                case_values = changed.get(sample.name) if not sample.labels else None
                input_series.append(
                    {
                        "series": series_key(sample.name, {**sample.labels, **target}),
                        "values": case_values[index] if case_values else rest_values(sample.value),
                    }
                )
        checks = []
        for eval_time, firing in case.checks.items():
            unknown = set(firing) - set(alerts)
            assert not unknown, f"{case.name}: no such alert {unknown}"
            for alert, rule_of in alerts.items():
                expected = [expected_alert(rule_of, firing[alert])] if alert in firing else []
                checks.append({"eval_time": eval_time, "alertname": alert, "exp_alerts": expected})
        tests.append(
            {
                "name": case.name,
                "interval": f"{INTERVAL_MINUTES}m",
                "input_series": input_series,
                "alert_rule_test": checks,
            }
        )
    return {"rule_files": [rule_file], "evaluation_interval": f"{INTERVAL_MINUTES}m", "tests": tests}


def write_rules(rule: Mapping[str, Any], directory: Path) -> Path:
    """The PrometheusRule's groups as the Prometheus rule file the Operator gives Prometheus."""
    path = directory / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}, sort_keys=False))
    return path


def run_promtool(promtool: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(promtool), *args], cwd=cwd, capture_output=True, text=True, timeout=300, check=False
    )


def test_promtool_checks_the_shipped_rules(promtool: Path, rule: dict[str, Any], tmp_path: Path) -> None:
    rules = write_rules(rule, tmp_path)
    result = run_promtool(promtool, "check", "rules", "--lint=all", "--lint-fatal", rules.name, cwd=tmp_path)
    count = sum(len(group["rules"]) for group in rule["spec"]["groups"])
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {count} rules found" in result.stdout + result.stderr


def test_each_alert_fires_on_the_services_series_and_stays_silent_otherwise(
    promtool: Path, rule: dict[str, Any], at_rest: tuple[Sample, ...], tmp_path: Path
) -> None:
    alerts = {r["alert"] for group in rule["spec"]["groups"] for r in group["rules"] if "alert" in r}
    fired = {alert for case in CASES for firing in case.checks.values() for alert in firing}
    assert fired == alerts, f"every shipped alert needs a case where it fires: {sorted(alerts - fired)}"
    for alert in alerts:  # ... and one, beyond the rest state, where its series change and it does not
        assert any(
            case.series and all(alert not in firing for firing in case.checks.values()) for case in CASES
        ), f"{alert}: no case where it stays silent"
    write_rules(rule, tmp_path)
    tests = tmp_path / "alerts.test.yaml"
    tests.write_text(yaml.safe_dump(unit_tests(rule, at_rest, "rules.yaml"), sort_keys=False))
    result = run_promtool(promtool, "test", "rules", tests.name, cwd=tmp_path)
    assert result.returncode == 0, f"promtool test rules {tests}:\n{result.stdout}{result.stderr}"
    assert "SUCCESS" in result.stdout + result.stderr


def test_the_unit_tests_fail_when_a_rule_stops_matching_the_service(
    promtool: Path, rule: dict[str, Any], at_rest: tuple[Sample, ...], tmp_path: Path
) -> None:
    """The harness is not vacuous: rules selecting metrics the service does not export (as after a
    rename on either side) fail the cases where they should fire, each alert by name."""
    broken = json.loads(json.dumps(rule))
    for group in broken["spec"]["groups"]:
        for r in group["rules"]:
            r["expr"] = re.sub(rf"\b{NAMESPACE}_(\w+)", rf"{NAMESPACE}_renamed_\1", r["expr"])
    write_rules(broken, tmp_path)
    tests = tmp_path / "alerts.test.yaml"
    tests.write_text(yaml.safe_dump(unit_tests(rule, at_rest, "rules.yaml"), sort_keys=False))
    result = run_promtool(promtool, "test", "rules", tests.name, cwd=tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    for group in rule["spec"]["groups"]:
        for r in group["rules"]:
            assert f"alertname: {r['alert']}" in output, output
