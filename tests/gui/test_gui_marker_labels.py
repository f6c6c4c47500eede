"""The Monitor's marker labels in the window at 1400×900 (issue 44): markers a second apart
in the 1 min window had their labels drawn over each other (four heights in turn, 0.2 of a
plot apart: less than a label's height on the window's plots). Each label now takes a free
place; one with none left is hidden and its line's tooltip still has it."""

from __future__ import annotations

from itertools import combinations

from PySide6.QtCore import QRectF
from PySide6.QtWidgets import QTabWidget

from quantdeck.core.events import MarkerEvent, MetricsEvent
from quantdeck.core.launch.device import H200
from quantdeck.gui.main_window import MainWindow
from quantdeck.gui.monitor import MonitorPanel

T0 = 1_000_000.0


def _monitor(qtbot) -> tuple[MainWindow, MonitorPanel]:
    """The window at 1400×900 on its Monitor's plots, two minutes of samples, 1 min shown."""
    win = MainWindow(device=H200, probe=False)
    qtbot.addWidget(win)
    win.resize(1400, 900)
    win.show()
    qtbot.waitExposed(win)
    panel = win.monitor
    for tabs in win.findChildren(QTabWidget):
        for i in range(tabs.count()):
            if tabs.widget(i).isAncestorOf(panel):
                tabs.setCurrentIndex(i)
    for i in range(120):
        values = {"running": 2.0, "generation_tokens_per_s": 100.0 + i, "ttft_p50_ms": 30.0}
        panel.add_event(MetricsEvent.from_values(T0 + i, values))
    panel.window_box.setCurrentText("1 min")
    qtbot.wait(20)  # laid out at the window's size
    return win, panel


def _labels(panel: MonitorPanel) -> dict[int, list[tuple[str, bool, QRectF]]]:
    """Per labelled plot: each label's text, whether it is shown, its rectangle (scene)."""
    out: dict[int, list[tuple[str, bool, QRectF]]] = {}
    for _, line, plot in panel.marker_lines.items:
        text = getattr(line, "label", None)
        if text is not None:
            out.setdefault(id(plot), []).append(
                (text.toPlainText(), text.isVisible(), text.sceneBoundingRect())
            )
    return out


def _add(panel: MonitorPanel, seconds_ago: float, seqs: int) -> None:
    t = T0 + 119 - seconds_ago
    cfg = {"model": "/m", "max-num-seqs": seqs}
    panel.timeline.add(MarkerEvent("launch", f"max-num-seqs {seqs}", config=cfg, t=t))


def test_two_markers_a_second_apart_have_labels_that_do_not_overlap(qtbot) -> None:
    win, panel = _monitor(qtbot)
    _add(panel, 30, 8)
    _add(panel, 29, 16)
    panel.refresh(force=True)
    labels = _labels(panel)
    assert len(labels) == 3  # the top row of plots
    for shown in labels.values():
        assert len(shown) == 2 and all(visible for _, visible, _ in shown)
        (_, _, a), (_, _, b) = shown
        assert not a.intersects(b), (a, b)  # before: one over the other
    win.close()


def test_a_crowd_of_markers_never_overlaps_and_the_hidden_keep_their_tooltip(qtbot) -> None:
    win, panel = _monitor(qtbot)
    for k in range(8):
        _add(panel, 40 - k, 2**k)
    panel.refresh(force=True)
    for shown in _labels(panel).values():
        visible = [rect for _, on, rect in shown if on]
        assert len(visible) >= 2
        assert not any(a.intersects(b) for a, b in combinations(visible, 2))
    for m, line, _ in panel.marker_lines.items:
        assert m.label in line.toolTip()  # shown on the plot or not
    # as time moves on the labels follow their lines and still do not overlap
    for i in range(120, 130):
        values = {"running": 2.0, "generation_tokens_per_s": 100.0, "ttft_p50_ms": 30.0}
        panel.add_event(MetricsEvent.from_values(T0 + i, values))
    panel.refresh(force=True)
    for shown in _labels(panel).values():
        visible = [rect for _, on, rect in shown if on]
        assert not any(a.intersects(b) for a, b in combinations(visible, 2))
    win.close()
