"""The fallback rule over time (when it switches, with which figures) and the reading of the
router's Prometheus exposition; the real router and real latency are in
tests/cli/test_fleet_server.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from quantdeck.core.events import MetricsEvent
from quantdeck.core.fleet import FallbackJudge, FallbackRule, FleetSpec, InstanceSpec, RouterSpec
from quantdeck.core.fleet.router import RULE_METRICS, router_facts
from quantdeck.core.fleet.spec import FALLBACK_METRICS
from quantdeck.core.snapshots import MetricsSnapshot


def judge_of(rule: FallbackRule) -> FallbackJudge:
    """A judge for one primary p and one backup b."""
    spec = FleetSpec(
        Path("f.yaml"),
        RouterSpec(),
        [InstanceSpec("p", url_="http://p"), InstanceSpec("b", url_="http://b", role="backup")],
        rule,
    )
    return FallbackJudge(spec)


def run(judge: FallbackJudge, values: list[float | None]) -> list[tuple[int, bool, float]]:
    """One look a second with the worst primary's value; (second, active, held_s) for each
    switch."""
    out = []
    for second, v in enumerate(values):
        ev = judge.judge(v, float(second))
        if ev is not None:
            out.append((second, ev.active, ev.held_s))
    return out


def test_the_worst_primary_is_read_from_the_samples() -> None:
    judge = judge_of(FallbackRule(metric="ttft_p99_ms", above_ms=500))
    spec = FleetSpec(
        Path("f.yaml"),
        RouterSpec(),
        [InstanceSpec("p", url_="http://p"), InstanceSpec("q", url_="http://q")],
    )
    p, q = spec.instances
    samples = {
        "p": MetricsEvent.from_values(1.0, {"ttft_p99_ms": 120.0}),
        "q": MetricsEvent.from_values(1.0, {"ttft_p99_ms": 640.5}),
        "b": MetricsEvent.from_values(1.0, {"ttft_p99_ms": 9999.0}),  # a backup: not judged
    }
    assert judge.worst([p, q], samples) == 640.5
    assert judge.worst([p], samples) == 120.0
    # no request in the window (None), a bool, no answer: no figure
    samples = {
        "p": MetricsEvent.from_values(1.0, {"ttft_p99_ms": None}),
        "q": MetricsEvent.from_values(1.0, {"error": "refused"}),
    }
    assert judge.worst([p, q], samples) is None
    assert judge.worst([p, q], {"p": MetricsEvent.from_values(1.0, {"ttft_p99_ms": True})}) is None


@pytest.mark.parametrize("metric", FALLBACK_METRICS)
def test_each_rule_metric_reads_its_own_figure(metric: str) -> None:
    """Every metric a fleet file may name is read from the scrape's field of that name."""
    figures = {k: float(n) for n, k in enumerate(MetricsSnapshot.__dataclass_fields__)}
    snap = MetricsSnapshot.from_json(figures)
    assert set(RULE_METRICS) == set(FALLBACK_METRICS)
    assert RULE_METRICS[metric](snap) == figures[metric]


def test_the_backups_come_after_for_s_over_and_leave_after_recover_s_under() -> None:
    judge = judge_of(FallbackRule(above_ms=500, for_s=3, recover_s=5))
    values = [100, 600, 700, 800, 900, 450, None, 300, 200, 100, 100, 100]
    assert run(judge, values) == [(4, True, 3.0), (10, False, 5.0)]


def test_a_dip_restarts_the_count() -> None:
    judge = judge_of(FallbackRule(above_ms=500, for_s=2, recover_s=2))
    # over, over, under (the count starts again), over x3: on at the third of those
    assert run(judge, [600, 600, 400, 600, 600, 600]) == [(5, True, 2.0)]
    # back under briefly, then over again: still active, no switch
    assert run(judge, [400, 700, 700]) == []
    assert judge.active


def test_the_event_carries_the_figures() -> None:
    judge = judge_of(FallbackRule(metric="itl_p99_ms", above_ms=50, for_s=0, recover_s=0))
    ev = judge.judge(123.456, 0.0)
    assert ev is not None
    assert ev.to_json() | {"t": 0} == {
        "event": "fallback",
        "active": True,
        "metric": "itl_p99_ms",
        "value_ms": 123.5,
        "above_ms": 50,
        "held_s": 0.0,
        "backups": ["b"],
        "t": 0,
    }


EXPOSITION = """\
# TYPE vllm_router_requests_total counter
vllm_router_requests_total{route="/v1/completions"} 40
vllm_router_requests_total{route="/v1/models"} 2
# TYPE vllm_router_retries_total counter
vllm_router_retries_total{route="/v1/completions"} 3
# TYPE vllm_router_request_errors_total counter
vllm_router_request_errors_total{route="/v1/completions",error_type="backend"} 1
# TYPE vllm_router_worker_health gauge
vllm_router_worker_health{worker="http://127.0.0.1:8001"} 1
vllm_router_worker_health{worker="http://127.0.0.1:8002"} 0
vllm_router_worker_health{worker="http://127.0.0.1:9999"} 1
# TYPE vllm_router_cb_state gauge
vllm_router_cb_state{worker="http://127.0.0.1:8002"} 1
"""


def test_router_facts_per_worker_and_totals() -> None:
    workers = ["http://127.0.0.1:8001", "http://127.0.0.1:8002"]
    facts = router_facts(EXPOSITION, workers, {"http://127.0.0.1:8001": 2.0})
    assert facts == {
        "requests": 42,
        "retries": 3,
        "errors": 1,
        "workers": [
            {"url": workers[0], "healthy": True, "load": 2.0},
            {"url": workers[1], "healthy": False, "circuit": "open"},
        ],
    }


@pytest.mark.parametrize("text", ["not prometheus {{{", 'x{a="1"} notanumber'])
def test_an_exposition_that_is_not_one_gives_no_facts(text: str) -> None:
    assert router_facts(text, ["http://w"], {}) == {}


def test_a_circuit_state_the_router_did_not_have_is_unknown() -> None:
    facts = router_facts('vllm_router_cb_state{worker="http://w"} 7\n', ["http://w"], {})
    assert facts["workers"] == [{"url": "http://w", "circuit": "unknown"}]
