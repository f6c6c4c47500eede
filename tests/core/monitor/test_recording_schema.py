"""A recording from anywhere replays or is refused with one ConfigError line: its version,
times and GPU list are checked, lines and nesting are bounded, and whatever the reader
accepts goes into the Monitor's store and through replay without an exception."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest
from fuzz import HOSTILE_TEXT, JSON_VALUES, fuzz_settings, mutated, one_line_error
from hypothesis import given
from hypothesis import strategies as st

from quantdeck.core.errors import ConfigError
from quantdeck.core.events import MetricsEvent
from quantdeck.core.monitor import TimeSeriesStore, read_recording
from quantdeck.core.monitor.recording import MAX_GPUS, MAX_LINE, replay

HEADER = {"event": "recording", "version": 1, "t": 1.0, "title": "t"}
GPU = {"index": 0, "utilization_pct": 50.0, "memory_used_bytes": 2**30}
METRICS = {"event": "metrics", "t": 2.0, "kv_usage_pct": 5.0, "gpus": [GPU]}


def _write(path: Path, *lines: Any) -> Path:
    path.write_text("".join(json.dumps(x, allow_nan=True) + "\n" for x in lines))
    return path


@pytest.mark.parametrize(
    "header, message",
    [
        ({**HEADER, "version": "1"}, "'version' must be an integer >= 1, got '1'"),
        ({**HEADER, "version": None}, "'version' missing"),
        ({**HEADER, "version": 1.5}, "'version' must be an integer"),
        ({**HEADER, "version": 2}, "recording format 2 is newer"),
        ({**HEADER, "t": "now"}, "'t' must be a finite number"),
        ({**HEADER, "title": ["x"]}, "'title' must be a string"),
    ],
)
def test_bad_headers(tmp_path: Path, header: dict, message: str) -> None:
    p = _write(tmp_path / "r.jsonl", header, METRICS)
    with pytest.raises(ConfigError, match=message) as e:
        read_recording(p)
    one_line_error(e.value)


@pytest.mark.parametrize(
    "event, message",
    [
        ({**METRICS, "gpus": [GPU] * (MAX_GPUS + 1)}, "'gpus' must be a list of at most 64"),
        ({**METRICS, "gpus": "abc"}, "'gpus' must be a list"),
        ({**METRICS, "gpus": [1]}, "'gpus' must list objects"),
        ({**METRICS, "t": "x"}, "'t' must be a finite number"),
        ({"event": "metrics"}, "'t' missing"),
        ({"event": "state", "state": "ready", "t": [1]}, "'t' must be a finite number"),
    ],
)
def test_bad_events(tmp_path: Path, event: dict, message: str) -> None:
    p = _write(tmp_path / "r.jsonl", HEADER, METRICS, event, METRICS)
    with pytest.raises(ConfigError, match=f"line 3: {message}") as e:
        read_recording(p)
    one_line_error(e.value)


def test_a_gpu_list_at_the_bound_replays(tmp_path: Path) -> None:
    p = _write(tmp_path / "r.jsonl", HEADER, {**METRICS, "gpus": [GPU] * MAX_GPUS})
    ev = read_recording(p).events[0]
    assert isinstance(ev, MetricsEvent) and ev.telemetry is not None
    assert len(ev.telemetry.gpus) == MAX_GPUS


def test_lines_and_nesting_are_bounded(tmp_path: Path) -> None:
    p = tmp_path / "r.jsonl"
    p.write_text(json.dumps(HEADER) + "\n" + " " * (MAX_LINE + 10) + "\n")
    with pytest.raises(ConfigError, match="line 2 is over"):
        read_recording(p)
    p.write_text(json.dumps(HEADER) + "\n" + "[" * 100_000 + "]" * 100_000 + "\n")
    with pytest.raises(ConfigError, match="line 2 is not JSON: corrupt JSON \\(nested too"):
        read_recording(p)


def test_nan_the_writer_may_write_reads_as_no_value(tmp_path: Path) -> None:
    p = _write(tmp_path / "r.jsonl", HEADER, {**METRICS, "kv_usage_pct": float("nan")})
    ev = read_recording(p).events[0]
    assert isinstance(ev, MetricsEvent) and ev.metrics is not None
    assert ev.metrics.kv_usage_pct is None


def test_damaged_gzip_is_one_line(tmp_path: Path) -> None:
    p = tmp_path / "r.jsonl.gz"
    header = gzip.compress(b"")[:10]  # a gzip header, then no valid deflate block
    p.write_bytes(header + b"\xff" * 50)
    with pytest.raises(ConfigError, match="cannot read") as e:
        read_recording(p)
    one_line_error(e.value)


EVENT_KINDS = ["metrics", "state", "fact", "progress", "log", "plan", "advice", "recording", "x"]
EVENTS = st.one_of(
    mutated(METRICS, ["t", "gpus", "kv_usage_pct", "running", "event"]),
    mutated({"event": "state", "state": "ready", "t": 1.0}, ["state", "t", "reason", "event"]),
    st.builds(
        lambda kind, body: {**body, "event": kind},
        st.sampled_from(EVENT_KINDS),
        JSON_VALUES.filter(lambda v: isinstance(v, dict)),
    ),
    JSON_VALUES,
)
LINES = st.one_of(
    EVENTS.map(lambda e: json.dumps(e, allow_nan=True)), HOSTILE_TEXT, st.text(max_size=30)
)


@fuzz_settings(80)
@given(
    header=mutated(HEADER, ["version", "t", "title", "note", "model", "event"]),
    lines=st.lists(LINES, max_size=6),
    newline_at_end=st.booleans(),
)
def test_fuzz_recording(
    tmp_path: Path, header: dict, lines: list[str], newline_at_end: bool
) -> None:
    p = tmp_path / "fuzz.jsonl"
    text = "\n".join([json.dumps(header, allow_nan=True), *lines])
    p.write_text(text + ("\n" if newline_at_end else ""), encoding="utf-8")
    try:
        rec = read_recording(p)
    except ConfigError as e:
        one_line_error(e)
        return
    store = TimeSeriesStore(capacity=64)
    for _ in replay(rec, store.append):
        pass
    assert rec.duration_s >= 0 and store.num_gpus <= MAX_GPUS
