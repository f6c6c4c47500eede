"""A recording is bounded (issue 31): at its cap it stops with a last line saying so, which a
replay reads (and shows on its time axis); credentials in URLs are never recorded."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import metrics_event

from quantdeck.core.errors import ConfigError
from quantdeck.core.events import MarkerEvent, StateEvent
from quantdeck.core.monitor import Recorder, RecordingCapped, read_recording
from quantdeck.core.monitor import recording as recording_mod


def test_a_recording_stops_at_its_cap_with_a_last_line_saying_so(tmp_path: Path) -> None:
    cap = 64 * 1024
    rec = Recorder(tmp_path / "r.jsonl", {"source": "test"}, max_bytes=cap)
    raised = []
    for i in range(2000):
        try:
            rec.write(metrics_event(float(i)))
        except RecordingCapped as e:
            raised.append(str(e))
    assert len(raised) == 1  # said once; later events are dropped quietly
    assert "\n" not in raised[0] and "recording capped at 0.0625 MiB" in raised[0]
    assert rec.capped == raised[0]
    rec.close()
    path = tmp_path / "r.jsonl"
    assert path.stat().st_size <= cap
    read = read_recording(path)
    last = read.events[-1]
    assert isinstance(last, MarkerEvent) and last.what == "recording"
    assert last.label.startswith("recording capped at 0.0625 MiB: nothing after ")
    assert 0 < len(read.events) - 1 < 2000


def test_the_cap_counts_lines_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A replay reads at most MAX_LINES lines: a recording of many small events stops there."""
    monkeypatch.setattr(recording_mod, "MAX_LINES", 50)
    rec = Recorder(tmp_path / "r.jsonl")
    with pytest.raises(RecordingCapped, match="capped at 50 lines"):
        for _ in range(100):
            rec.write(StateEvent("ready"))
    rec.close()
    assert len((tmp_path / "r.jsonl").read_text().splitlines()) == 50


@pytest.mark.parametrize("cap", [0, 100, 2**40])
def test_a_cap_a_replay_could_not_read_is_refused(tmp_path: Path, cap: int) -> None:
    with pytest.raises(ConfigError, match="a recording's cap must be between"):
        Recorder(tmp_path / "r.jsonl", max_bytes=cap)
    assert list(tmp_path.iterdir()) == []


def test_credentials_in_urls_are_not_recorded(tmp_path: Path) -> None:
    rec = Recorder(tmp_path / "r.jsonl", {"url": "http://alice:s3cret@gpu-box:8000"})
    rec.write(StateEvent("attached", url="https://tok3n@gpu-box:8000/v1"))
    rec.close()
    text = (tmp_path / "r.jsonl").read_text()
    assert "s3cret" not in text and "tok3n" not in text
    assert "http://***@gpu-box:8000" in text and "https://***@gpu-box:8000/v1" in text
