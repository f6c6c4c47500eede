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
from quantdeck.gui.replay import replay_view

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
