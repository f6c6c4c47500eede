"""Typed events: the JSON lines they write are the ones Quantdeck always wrote, and the
publish/subscribe helper never swallows an observer's error."""

from __future__ import annotations

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
    MetricsEvent,
    ProgressEvent,
    Publisher,
    RecordingHeader,
    StateEvent,
    from_json,
)

ROOT = Path(__file__).resolve().parents[2]
# Recordings made on the H200 by `quantdeck serve --record`, and conversion jobs' --json-events.
RECORDED = sorted((ROOT / "docs" / "gpu-validation").glob("*.jsonl*"))


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
    assert stopped.exit_code is ABSENT and stopped.get("exit_code", "none") == "none"
    assert from_json(crashed.to_json()) == crashed


def test_flattened_fields_and_get() -> None:
    ev = from_json({"event": "progress", "stage": "quantize", "pct": 40.0, "layer": 3, "t": 5.0})
    assert isinstance(ev, ProgressEvent) and ev.extra == {"layer": 3}
    assert ev.get("layer") == 3 and ev.get("stage") == "quantize" and ev.get("nope") is None
    m = MetricsEvent(t=1.0, values={"kv_usage_pct": 12.5, "gpus": []})
    assert list(m.to_json()) == ["event", "t", "kv_usage_pct", "gpus"]
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
    assert h.get("model") == "/m"


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
