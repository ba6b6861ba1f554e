"""inplace_extension.metrics: real calls through a Starlette app, then /metrics scraped and parsed."""

from __future__ import annotations

import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from inplace_extension.metrics import HOOK_BUCKETS, RUN_OUTCOMES, HookStatus, Metrics

pytestmark = pytest.mark.anyio


def _hook_app(metrics: Metrics) -> Starlette:
    """A stand-in for the real app: one hook route timed the way app.py wires observe_hook."""

    async def can_update_machine(request: Request) -> JSONResponse:
        started = time.perf_counter()
        body = await request.json()
        status: HookStatus = "Success" if body.get("ok") else "Failure"
        response = JSONResponse({"status": status})
        metrics.observe_hook("CanUpdateMachine", status, time.perf_counter() - started)
        return response

    return Starlette(
        routes=[
            Route(
                "/hooks.runtime.cluster.x-k8s.io/v1alpha1/canupdatemachine/cum",
                can_update_machine,
                methods=["POST"],
            ),
            Route("/metrics", metrics.endpoint, methods=["GET"]),
        ]
    )


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


async def _scrape(client: httpx.AsyncClient) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    response = await client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    return _samples(response.text)


async def test_hook_calls_are_counted_by_hook_and_status_and_timed() -> None:
    metrics = Metrics()
    transport = httpx.ASGITransport(app=_hook_app(metrics))
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        path = "/hooks.runtime.cluster.x-k8s.io/v1alpha1/canupdatemachine/cum"
        for ok in (True, True, False):
            assert (await client.post(path, json={"ok": ok})).status_code == 200
        samples = await _scrape(client)

    calls = "inplace_extension_hook_calls_total"
    assert samples[(calls, (("hook", "CanUpdateMachine"), ("status", "Success")))] == 2
    assert samples[(calls, (("hook", "CanUpdateMachine"), ("status", "Failure")))] == 1
    hist = "inplace_extension_hook_duration_seconds"
    assert samples[(hist + "_count", (("hook", "CanUpdateMachine"),))] == 3
    assert samples[(hist + "_sum", (("hook", "CanUpdateMachine"),))] > 0
    # every configured bucket is exposed, and the +Inf bucket holds all three observations
    buckets = {k[1] for k in samples if k[0] == hist + "_bucket"}
    assert len(buckets) == len(HOOK_BUCKETS) + 1
    assert samples[(hist + "_bucket", (("hook", "CanUpdateMachine"), ("le", "+Inf")))] == 3


async def test_runs_outcomes_durations_and_gauges() -> None:
    metrics = Metrics()
    metrics.run_finished("successful", 42.0)
    metrics.run_finished("successful", 3.0)
    metrics.run_finished("unreachable", 0.5)
    metrics.set_runs_in_flight(2)
    metrics.set_queue_length(5)
    transport = httpx.ASGITransport(app=_hook_app(metrics))
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        samples = await _scrape(client)

    runs = "inplace_extension_runs_total"
    assert samples[(runs, (("outcome", "successful"),))] == 2
    assert samples[(runs, (("outcome", "unreachable"),))] == 1
    # outcomes that never happened are exposed as 0, not missing
    for outcome in RUN_OUTCOMES - {"successful", "unreachable"}:
        assert samples[(runs, (("outcome", outcome),))] == 0
    hist = "inplace_extension_run_duration_seconds"
    assert samples[(hist + "_count", ())] == 3
    assert samples[(hist + "_sum", ())] == pytest.approx(45.5)
    assert samples[(hist + "_bucket", (("le", "1.0"),))] == 1
    assert samples[(hist + "_bucket", (("le", "5.0"),))] == 2
    assert samples[(hist + "_bucket", (("le", "60.0"),))] == 3
    assert samples[("inplace_extension_runs_in_flight", ())] == 2
    assert samples[("inplace_extension_run_queue_length", ())] == 5


async def test_bound_gauges_are_read_at_scrape_time() -> None:
    metrics = Metrics()
    state = {"running": 1, "queued": 0}
    metrics.bind_run_gauges(lambda: state["running"], lambda: state["queued"])
    transport = httpx.ASGITransport(app=_hook_app(metrics))
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        first = await _scrape(client)
        state.update(running=3, queued=7)
        second = await _scrape(client)
    assert first[("inplace_extension_runs_in_flight", ())] == 1
    assert first[("inplace_extension_run_queue_length", ())] == 0
    assert second[("inplace_extension_runs_in_flight", ())] == 3
    assert second[("inplace_extension_run_queue_length", ())] == 7


async def test_openmetrics_is_served_when_asked_for() -> None:
    metrics = Metrics()
    metrics.observe_hook("Discovery", "Success", 0.01)
    transport = httpx.ASGITransport(app=_hook_app(metrics))
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        response = await client.get(
            "/metrics", headers={"accept": "application/openmetrics-text; version=1.0.0"}
        )
    assert response.headers["content-type"].startswith("application/openmetrics-text")
    assert response.text.rstrip().endswith("# EOF")


def test_registries_are_per_app() -> None:
    first, second = Metrics(), Metrics()
    first.observe_hook("Discovery", "Success", 0.001)
    first_text = first.render()[0].decode()
    second_text = second.render()[0].decode()
    assert 'inplace_extension_hook_calls_total{hook="Discovery",status="Success"} 1.0' in first_text
    assert "hook_calls_total{" not in second_text


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda m: m.observe_hook("Discovery", "Maybe", 0.1), "hook status must be one of"),
        (lambda m: m.observe_hook("../etc", "Success", 0.1), "hook label must be a hook name"),
        (lambda m: m.observe_hook("Discovery", "Success", -1.0), "finite number of seconds >= 0"),
        (lambda m: m.observe_hook("Discovery", "Success", float("nan")), "finite number of seconds >= 0"),
        (lambda m: m.run_finished("exploded", 1.0), "run outcome must be one of"),
        (lambda m: m.set_runs_in_flight(-1), "runs in flight must be an integer >= 0"),
        (lambda m: m.set_queue_length(True), "queue length must be an integer >= 0"),
    ],
)
def test_bad_values_are_refused_precisely(call: object, message: str) -> None:
    metrics = Metrics()
    with pytest.raises(ValueError, match=message):
        call(metrics)  # type: ignore[operator]
    # nothing was recorded by the refused call
    assert "hook_calls_total{" not in metrics.render()[0].decode()


def test_run_outcomes_are_the_run_engine_outcome_kinds() -> None:
    # run_finished(outcome.kind.value, ...) must be accepted for every outcome the run engine records
    from inplace_extension.runs.attempts import OutcomeKind

    assert {kind.value for kind in OutcomeKind} == RUN_OUTCOMES
    metrics = Metrics()
    for kind in OutcomeKind:
        metrics.run_finished(kind.value, 1.0)
    assert (
        f'inplace_extension_runs_total{{outcome="{OutcomeKind.HOST_BUSY.value}"}} 1.0'
        in metrics.render()[0].decode()
    )
