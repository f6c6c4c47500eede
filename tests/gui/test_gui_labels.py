"""What users and models wrote shows as text, never as markup: a model path or an error that
quotes one cannot draw a link or an image in the panel."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QLabel

from quantdeck.core.launch import cpu_device
from quantdeck.gui.main_window import MainWindow

HOSTILE = "<img src='/etc/passwd'><a href='http://x'>click</a>"


def test_status_labels_show_markup_as_text(qtbot) -> None:
    win = MainWindow(device=cpu_device(), probe=False)
    qtbot.addWidget(win)
    labels: list[QLabel] = [
        win.status_label,
        win.library_info,
        win.launch.message,
        win.launch.stage,
        win.launch.engine_label,
        win.bench.status,
        win.convert.message,
    ]
    for label in labels:
        label.setText(HOSTILE)
        assert label.textFormat() == Qt.TextFormat.PlainText
        assert label.text() == HOSTILE


def test_planner_escapes_its_error(qtbot) -> None:
    win = MainWindow(device=cpu_device(), probe=False)
    qtbot.addWidget(win)
    planner = win.launch.planner
    planner.show_plan(None, [], HOSTILE)
    assert "<img" not in planner.figures.text() and "&lt;img" in planner.figures.text()
