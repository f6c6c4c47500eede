"""Replay and the library with bad files: a recording's title is plain text, a bad recording
or model folder is one line in the window, and the other folders still show."""

from __future__ import annotations

import json
from pathlib import Path

from ckpt import LLAMA3_8B, write_checkpoint
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QLabel

from quantdeck.core.launch.device import H200
from quantdeck.core.monitor import read_recording
from quantdeck.gui.main_window import MainWindow
from quantdeck.gui.monitor import replay_view

HEADER = {"event": "recording", "version": 1, "t": 1.0}
METRICS = {"event": "metrics", "t": 2.0, "kv_usage_pct": 5.0, "gpus": []}


def _recording(path: Path, header: dict) -> Path:
    path.write_text(json.dumps(header) + "\n" + json.dumps(METRICS) + "\n")
    return path


def test_a_recordings_title_is_plain_text(qtbot, tmp_path: Path) -> None:
    title = '<img src="x" onerror="y"><b>big</b>'
    rec = read_recording(_recording(tmp_path / "r.jsonl", {**HEADER, "note": "<i>n</i>"}))
    box, _ = replay_view(rec, title)
    qtbot.addWidget(box)
    label = box.findChild(QLabel)
    assert label.textFormat() == Qt.TextFormat.PlainText
    assert label.text().startswith(title) and "<i>n</i>" in label.text()


def test_a_bad_recording_is_one_line_in_the_window(qtbot, tmp_path: Path) -> None:
    """Before: a string version raised TypeError out of the Open recording action."""
    win = MainWindow(device=H200, probe=False)
    qtbot.addWidget(win)
    path = _recording(tmp_path / "r.jsonl", {**HEADER, "version": "1"})
    assert win.open_recording(str(path)) == 0
    text = win.launch.message.text()
    assert "'version' must be an integer" in text and "\n" not in text
    path = _recording(tmp_path / "ok.jsonl", HEADER)
    assert win.open_recording(str(path)) == 1


def test_a_bad_folder_does_not_break_the_folder_scan(qtbot, tmp_path: Path) -> None:
    """Before: a folder with ``head_dim: "x"`` raised out of the scan and hid the others."""
    write_checkpoint(tmp_path / "lib" / "a-good", LLAMA3_8B)
    bad = write_checkpoint(tmp_path / "lib" / "b-bad", LLAMA3_8B)
    (bad / "config.json").write_text(json.dumps(dict(LLAMA3_8B, head_dim="x")))
    win = MainWindow(device=H200, probe=False)
    qtbot.addWidget(win)
    win.add_folder(str(tmp_path / "lib"))
    rows = {Path(m.path).name: m for m in win.library_model.rows}
    assert rows["a-good"].info is not None and rows["b-bad"].info is None
    assert "'head_dim' must be an integer" in win.library_info.text()


def test_a_recording_opens_apart_from_the_live_monitor(qtbot, tmp_path: Path) -> None:
    """Before: opening a recording wiped the live history, its days-old samples fell outside
    every window, the live view kept its GPU layout, and its samples raised alerts."""
    from conftest import metrics_event

    from quantdeck.core.launch import cpu_device
    from quantdeck.core.monitor import Recorder

    win = MainWindow(device=cpu_device(), probe=False)
    qtbot.addWidget(win)
    mon = win.monitor
    mon.kv_limit.setValue(50)
    alerts: list[str] = []
    mon.alert.connect(alerts.append)
    now = 1_800_000_000.0
    for i in range(5):  # the live server: a CPU host, KV well under the limit
        mon.add_event(metrics_event(now + i, kv_usage_pct=10.0, host_cpu_pct=30.0))
    mon.refresh(force=True)
    before = (len(mon.store), mon.store.last_t, mon.store.num_gpus, list(mon.timeline.markers))
    path = tmp_path / "h200.jsonl"
    rec = Recorder(path, {"source": "serve", "model": "/models/llama-8b"})
    gpu = {"index": 0, "name": "H200", "utilization_pct": 90.0, "memory_used_bytes": 2**37}
    for i in range(30):  # days old, on a GPU, KV over every limit
        rec.write(metrics_event(now - 3 * 86400 + i, kv_usage_pct=99.5, gpus=[gpu]))
    rec.close()
    assert win.open_recording(str(path)) == 30
    mon.refresh(force=True)
    assert (len(mon.store), mon.store.last_t, mon.store.num_gpus, list(mon.timeline.markers)) == (
        before
    )
    assert "GPU utilisation %" not in mon.plots and "Host CPU %" in mon.plots
    assert alerts == [] and not mon.banner.isVisibleTo(mon)
    # the replay: its own store, layout and clock, shown in its own window, no alerts
    replay = win.replays[-1]
    assert replay.isWindow() and replay.panel is not mon
    assert len(replay.panel.store) == 30 and "GPU utilisation %" in replay.panel.plots
    assert len(replay.panel.data_of("kv_usage_pct")) == 30
    assert not replay.panel.banner.isVisibleTo(replay) and not replay.panel.live
    assert "replay (read-only)" in replay.heading.text() and "llama-8b" in replay.heading.text()
    # live samples go on reaching the live Monitor only
    mon.add_event(metrics_event(now + 5, kv_usage_pct=60.0))
    assert len(mon.store) == before[0] + 1 and len(replay.panel.store) == 30
    mon.refresh(force=True)
    assert len(alerts) == 1 and "KV-cache usage 60.0%" in alerts[0]
    replay.close()
    qtbot.waitUntil(lambda: win.replays == [], timeout=2000)


def test_an_empty_folder_and_an_unreadable_model_say_why(qtbot, tmp_path: Path) -> None:
    """Before: an empty folder was added in silence, and choosing an unreadable model left
    only "choose a model in the library" on the Launch tab."""
    (tmp_path / "empty" / "sub").mkdir(parents=True)
    win = MainWindow(device=H200, probe=False)
    qtbot.addWidget(win)
    win.add_folder(str(tmp_path / "empty"))
    assert win.library_info.text().startswith(f"No model found in {tmp_path / 'empty'}")
    bad = write_checkpoint(tmp_path / "lib" / "bad", LLAMA3_8B)
    (bad / "config.json").write_text(json.dumps(dict(LLAMA3_8B, head_dim="x")))
    win.add_model(bad)
    win.library_info.clear()
    win.library.setCurrentIndex(
        win.library_model.index(win.library_model.find(lambda m: m.path == str(bad)), 0)
    )
    text = win.library_info.text()
    assert text.startswith("bad cannot be launched:") and "'head_dim' must be an integer" in text


def test_a_replays_heading_gives_each_range_its_own_number(qtbot, tmp_path: Path) -> None:
    """Before: "236 s recorded, 08:00:00 to 08:00:27" (the events' span beside the samples'
    clock). Now the samples' span with their clock, and the events' only where they reach
    further (a server's start, 200 s before its first sample)."""
    lines = [HEADER, {"event": "state", "t": 100.0, "state": "starting"}]
    lines += [{**METRICS, "t": 300.0 + i} for i in range(28)]
    path = tmp_path / "r.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    box, _ = replay_view(read_recording(path), "r")
    qtbot.addWidget(box)
    text = box.heading.text()
    assert "27 s of samples, " in text and " · 28 samples · events over 227 s" in text, text
    path.write_text("".join(json.dumps(x) + "\n" for x in [HEADER, METRICS]))
    one, _ = replay_view(read_recording(path), "r")
    qtbot.addWidget(one)
    assert " · 1 sample" in one.heading.text() and "events over" not in one.heading.text()
