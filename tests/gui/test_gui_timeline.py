"""The tuning timeline on the Monitor: markers on every plot with their diff, two spans
compared (the default either side of the latest marker, then one dragged), the export; the
window's launches, fleet switches, benchmark runs and replayed recordings as markers. Data: two
H200 launches of one model recorded by ``quantdeck serve --record`` (bf16 with CUDA graphs,
then bitsandbytes eager)."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import ROOT
from PySide6.QtCore import Qt

from quantdeck.core.bench.results import BenchResult
from quantdeck.core.events import FallbackEvent, InstanceEvent, MarkerEvent, MetricsEvent
from quantdeck.core.launch.device import H200
from quantdeck.core.monitor import Recorder, read_recording, timeline_of
from quantdeck.core.monitor.timeline import COMPARED
from quantdeck.gui.main_window import MainWindow
from quantdeck.gui.monitor import MonitorPanel, replay_view

GPU = ROOT / "docs" / "gpu-validation"
RECS = [GPU / "record-bf16-graphs.jsonl.gz", GPU / "record-bnb4-eager.jsonl.gz"]


@pytest.fixture
def panel(qtbot) -> MonitorPanel:
    m = MonitorPanel(fps=1)
    qtbot.addWidget(m)
    m.resize(1200, 800)
    recs = [read_recording(p) for p in RECS]
    for rec in recs:
        for ev in rec.of(MetricsEvent):
            m.add_event(ev)
    for marker in timeline_of(recs).markers:
        m.timeline.add(marker)
    m.window_box.setCurrentText("1 h")
    m.refresh(force=True)
    return m


def test_markers_are_lines_on_every_plot_with_their_diff(panel: MonitorPanel) -> None:
    markers = panel.timeline.markers
    assert [m.what for m in markers] == ["launch", "knobs"]
    lines = panel.marker_lines.items
    assert len(lines) == len(markers) * len(panel.plots)
    last = panel.store.last_t
    assert last is not None
    knobs = [line for m, line, _ in lines if m.what == "knobs"]
    assert all(line.value() == pytest.approx(markers[1].t - last) for line in knobs)
    assert "quantization: default → bitsandbytes" in knobs[0].toolTip()
    labelled = [line for _, line, _ in lines if getattr(line, "label", None) is not None]
    assert len(labelled) == 3 * len(markers)  # the top row of plots
    # a new marker (a live restart) is drawn on the next refresh
    panel.add_event(MarkerEvent("launch", "launch", config=dict(panel.timeline.config), t=last))
    panel.refresh(force=True)
    assert panel.timeline.markers[-1].what == "restart"
    assert len(panel.marker_lines.items) == 3 * len(panel.plots)


def test_no_marker_label_covers_a_legend(qtbot, panel: MonitorPanel) -> None:
    """The first launch sits at the plots' left edge, where the legends are: its label goes
    under the legend instead of over it; with the legends hidden it goes back to the top."""
    panel.show()
    panel.window_box.setCurrentText("10 min")  # the launch near the left edge
    last = panel.store.last_t
    assert last is not None
    panel.add_event(MarkerEvent("launch", "launch", config={}, t=last - 590))
    qtbot.wait(50)
    panel.refresh(force=True)
    checked = 0
    for _, line, plot in panel.marker_lines.items:
        text = getattr(line, "label", None)
        rect = panel.grid.legend_rect(plot)
        if text is None or rect is None or not text.isVisible():
            continue
        legend = plot.vb.mapRectToScene(rect)
        assert not text.sceneBoundingRect().intersects(legend), (text.toPlainText(), legend)
        checked += 1
    assert checked >= 3
    panel.legend_box.setChecked(False)
    panel.refresh(force=True)
    heights = {
        round(line.label.orthoPos, 2)
        for _, line, _ in panel.marker_lines.items
        if getattr(line, "label", None)
    }
    assert max(heights) == 0.95


def test_compare_spans_either_side_of_the_change_then_a_dragged_span(
    qtbot, panel: MonitorPanel, tmp_path: Path
) -> None:
    qtbot.mouseClick(panel.compare_button, Qt.LeftButton)
    assert panel.compare_button.isChecked() and not panel.compare_panel.isHidden()
    cmp = panel.comparison()
    # equal spans next to the knob change (the shorter side's length), with the load note
    assert cmp is not None and cmp.before.seconds == pytest.approx(cmp.after.seconds)
    assert 10 < cmp.samples[0] <= 55 and 10 < cmp.samples[1] < 232
    assert panel.compare_panel.load_note.isHidden()  # spans of comparable load: no note
    model = panel.compare_panel.model
    assert [model.text(i, "metric") for i in range(len(model.rows))] == [c[0] for c in COMPARED]
    assert model.text(0, "change").endswith("worse")  # generated tok/s fell
    assert panel.compare_panel.separated.text() == (
        "Separated by: knobs: enforce-eager default → on, quantization default → bitsandbytes"
    )
    assert len(panel.compare.regions) == len(panel.plots)
    last = panel.store.last_t
    _, before, after = panel.compare.regions[0]
    assert before.getRegion() == pytest.approx((cmp.before.t0 - last, cmp.before.t1 - last))
    # the user drags the "after" span on one plot to its last 30 s: every plot follows
    _, _, other = panel.compare.regions[5]
    after.setRegion((-30.0, 0.0))
    new = panel.comparison()
    assert new is not None and new.after.t0 == pytest.approx(last - 30)
    assert 0 < new.samples[1] < 232 and new.samples[0] == cmp.samples[0]
    panel.refresh(force=True)
    assert other.getRegion() == pytest.approx((-30.0, 0.0))
    out = panel.compare_panel.export(tmp_path / "report")
    page = out.read_text()
    assert "Tuning timeline" in page and "quantization default → bitsandbytes" in page
    qtbot.mouseClick(panel.compare_button, Qt.LeftButton)
    assert panel.comparison() is None and panel.compare.regions == []
    assert panel.compare_panel.isHidden()


def test_compare_without_samples_says_so(qtbot) -> None:
    m = MonitorPanel(fps=1)
    qtbot.addWidget(m)
    qtbot.mouseClick(m.compare_button, Qt.LeftButton)
    assert not m.compare_button.isChecked() and m.problem.text() == "no samples to compare"


def test_the_window_marks_launches_fleet_switches_bench_runs_and_replays(
    qtbot, tmp_path: Path
) -> None:
    win = MainWindow(device=H200, probe=False)
    qtbot.addWidget(win)
    # what QtServerController.start emits for each start, as the window receives it
    for cfg in ({"model": "/m"}, {"model": "/m"}, {"model": "/m", "max-num-seqs": 8}):
        win.controller.event.emit(MarkerEvent("launch", "launch", config=cfg))
    tl = win.monitor.timeline
    assert [m.what for m in tl.markers] == ["launch", "restart", "knobs"]
    assert tl.markers[-1].diff == {"max-num-seqs": [None, 8]}
    win._on_fleet_event(
        InstanceEvent("router", FallbackEvent(True, "ttft_p99_ms", 900.0, 500.0, 3.0, ["b"]))
    )
    assert tl.markers[-1].what == "fleet" and tl.markers[-1].label == "fallback on: b take traffic"
    win.bench.finished.emit(BenchResult(label="chat", output_throughput=12.5, duration=2.0))
    assert any(m.label == "bench chat: 12.5 tok/s" for m in tl.markers)  # at its start
    # a recording with markers, replayed in its own window: its markers there, the live
    # Monitor's left as they were
    path = tmp_path / "r.jsonl"
    rec = Recorder(path, {"source": "serve", "config": {"model": "/m"}})
    rec.write(MarkerEvent("launch", "launch", config={"model": "/m"}, t=100.0))
    rec.write(MetricsEvent.from_values(101.0, {"generation_tokens_per_s": 1.0}))
    rec.write(MarkerEvent("launch", "launch", config={"model": "/m", "dtype": "half"}, t=102.0))
    rec.write(MetricsEvent.from_values(103.0, {"generation_tokens_per_s": 2.0}))
    rec.close()
    live_markers = list(tl.markers)
    assert win.open_recording(str(path)) == 4
    assert [(m.what, m.diff) for m in win.replays[-1].panel.timeline.markers] == [
        ("launch", {}),
        ("knobs", {"dtype": [None, "half"]}),
    ]
    assert tl.markers == live_markers  # the live timeline is not the recording's
    # quantdeck replay shows them too; a recording made before markers gets its launch
    box, panel = replay_view(read_recording(RECS[0]), "bf16")
    qtbot.addWidget(box)
    assert [m.what for m in panel.timeline.markers] == ["launch"]
    win.close()


def test_a_replay_opens_at_the_smallest_window_that_holds_it(qtbot, tmp_path: Path) -> None:
    """The two launches recorded 18 minutes apart open at "30 min" (with only 10 min and 1 h
    the curves took a third of each plot); the first alone, 27 s of samples, at "1 min"."""
    recs = [read_recording(p) for p in RECS]
    path = tmp_path / "two.jsonl"
    rec = Recorder(path, dict(recs[0].header.info))
    for ev in sorted((e for r in recs for e in r.events), key=lambda e: getattr(e, "t", 0.0)):
        rec.write(ev)
    rec.close()
    for recording, window in ((read_recording(path), "30 min"), (recs[0], "1 min")):
        ts = [e.t for e in recording.of(MetricsEvent)]
        box, panel = replay_view(recording, "replay")
        qtbot.addWidget(box)
        assert panel.window_box.currentText() == window, max(ts) - min(ts)
        assert max(ts) - min(ts) <= panel.window_s
