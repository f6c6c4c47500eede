"""Compare spans as an operator saw it in the window at 1400×900 (issue 44): every row of
the table shown as the comparison opens (before: 1 of 13), and no "better" or "worse" under
the panel's own warning that the two spans differ in load (the figures kept). Data: the two
H200 launches recorded by ``quantdeck serve --record``, and two spans of made-up load."""

from __future__ import annotations

from conftest import ROOT
from PySide6.QtWidgets import QTabWidget

from quantdeck.core.events import MarkerEvent, MetricsEvent
from quantdeck.core.launch.device import H200
from quantdeck.core.monitor import read_recording, timeline_of
from quantdeck.core.monitor.timeline import COMPARED, LOAD_DIFFERS, Span
from quantdeck.gui.main_window import MainWindow
from quantdeck.gui.monitor import MonitorPanel

GPU = ROOT / "docs" / "gpu-validation"
RECS = [GPU / "record-bf16-graphs.jsonl.gz", GPU / "record-bnb4-eager.jsonl.gz"]


def _rows_shown(panel: MonitorPanel) -> int:
    """The table's rows wholly inside its viewport."""
    table = panel.compare_panel.table
    return table.viewport().height() // table.rowHeight(0)


def test_the_table_shows_every_row_in_a_1400_by_900_window(qtbot) -> None:
    win = MainWindow(device=H200, probe=False)
    qtbot.addWidget(win)
    win.resize(1400, 900)
    win.show()
    qtbot.waitExposed(win)
    panel = win.monitor
    for tabs in win.findChildren(QTabWidget):  # the Monitor tab, its Plots page
        for i in range(tabs.count()):
            if tabs.widget(i).isAncestorOf(panel):
                tabs.setCurrentIndex(i)
    recs = [read_recording(p) for p in RECS]
    for rec in recs:
        for ev in rec.of(MetricsEvent):
            panel.add_event(ev)
    for marker in timeline_of(recs).markers:
        panel.timeline.add(marker)
    panel.refresh(force=True)
    panel.compare_button.click()
    qtbot.wait(20)
    assert panel.compare_panel.model.rowCount() == len(COMPARED) == 13
    assert _rows_shown(panel) == 13  # before: 1
    assert panel.graphics.height() >= panel.graphics.minimumHeight()  # the plots keep theirs
    win.close()


def test_spans_of_different_load_say_differs_not_better_or_worse(qtbot) -> None:
    """2 requests running, then 8: throughput up and latency up follow load. The figures
    and their change stay; the word is "differs (load differs)", under the warning."""
    m = MonitorPanel(fps=1)
    qtbot.addWidget(m)
    t0 = 1_000_000.0
    for i in range(120):
        busy = i >= 60
        m.add_event(
            MetricsEvent.from_values(
                t0 + i,
                {
                    "running": 8.0 if busy else 2.0,
                    "generation_tokens_per_s": 400.0 if busy else 100.0,
                    "ttft_p50_ms": 90.0 if busy else 30.0,
                },
            )
        )
    m.timeline.add(MarkerEvent("launch", "launch", config={"model": "/m"}, t=t0 + 59.5))
    cmp = m.set_spans(Span(t0, t0 + 59), Span(t0 + 60, t0 + 119))
    panel = m.compare_panel
    assert "differ in load" in cmp.load_note() and not panel.load_note.isHidden()
    model = panel.model
    rows = {model.text(i, "metric"): i for i in range(model.rowCount())}
    for name in ("generated tok/s", "TTFT p50 (ms)"):
        change = model.text(rows[name], "change")
        assert "better" not in change and "worse" not in change, change
        assert change.endswith(LOAD_DIFFERS)
    assert model.text(rows["generated tok/s"], "before") == "100"
    assert model.text(rows["generated tok/s"], "after") == "400"
    assert model.text(rows["generated tok/s"], "change").startswith("+300 (+300%)")
    assert "better" not in cmp.format() and "worse" not in cmp.format()
    assert {r["verdict"] for r in cmp.to_json()["rows"]} <= {"", LOAD_DIFFERS}
    # the same spans at the same load: better and worse again
    same = m.set_spans(Span(t0 + 60, t0 + 89), Span(t0 + 90, t0 + 119))
    assert same.load_note() == "" and panel.load_note.isHidden()


def test_a_comparable_load_keeps_its_verdict() -> None:
    from quantdeck.core.monitor.timeline import MetricRow

    assert MetricRow("x", "x", "higher", 100.0, 150.0).verdict == "better"
    assert MetricRow("x", "x", "higher", 100.0, 150.0, load_differs=True).verdict == LOAD_DIFFERS
    assert MetricRow("x", "x", "", 100.0, 150.0, load_differs=True).verdict == ""
