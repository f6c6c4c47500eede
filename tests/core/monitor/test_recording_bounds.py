"""The recording reader (``timeline``, ``replay``, ``fleet replay``, the GUI's replay window
and Fleet tab) within its caps: a gzip bomb is refused before any event is built, in bounded
time and memory; crafted recordings are one ConfigError line naming the line and the field;
every field of a recorded event is held to its class's declared type (the check of
quantdeck.core.schema)."""

from __future__ import annotations

import gzip
import json
import os
import time
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
from bombs import LONG_LINE, SHORT_LINE, gzip_bomb
from fuzz import one_line_error

from quantdeck.core.errors import ConfigError
from quantdeck.core.events import MetricsEvent
from quantdeck.core.monitor import read_recording
from quantdeck.core.monitor.recording import MAX_BYTES, MAX_LINES, iter_recording

HEADER = {"event": "recording", "version": 1, "t": 1.0, "source": "serve"}
METRICS = {"event": "metrics", "t": 2.0, "kv_usage_pct": 5.0, "running": 1, "gpus": []}


def _write(path: Path, *lines: Any) -> Path:
    path.write_text("".join(json.dumps(x, allow_nan=True) + "\n" for x in lines))
    return path


def _bounded_read(path: Path) -> tuple[ConfigError, float, int]:
    """The ConfigError reading ``path`` gives, the seconds it took and the peak of Python's
    allocations meanwhile (bytes)."""
    tracemalloc.start()
    t0 = time.monotonic()
    try:
        with pytest.raises(ConfigError) as e:
            read_recording(path)
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return e.value, time.monotonic() - t0, peak


@pytest.mark.parametrize(
    "line, cap",
    [(LONG_LINE, f"over {MAX_BYTES // 2**20} MiB unpacked"), (SHORT_LINE, f"over {MAX_LINES:,}")],
    ids=["1 KB lines: the byte cap", "100-byte lines: the line cap"],
)
def test_a_gzip_bomb_is_refused_before_any_event_is_built(
    tmp_path: Path, line: bytes, cap: str
) -> None:
    """Before: a 7.8 MB .gz (1.46 GB inside) drove `timeline` to 5.8 GB and a MemoryError.
    Now the file is measured unpacked, a chunk at a time, before a line is parsed."""
    bomb = gzip_bomb(tmp_path / "bomb.jsonl.gz", line, 200 * 10**6)
    assert bomb.stat().st_size < 5 * 2**20
    error, seconds, peak = _bounded_read(bomb)
    assert cap in str(error) and "the cap of a recording" in str(error), error
    one_line_error(error)
    assert seconds < 5 and peak < 16 * 2**20, (seconds, peak)


def test_a_plain_recording_over_the_cap_is_refused_unread(tmp_path: Path) -> None:
    """A plain file is refused by its size: nothing of it is read (a sparse 8 GB file)."""
    p = _write(tmp_path / "big.jsonl", HEADER, METRICS)
    os.truncate(p, 8 * 2**30)
    error, seconds, peak = _bounded_read(p)
    assert f"over {MAX_BYTES // 2**20} MiB" in str(error)
    assert seconds < 1 and peak < 2**20


def test_a_recording_within_the_caps_streams_one_event_at_a_time(tmp_path: Path) -> None:
    p = _write(tmp_path / "r.jsonl", HEADER, *([METRICS] * 5))
    events = iter_recording(p)
    header = next(events)
    assert header.kind == "recording"
    first = next(events)
    assert isinstance(first, MetricsEvent) and first.metrics is not None
    assert first.metrics.running == 1
    assert len(list(events)) == 4


def _gzip_truncated(tmp_path: Path) -> Path:
    whole = gzip.compress(
        "".join(json.dumps(x) + "\n" for x in (HEADER, *([METRICS] * 200))).encode()
    )
    p = tmp_path / "cut.jsonl.gz"
    p.write_bytes(whole[: len(whole) // 2])
    return p


def _lines(tmp_path: Path, *lines: Any) -> Path:
    return _write(tmp_path / "r.jsonl", HEADER, *lines)


def _raw(tmp_path: Path, raw: bytes) -> Path:
    p = tmp_path / "r.jsonl"
    p.write_bytes(json.dumps(HEADER).encode() + b"\n" + raw + b"\n" + json.dumps(METRICS).encode())
    return p


# crafted recordings: (what to write, the words its one error line must hold)
CRAFTED: dict[str, tuple[Any, str]] = {
    "truncated gzip": (_gzip_truncated, "cannot read"),
    "not UTF-8": (
        lambda d: _raw(d, b'{"event": "log", "line": "\xff\xfe"}'),
        "line 2 is not UTF-8",
    ),
    "nested 100 000 deep": (
        lambda d: _raw(d, b"[" * 100_000 + b"]" * 100_000),
        "line 2 is not JSON: corrupt JSON (nested too deeply: over 64 levels)",
    ),
    "nested 65 deep in a fact": (
        lambda d: _lines(
            d, {"event": "fact", "name": "x", "value": json.loads("[" * 65 + "]" * 65), "t": 2.0}
        ),
        "nested more than 64 levels deep",
    ),
    "unknown event": (
        lambda d: _lines(d, {"event": "surprise", "t": 2.0}),
        "line 2: unknown event 'surprise'",
    ),
    "unknown event of an instance": (
        lambda d: _lines(d, {"event": "surprise", "t": 2.0, "instance": "a"}),
        "line 2: unknown event 'surprise'",
    ),
    "text for a number": (
        lambda d: _lines(d, {"event": "restart", "attempt": 1, "delay_s": "soon", "t": 2.0}),
        "line 2: 'delay_s' must be a finite number, got 'soon'",
    ),
    "NaN where a number is needed": (
        lambda d: _lines(d, {"event": "restart", "attempt": 1, "delay_s": float("nan"), "t": 2.0}),
        "line 2: 'delay_s' must be a finite number, got None",
    ),
    "a number for text": (
        lambda d: _lines(
            d, {"event": "route", "action": "add", "worker": 5, "reason": "x", "t": 2.0}
        ),
        "line 2: 'worker' must be a string, got 5",
    ),
    "text for a flag": (
        lambda d: _lines(
            d,
            {
                "event": "route",
                "action": "add",
                "worker": "w",
                "reason": "x",
                "ok": "yes",
                "t": 2.0,
            },
        ),
        "line 2: 'ok' must be true or false, got 'yes'",
    ),
    "a metrics figure as text": (
        lambda d: _lines(d, {**METRICS, "running": "many"}),
        "line 2: 'running' must be an integer or null, got 'many'",
    ),
    "a GPU reading as text": (
        lambda d: _lines(
            d, {**METRICS, "host_cpu_pct": 1.0, "gpus": [{"index": 0, "power_w": "hot"}]}
        ),
        "line 2: 'gpus[0].power_w' must be a finite number or null, got 'hot'",
    ),
    "a list item of the wrong type": (
        lambda d: _lines(d, {**METRICS, "lora_adapters": ["a", 7]}),
        "line 2: 'lora_adapters[1]' must be a string, got 7",
    ),
    "a nested event's field": (
        lambda d: _lines(
            d,
            {"event": "arm_server", "index": 0, "server": {"event": "state", "state": 1}, "t": 2.0},
        ),
        "line 2: 'server.state' must be a string, got 1",
    ),
    "a nested event missing": (
        lambda d: _lines(d, {"event": "arm_server", "index": 0, "t": 2.0}),
        "line 2 is not an event ('arm_server' event: no 'server')",
    ),
    "a metrics time missing": (
        lambda d: _lines(d, {"event": "metrics", "running": 1}),
        "line 2: 't' missing (expected a finite number)",
    ),
    "a FIFO": (lambda d: (os.mkfifo(d / "fifo.jsonl"), d / "fifo.jsonl")[1], "not a regular file"),
    "a folder": (lambda d: (d / "dir.jsonl").mkdir() or d / "dir.jsonl", "not a regular file"),
}


@pytest.mark.timeout(30)  # a FIFO read would block: it must be refused unopened
@pytest.mark.parametrize("case", sorted(CRAFTED))
def test_crafted_recordings_are_one_line(tmp_path: Path, case: str) -> None:
    make, words = CRAFTED[case]
    path = make(tmp_path)
    with pytest.raises(ConfigError) as e:
        read_recording(path)
    assert words in str(e.value), (case, str(e.value))
    one_line_error(e.value)


def test_a_last_line_cut_by_a_crash_is_skipped(tmp_path: Path) -> None:
    """A crash mid-write leaves half a line (even half a UTF-8 character): the rest replays,
    as the `.partial` file of a recording cut short always has."""
    p = _write(tmp_path / "r.jsonl", HEADER, METRICS)
    p.write_bytes(p.read_bytes() + b'{"event": "log", "line": "caf\xc3')
    assert len(read_recording(p).events) == 1
