"""Writing recordings: never over an existing file unless told, private, and a write error (a
full disk) is one clear error that leaves the file recognisably incomplete."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from conftest import metrics_event
from small_disk import small_disk

from quantdeck.core.errors import ConfigError
from quantdeck.core.events import MetricsEvent
from quantdeck.core.monitor.recording import Recorder, RecordingError, read_recording


def test_recorder_refuses_an_existing_file(tmp_path: Path) -> None:
    p = tmp_path / "session.jsonl"
    p.write_text("an earlier session\n")
    with pytest.raises(ConfigError, match="exists"):
        Recorder(p)
    assert p.read_text() == "an earlier session\n"
    assert sorted(x.name for x in tmp_path.iterdir()) == ["session.jsonl"]
    rec = Recorder(p, {"source": "test"}, overwrite=True)
    assert p.read_text() == "an earlier session\n"  # replaced only when finished
    rec.write(metrics_event(1.0))
    rec.close()
    assert len(read_recording(p).of(MetricsEvent)) == 1


def test_recorder_refuses_folders_and_links(tmp_path: Path) -> None:
    (tmp_path / "dir.jsonl").mkdir()
    (tmp_path / "target").write_text("keep")
    (tmp_path / "link.jsonl").symlink_to(tmp_path / "target")
    for name in ("dir.jsonl", "link.jsonl"):
        with pytest.raises(ConfigError, match="folder or a symbolic link"):
            Recorder(tmp_path / name, overwrite=True)
    assert (tmp_path / "target").read_text() == "keep" and (tmp_path / "link.jsonl").is_symlink()


def test_recording_is_private_and_partial_until_closed(tmp_path: Path) -> None:
    p = tmp_path / "r.jsonl"
    rec = Recorder(p, {"source": "test"})
    rec.write(metrics_event(1.0))
    assert not p.exists() and rec.partial.is_file()  # a crash now leaves r.jsonl.partial
    assert len(read_recording(rec.partial).of(MetricsEvent)) == 1  # which replays
    assert stat.S_IMODE(rec.partial.stat().st_mode) == 0o600
    rec.close()
    assert not rec.partial.exists() and stat.S_IMODE(p.stat().st_mode) == 0o600
    with pytest.raises(ConfigError, match="exists"):
        Recorder(p)


def test_full_disk_stops_the_recording_with_one_error(tmp_path: Path) -> None:
    with small_disk(tmp_path / "disk", 256 * 1024) as disk:
        rec = Recorder(disk.path / "r.jsonl", {"source": "test"})
        for i in range(20):
            rec.write(metrics_event(float(i)))
        disk.fill()
        with pytest.raises(RecordingError) as e:
            for i in range(20, 20_000):
                rec.write(metrics_event(float(i)))
        disk.restore()
        msg = str(e.value)
        assert "\n" not in msg and str(rec.partial) in msg
        assert "No space left on device" in msg or "File too large" in msg
        assert rec.error == msg
        rec.write(metrics_event(99999.0))  # later events are dropped, not raised again
        rec.close()
        assert not (disk.path / "r.jsonl").exists()  # never given the finished name
        kept = read_recording(rec.partial).of(MetricsEvent)
        assert [ev.t for ev in kept[:20]] == [float(i) for i in range(20)]
