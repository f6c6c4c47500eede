"""The tuning timeline on real recordings: two H200 launches of one model recorded by
``quantdeck serve --record`` (bf16 with CUDA graphs, then bitsandbytes eager), a fleet
recording's fallback switch, markers written into a recording and read back."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from conftest import ROOT
from fleet_recording import T0, write_fleet_recording

from quantdeck.core.bench.results import BenchResult, bench_marker
from quantdeck.core.errors import ConfigError
from quantdeck.core.events import MarkerEvent, MetricsEvent, from_json
from quantdeck.core.fleet import load_fleet
from quantdeck.core.monitor import Recorder, TimeSeriesStore, read_recording
from quantdeck.core.monitor.timeline import (
    MetricRow,
    Span,
    Timeline,
    compare_spans,
    config_diff,
    default_spans,
    describe,
    parse_span,
    store_of,
    timeline_of,
)

GPU = ROOT / "docs" / "gpu-validation"
BF16, BNB4 = GPU / "record-bf16-graphs.jsonl.gz", GPU / "record-bnb4-eager.jsonl.gz"


def _series(rec_path: Path, key: str) -> list[float]:
    found = (
        getattr(e.metrics, key) for e in read_recording(rec_path).of(MetricsEvent) if e.metrics
    )
    return [v for v in found if v is not None]


def test_launches_become_launch_restart_and_knob_markers() -> None:
    tl = Timeline()
    first = tl.launch({"model": "/m", "max-num-seqs": 64}, t=10.0)
    same = tl.launch({"model": "/m", "max-num-seqs": 64}, t=20.0)
    other = tl.launch({"model": "/m", "max-num-seqs": 128, "enforce-eager": True}, t=30.0)
    assert [m.what for m in tl.markers] == ["launch", "restart", "knobs"]
    assert first.diff == {} and same.diff == {}
    assert other.diff == {"enforce-eager": [None, True], "max-num-seqs": [64, 128]}
    assert other.label == "knobs: enforce-eager default → on, +1 more"
    assert "max-num-seqs: 64 → 128" in describe(other)
    nested = config_diff({"compilation-config": {"mode": 3}}, {"compilation-config": {"mode": 0}})
    assert nested == {"compilation-config.mode": [3, 0]}
    assert tl.between(15, 30) == [same, other]


def test_two_recorded_launches_compare_with_their_knob_change() -> None:
    recs = [read_recording(BF16), read_recording(BNB4)]
    tl = timeline_of(recs)
    assert [m.what for m in tl.markers] == ["launch", "knobs"]
    change = tl.markers[1]
    assert change.diff == {"enforce-eager": [None, True], "quantization": [None, "bitsandbytes"]}
    # at the second server's start, after the first one's samples
    assert max(e.t for e in recs[0].of(MetricsEvent)) < change.t < (recs[1].events[-1].when or 0.0)
    store = store_of(recs)
    assert len(store) == len(recs[0].of(MetricsEvent)) + len(recs[1].of(MetricsEvent))
    before, after = default_spans(store, tl)
    ts = [e.t for r in recs for e in r.of(MetricsEvent)]  # the samples either side
    last_before = max(t for t in ts if t < change.t)
    first_after = min(t for t in ts if t > change.t)
    # equal spans, as long as the shorter side: the one before ends at the change, the one
    # after is where bnb4 serves the same load (12 running), not its ramp-up after the start
    width = min(last_before - min(ts), max(ts) - first_after)
    assert before.t1 == last_before and first_after <= after.t0 <= max(ts) - width
    assert before.seconds == pytest.approx(width) == pytest.approx(after.seconds)
    alike = compare_spans(store, before, after, tl)
    running = next(r for r in alike.rows if r.series == "running")
    assert running.before == pytest.approx(running.after, rel=0.1) and alike.load_note() == ""
    ramp = compare_spans(store, before, Span(first_after, first_after + width), tl)
    assert ramp.load_note().startswith("the spans differ in load")  # what it avoided
    # the whole runs compared (as the CLI's --before/--after take them)
    before = Span(min(ts), last_before)
    after = Span(first_after, max(ts))
    cmp = compare_spans(store, before, after, tl)
    assert cmp.samples == (len(recs[0].of(MetricsEvent)), len(recs[1].of(MetricsEvent)))
    rows = {r.name: r for r in cmp.rows}
    gen_bf16 = [v for v in _series(BF16, "generation_tokens_per_s")]
    assert rows["generated tok/s"].before == pytest.approx(sum(gen_bf16) / len(gen_bf16))
    ttft = sorted(_series(BNB4, "ttft_p99_ms"))
    mid = len(ttft) // 2
    median = ttft[mid] if len(ttft) % 2 else (ttft[mid - 1] + ttft[mid]) / 2
    assert rows["TTFT p99 (ms)"].after == pytest.approx(median)
    # bitsandbytes in eager mode serves this load slower: the table says so
    assert rows["generated tok/s"].verdict == "worse" and rows["ITL p50 (ms)"].verdict == "worse"
    assert rows["KV use % (peak)"].verdict == ""  # no direction: the load's shape
    assert cmp.markers == [change]
    assert cmp.separated_by() == (
        "knobs: enforce-eager default → on, quantization default → bitsandbytes"
    )
    text = cmp.format()
    assert "generated tok/s" in text and "separated by: knobs: enforce-eager" in text
    assert json.loads(json.dumps(cmp.to_json()))["diff"]["quantization"] == [None, "bitsandbytes"]


def test_spans_without_markers_are_halves_and_spans_parse() -> None:
    store = store_of([read_recording(BF16)])
    first, last = store.first_t, store.last_t
    assert first is not None and last is not None
    before, after = default_spans(store)
    assert before == Span(first, (first + last) / 2) and after.t1 == last
    cmp = compare_spans(store, before, after)
    assert cmp.markers == [] and cmp.separated_by() == "no marker between the spans"
    assert sum(cmp.samples) == len(store)
    assert parse_span("10..20", first, last) == Span(first + 10, first + 20)
    assert parse_span("..5", first, last) == Span(first, first + 5)
    assert parse_span("5..", first, last) == Span(first + 5, last)
    for bad, why in (("10", "START..END"), ("a..b", "numbers"), ("20..10", "ends before")):
        with pytest.raises(ConfigError, match=why):
            parse_span(bad, first, last)
    with pytest.raises(ConfigError, match="no samples"):
        default_spans(TimeSeriesStore(capacity=8))
    empty = compare_spans(store, Span(0, 1), after)  # no samples there: no figures
    assert empty.samples[0] == 0 and all(r.before is None for r in empty.rows)


def test_store_span_is_inclusive_and_copies() -> None:
    store = store_of([read_recording(BF16)])
    t, cols = store.span(0, float("inf"), ["running"])
    assert len(t) == len(store) and list(cols) == ["running"]
    t2, _ = store.span(t[3], t[6])
    assert list(t2) == list(t[3:7])
    cols["running"][:] = -1  # a copy: the store keeps its data
    assert store.span(t[0], t[0], ["running"])[1]["running"][0] != -1


def test_fleet_switch_is_one_marker_from_the_fallback_and_its_router_change(
    tmp_path: Path,
) -> None:
    doc = {
        "router": {"port": 18080},
        "instances": [
            {"name": "a", "port": 18001, "profile": {"model": str(tmp_path)}},
            {"name": "b", "port": 18002, "role": "backup", "profile": {"model": str(tmp_path)}},
        ],
        "fallback": {"above_ms": 500, "for_s": 2},
    }
    (tmp_path / "fleet.yaml").write_text(json.dumps(doc))
    spec = load_fleet(tmp_path / "fleet.yaml")
    rec = read_recording(write_fleet_recording(tmp_path / "fleet.jsonl", spec))
    tl = timeline_of([rec])
    assert [m.what for m in tl.markers] == ["fleet"]  # crashes and restarts are no switch
    m = tl.markers[0]
    assert m.t == T0 + 34 and m.label == "fallback on: b take traffic"
    assert m.diff["fallback"] == [False, True]
    assert m.diff[f"worker {spec.instances[1].url}"] == ["out", "in"]
    assert m.diff["ttft_p99_ms"] == ["limit 500", "812 for 2 s"]


def test_markers_are_recorded_and_read_back(tmp_path: Path) -> None:
    tl = Timeline()
    path = tmp_path / "r.jsonl"
    rec = Recorder(path, {"source": "serve", "config": {"model": "/m"}})
    rec.write(tl.launch({"model": "/m"}, t=100.0))
    rec.write(MetricsEvent.from_values(101.0, {"generation_tokens_per_s": 10.0}))
    run = BenchResult(label="chat", output_throughput=42.5, duration=3.0)
    rec.write(tl.add(bench_marker(run, t=102.0)))
    rec.write(tl.launch({"model": "/m", "max-num-seqs": 8}, t=110.0))
    rec.close()
    lines = [json.loads(ln) for ln in path.read_text().splitlines()]
    assert [ln["event"] for ln in lines].count("marker") == 3
    assert lines[1] == {
        "event": "marker",
        "what": "launch",
        "label": "launch",
        "diff": {},
        "config": {"model": "/m"},
        "t": 100.0,
    }
    assert from_json(lines[3]) == tl.markers[1]
    back = timeline_of([read_recording(path)])  # the header's config is not launched again
    assert [(m.what, m.label, m.diff) for m in back.markers] == [
        (m.what, m.label, m.diff) for m in tl.markers
    ]
    assert back.markers[1].label == "bench chat: 42.5 tok/s"
    assert back.markers[2].diff == {"max-num-seqs": [None, 8]}
    assert isinstance(back.markers[0], MarkerEvent)


def test_a_launch_that_crashes_before_ready_is_a_failed_start() -> None:
    """Before: a failed start was marked as a launch, and the next start as a restart."""
    from quantdeck.core.events import StateEvent

    tl = Timeline()
    tl.observe(MarkerEvent("launch", "launch", config={"model": "/m"}, t=10.0))
    tl.observe(StateEvent("starting", t=10.1))
    failed = tl.observe(StateEvent("crashed", reason="engine process 7 exited", t=20.0))
    assert failed is not None and failed.what == "failed"
    assert [m.label for m in tl.markers] == ["failed start: engine process 7 exited"]
    tl.observe(MarkerEvent("launch", "launch", config={"model": "/m", "dtype": "half"}, t=30.0))
    tl.observe(StateEvent("ready", t=40.0))
    assert tl.observe(StateEvent("crashed", reason="later", t=50.0)) is None  # it served
    assert [(m.what, m.diff) for m in tl.markers] == [
        ("failed", {}),
        ("knobs", {"dtype": [None, "half"]}),
    ]
    # a recording keeps it: replayed, the failed start is one again
    again = Timeline()
    for m in tl.markers:
        again.observe(m)
    assert [m.what for m in again.markers] == ["failed", "knobs"]


def test_default_spans_are_equal_either_side_of_the_change_not_a_bench_run() -> None:
    """Before: Compare spans split at the latest marker (a bench run) and compared 15 s idle
    with 3 s of load, "+38212 % better"."""
    from conftest import metrics_event

    store = TimeSeriesStore(capacity=256)
    tl = Timeline()
    t0 = 1_800_000_000.0
    for i in range(40):  # 20 s before the knob change, idle then loaded
        store.append(metrics_event(t0 + i / 2, running=0 if i < 20 else 4))
    tl.observe(MarkerEvent("launch", "launch", config={"model": "/m"}, t=t0 - 1))
    tl.observe(MarkerEvent("launch", "launch", config={"model": "/m", "dtype": "half"}, t=t0 + 25))
    for i in range(10):  # 5 s after it, loaded; then a bench run starts
        store.append(metrics_event(t0 + 30 + i / 2, running=4, generation_tokens_per_s=61234.5))
    tl.add(bench_marker(BenchResult(label="chat", output_throughput=1.0, duration=1.0), t=t0 + 33))
    before, after = default_spans(store, tl)
    assert after.t0 == t0 + 30 and before.t1 == t0 + 19.5  # the samples next to the change
    assert before.seconds == after.seconds == 4.5  # as long as the shorter side
    cmp = compare_spans(store, before, after, tl)
    assert cmp.separated_by() == "knobs: dtype default → half"
    assert cmp.load_note() == ""  # both loaded alike
    assert "61,234" in cmp.format() and "e+" not in cmp.format()
    assert time.strftime("%H:%M:%S", time.localtime(after.t0)) in after.text()
    # spans over idle and load say so, and a huge relative change reads as a ratio
    idle = compare_spans(store, Span(t0, t0 + 9.5), after, tl)
    assert "idle" in idle.load_note() and "note: the before span is idle" in idle.format()
    row = MetricRow("x", "x", "higher", 0.5, 191.0)
    assert row.change_text() == "+190 (×382)"
    assert MetricRow("x", "x", "higher", 100.0, 104.0).change_text() == "+4.00 (+4%)"


def test_a_runs_marker_says_its_kind_and_starts_where_the_run_did() -> None:
    """A run of the load: its figures as the diff; an A/B or a tuning: named so (not "bench
    bench"), a tuning placed at its start by its seconds, an A/B (no duration) at its end."""
    from quantdeck.core.bench.results import ABResult, TuneResult

    m = bench_marker(BenchResult(duration=4.0, completed=6, p99_ttft_ms=float("nan")))
    assert m.what == "bench" and m.label == "bench" and m.diff == {"completed": [None, 6]}
    assert abs(m.t - (time.time() - 4.0)) < 2
    tuned = bench_marker(TuneResult(seconds=30.0, label="seats"))
    assert tuned.label == "tune seats" and abs(tuned.t - (time.time() - 30.0)) < 2
    ab = bench_marker(ABResult())
    assert ab.label == "A/B" and ab.diff == {} and abs(ab.t - time.time()) < 2
