"""The Monitor tab: live events and replayed recordings alike."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from conftest import ROOT, metrics_event

from quantdeck.core.events import MetricsEvent
from quantdeck.core.monitor.recording import Recorder, read_recording, replay
from quantdeck.gui.monitor import MonitorPanel


def test_monitor_plots_receive_points(qtbot) -> None:
    m = MonitorPanel()
    qtbot.addWidget(m)
    for i in range(30):
        m.add_event(metrics_event(100.0 + i, generation_tokens_per_s=float(i)))
    m.refresh(force=True)
    y = m.data_of("generation_tokens_per_s")
    assert len(y) == 30 and y[-1] == 29.0
    m.pause_box.setChecked(True)
    m.add_event(metrics_event(131.0, generation_tokens_per_s=99.0))
    m.refresh(force=True)
    assert m.data_of("generation_tokens_per_s")[-1] == 29.0  # paused
    m.pause_box.setChecked(False)
    assert m.data_of("generation_tokens_per_s")[-1] == 99.0


def test_axes_follow_range_and_size(qtbot) -> None:
    """The axes are pixmaps drawn from pyqtgraph's axis items: new ticks after the y range
    moved, and again after a resize with no new data."""
    m = MonitorPanel(fps=1)
    qtbot.addWidget(m)
    m.resize(900, 600)
    m.show()
    for i in range(20):
        m.add_event(metrics_event(100.0 + i, running=float(i % 3)))
    m.refresh(force=True)
    left = next(a for a in m.grid.axes if a.axis is m.plots["Requests"].getAxis("left"))
    ticks = [
        v for _, vs in left.axis.tickValues(*m.plots["Requests"].vb.viewRange()[1], 200) for v in vs
    ]
    assert max(ticks) <= 10 and not left.pixmap().isNull()
    before = left.pixmap().toImage()
    m.add_event(metrics_event(121.0, running=5000.0))
    m.refresh(force=True)
    assert m.plots["Requests"].vb.viewRange()[1][1] > 5000
    assert left.axis.picture is not None and left.pixmap().toImage() != before
    size = left.pixmap().size()
    m.resize(1300, 900)
    qtbot.waitUntil(lambda: left.pixmap().size() != size, timeout=2000)


def test_alerts_banner_and_signal(qtbot) -> None:
    m = MonitorPanel()
    qtbot.addWidget(m)
    m.show()
    m.ttft_limit.setValue(200)
    m.add_event(metrics_event(1.0, ttft_p99_ms=150.0))
    m.refresh(force=True)
    assert m.banner.isHidden()
    with qtbot.waitSignal(m.alert) as sig:
        m.add_event(metrics_event(2.0, ttft_p99_ms=450.0))
        m.refresh(force=True)
    assert "p99 TTFT 450 ms > 200 ms" in sig.args[0]
    assert m.banner.isVisible() and "450" in m.banner.text()


def test_flapping_alert_does_not_move_the_plots(qtbot, monkeypatch) -> None:
    """An alert that comes and goes with the samples shows and hides the banner each time, in
    a row of its own that it keeps for a while: the plots are not laid out again each time."""
    monkeypatch.setattr("quantdeck.gui.monitor.alerting.BANNER_HOLD_S", 0.2)
    m = MonitorPanel(fps=1)
    qtbot.addWidget(m)
    m.resize(900, 600)
    m.show()
    m.add_event(metrics_event(1.0, kv_usage_pct=50.0))
    m.refresh(force=True)
    qtbot.waitUntil(lambda: m.graphics.height() > 0)
    height = m.graphics.height()
    heights = []
    for i in range(6):
        m.add_event(metrics_event(2.0 + i, kv_usage_pct=99.0 if i % 2 == 0 else 90.0))
        m.refresh(force=True)
        assert m.banner.isHidden() == bool(i % 2)
        qtbot.wait(1)  # layout
        heights.append(m.graphics.height())
    assert heights[0] < height and len(set(heights)) == 1  # moved once, when first shown
    qtbot.waitUntil(lambda: m.graphics.height() == height, timeout=2000)  # the row goes


def test_replayed_recording_looks_like_live(qtbot, tmp_path: Path) -> None:
    """A recording (e.g. from a GPU host) drawn in the Monitor equals the same events live."""
    events = [
        metrics_event(
            50.0 + i,
            generation_tokens_per_s=10.0 * i,
            gpus=[
                {
                    "utilization_pct": float(i),
                    "memory_used_bytes": 2**30,
                    "power_w": 300.0,
                    "temperature_c": 40.0,
                    "server_memory_bytes": 2**30,
                }
            ],
        )
        for i in range(20)
    ]
    rec = Recorder(tmp_path / "r.jsonl", {"source": "test"})
    for e in events:
        rec.write(e)
    rec.close()
    live, replayed = MonitorPanel(), MonitorPanel()
    qtbot.addWidget(live)
    qtbot.addWidget(replayed)
    for e in events:
        live.add_event(e)
    for _ in replay(read_recording(tmp_path / "r.jsonl"), replayed.add_event):
        pass
    live.refresh(force=True)
    replayed.refresh(force=True)
    assert "GPU utilisation %" in replayed.plots
    for name in ("gpu0_util_pct", "generation_tokens_per_s", "kv_blocks_used"):
        assert np.array_equal(live.data_of(name), replayed.data_of(name))


def test_export_png(qtbot, tmp_path: Path) -> None:
    m = MonitorPanel()
    qtbot.addWidget(m)
    m.resize(900, 600)
    m.add_event(metrics_event(1.0))
    m.export_png(tmp_path / "m.png")
    assert (tmp_path / "m.png").stat().st_size > 5000


def test_h200_recordings_replay_to_png(qtbot, tmp_path: Path) -> None:
    """The GPU validation's gzipped recordings load, carry NVML samples, and render."""
    from quantdeck.cli.main import main as cli_main

    rec_path = ROOT / "docs" / "gpu-validation" / "record-bf16-graphs.jsonl.gz"
    rec = read_recording(rec_path)
    metrics = rec.of(MetricsEvent)
    assert metrics and all(ev.telemetry and ev.telemetry.gpus for ev in metrics)
    gpus = [g for ev in metrics if ev.telemetry for g in ev.telemetry.gpus]
    assert max(g.utilization_pct for g in gpus) > 50
    out = tmp_path / "replay.png"
    assert cli_main(["replay", str(rec_path), "--png", str(out), "--size", "900x600"]) == 0
    from PySide6.QtGui import QImage

    img = QImage(str(out))
    assert img.width() >= 900 and img.height() >= 600  # at least the size asked (min sizes)
    bad = tmp_path / "bad.jsonl.gz"
    bad.write_bytes(b"not gzip")
    assert cli_main(["replay", str(bad), "--png", str(out)]) == 2


def test_y_range_follows_the_data(qtbot) -> None:
    """The Monitor sets each plot's y range from the curves (pyqtgraph's autorange is off):
    the data fits, a jump widens the range, and the x range is the window chosen."""
    m = MonitorPanel()
    qtbot.addWidget(m)
    m.resize(1400, 900)
    m.show()
    for i in range(30):
        m.add_event(metrics_event(100.0 + i, generation_tokens_per_s=10.0 + i % 3))
    m.refresh(force=True)
    plot = m.plots["Tokens / s"]
    y0, y1 = plot.vb.viewRange()[1]
    assert y0 == 0.0 and 12.0 <= y1 < 40.0  # a rate starts at 0
    # the legend's rows sit above the data: no curve runs under it
    legend = m.grid.legends["Tokens / s"]
    bottom = legend.mapToScene(legend.boundingRect().bottomLeft())
    assert plot.vb.mapSceneToView(bottom).y() >= 12.0
    # a percent plot shows 0-100 (and the legend's rows above it), however flat the data
    for i in range(5):
        m.add_event(metrics_event(131.0 + i, kv_usage_pct=99.5 + i / 10))
    m.refresh(force=True)
    k0, k1 = m.plots["KV-cache usage %"].vb.viewRange()[1]
    assert k0 == 0.0 and k1 >= 100.0
    # ... and ticks (and grid lines) only at 0..100: above is the legend's room, not a value
    axis = m.plots["KV-cache usage %"].getAxis("left")
    ticks = [v for _, level in axis.tickValues(k0, k1, 200) for v in level]
    assert 100.0 in ticks and max(ticks) == 100.0
    # data past 100 (a per-process share over cores): the axis then ticks it
    m.add_event(metrics_event(136.0, kv_usage_pct=99.0, host_cpu_pct=180.0))
    m.refresh(force=True)
    cpu = m.plots["Host CPU %"]
    c1 = cpu.vb.viewRange()[1][1]
    assert c1 >= 180.0
    assert max(v for _, level in cpu.getAxis("left").tickValues(0, c1, 200) for v in level) > 100
    m.legend_box.setChecked(False)  # hidden legends give the rows back
    assert not m.grid.legends["Tokens / s"].isVisible()
    assert m.plots["KV-cache usage %"].vb.viewRange()[1][1] == 100.0
    m.legend_box.setChecked(True)
    m.add_event(metrics_event(137.0, generation_tokens_per_s=500.0))
    m.refresh(force=True)
    assert plot.vb.viewRange()[1][1] >= 500.0
    m.window_box.setCurrentText("10 min")
    assert plot.vb.viewRange()[0] == [-600.0, 0.0]


def test_a_gap_in_the_samples_breaks_the_curves_and_a_stop_is_shown(qtbot) -> None:
    """Before: a minute without samples (a stopped server) was drawn as a straight line
    across it, and the stopped plots froze with no cue."""
    import time

    from conftest import metrics_event

    from quantdeck.gui.monitor import STALE_S, MonitorPanel

    panel = MonitorPanel()
    qtbot.addWidget(panel)
    now = time.time()
    t0 = now - 60
    for i in range(10):  # 0.5 s apart, then the server stops for half a minute
        panel.add_event(metrics_event(t0 + i / 2, kv_usage_pct=10.0 + i))
    panel.set_source_state("stopped", t0 + 5)
    panel.refresh(force=True)
    assert panel.source_state.isVisibleTo(panel)
    assert "stopped at" in panel.source_state.text()
    panel.set_source_state("starting", t0 + 30)
    assert "starting since" in panel.source_state.text()
    for i in range(10):
        panel.add_event(metrics_event(t0 + 35 + i / 2, kv_usage_pct=30.0 + i))
    panel.set_source_state("ready", t0 + 35)
    panel.refresh(force=True)
    y = panel.data_of("kv_usage_pct")
    assert len(y) == 21 and np.isnan(y[10])  # one break between the runs
    assert np.isfinite(np.delete(y, 10)).all()
    x, _ = panel.curves["kv_usage_pct"].getData()
    path = panel.curves["kv_usage_pct"].path()
    # the drawn path is two pieces: no segment spans the stop
    starts = [i for i in range(path.elementCount()) if path.elementAt(i).isMoveTo()]
    assert len(starts) == 2 and x[10] > x[9]
    # the newest sample is 20 s old while the server is "ready": the source is stale
    assert "no samples since" in panel.source_state.text()
    panel.add_event(metrics_event(time.time(), kv_usage_pct=40.0))
    panel.refresh(force=True)
    assert not panel.source_state.isVisibleTo(panel)
    assert STALE_S <= 10


def test_gaps_follow_the_spacing_of_decimated_windows() -> None:
    from quantdeck.gui.monitor import with_gaps

    t = np.arange(0.0, 100.0, 10.0)  # wide bins: 10 s apart is no gap
    t2, cols = with_gaps(t, {"a": np.ones(len(t))})
    assert len(t2) == len(t)
    t = np.array([0.0, 0.5, 1.0, 1.5, 9.0, 9.5])
    t2, cols = with_gaps(t, {"a": np.arange(6.0)})
    assert len(t2) == 7 and np.isnan(cols["a"][4]) and t2[3] < t2[4] < t2[5]


def test_each_source_keeps_its_own_samples_and_markers(qtbot) -> None:
    """Before: attaching to another server (a fleet's instance) wiped the Launch tab
    server's history; now each is a source of its own, listed and shown on choice."""
    import time

    from conftest import metrics_event

    from quantdeck.core.events import MarkerEvent, StateEvent
    from quantdeck.gui.monitor import MonitorPanel

    panel = MonitorPanel()
    qtbot.addWidget(panel)
    now = time.time()
    panel.add_server_event(MarkerEvent("launch", "launch", config={"model": "/m"}, t=now - 30))
    panel.add_server_event(StateEvent("ready", t=now - 29))
    for i in range(6):
        panel.add_event(metrics_event(now - 28 + i, running=2))
    panel.add_server_event(StateEvent("stopped", t=now - 20))
    server = panel.sources["server"]
    before = (len(server.store), [m.what for m in server.timeline.markers])
    assert before == (6, ["launch"]) and panel.source_box.isHidden()
    # the operator attaches to a fleet's instance: a source of its own, shown
    url = "http://127.0.0.1:18001"
    panel.add_server_event(StateEvent("attached", url=url, t=now - 10))
    for i in range(4):
        panel.add_event(metrics_event(now - 9 + i, running=7))
    assert (len(server.store), [m.what for m in server.timeline.markers]) == before
    assert len(panel.store) == 4 and panel.source_box.isVisibleTo(panel)
    assert panel.source_box.currentText() == f"attached {url}"
    panel.refresh(force=True)
    assert list(panel.data_of("running")) == [7.0] * 4
    # the operator looks back at the server's run: its samples, and a cue that it is not live
    panel.source_box.setCurrentIndex(panel.source_box.findData("server"))
    panel.refresh(force=True)
    assert list(panel.data_of("running")) == [2.0] * 6
    assert "not followed since" in panel.source_state.text()
    # a start on the Launch tab follows the server's source again, and its markers
    panel.add_server_event(MarkerEvent("launch", "launch", config={"model": "/m"}, t=now))
    assert panel.source_box.currentData() == "server"
    assert [m.what for m in panel.timeline.markers] == ["launch", "restart"]
    assert len(panel.sources[f"url {url}"].store) == 4


def test_a_fleet_in_the_monitor_fits_the_default_window(qtbot) -> None:
    """Before: with a fleet attached (the source list and the overlay box in the toolbar, four
    per-instance plots in a fourth column) the Monitor's minimum width made the 1400-px window
    1572 px wide. Now the toolbar wraps and the instance plots go on in three columns."""
    import time

    from quantdeck.core.monitor.timeseries import TimeSeriesStore

    m = MonitorPanel()
    qtbot.addWidget(m)
    m.follow_source("attached:http://127.0.0.1:41309", "attached http://127.0.0.1:41309")
    now = time.time()
    stores = {name: TimeSeriesStore() for name in ("a", "b")}
    for store in stores.values():
        store.append(metrics_event(now, kv_usage_pct=3.0))
    m.set_instances(stores)
    m.resize(1100, 800)  # 1400 less the model list
    m.show()
    m.refresh(force=True)
    assert "Running by instance" in m.plots
    assert m.source_box.isVisibleTo(m) and m.instances_box.isVisibleTo(m)
    assert m.minimumSizeHint().width() <= 1100
    assert m.graphics.ci.layout.columnCount() == 3
    # every toolbar control inside the panel, none over another
    controls = [m.source_box, m.window_box, m.instances_box, m.ttft_limit, m.csv_button]
    rects = [
        c.geometry().translated(c.parentWidget().mapTo(m, c.pos()) - c.pos()) for c in controls
    ]
    assert all(r.left() >= 0 and r.right() <= m.width() for r in rects)
    assert not any(a.intersects(b) for i, a in enumerate(rects) for b in rects[i + 1 :])
    m.resize(1900, 800)  # wide: one row again
    qtbot.wait(50)
    tops = {c.parentWidget().mapTo(m, c.pos()).y() // 20 for c in (m.source_box, m.csv_button)}
    assert len(tops) == 1


def test_a_legend_taller_than_its_plot_allows_goes_into_columns(qtbot) -> None:
    """Before: at 1400x900 with a fleet, the Latency plot was ~70 px high and its six-row
    legend ran past the bottom, the E2E rows cut. Now it takes columns and stays inside."""
    m = MonitorPanel()
    qtbot.addWidget(m)
    for tall, wanted in ((1400, 1), (800, 3)):
        m.resize(1100, tall)
        m.show()
        qtbot.wait(20)
        for i in range(5):
            m.add_event(metrics_event(200.0 + i + tall, ttft_p50_ms=30.0, ttft_p99_ms=60.0))
        m.refresh(force=True)
        plot, legend = m.plots["Latency (ms)"], m.grid.legends["Latency (ms)"]
        rect = legend.mapRectToParent(legend.boundingRect())
        assert rect.bottom() <= plot.vb.height() and rect.right() <= plot.vb.width()
        assert m.grid.legend_columns.get("Latency (ms)", 1) == wanted


def test_every_plotted_series_is_a_column_the_store_keeps() -> None:
    """The plots and the store are joined by series name: a misspelt one drew an empty curve
    in silence (issue 44). The Monitor now checks the names when it loads; a misspelt one is
    named."""
    from quantdeck.core.monitor.timeseries import BASE_SERIES
    from quantdeck.gui.monitor.charts import PLOTS, unknown_series

    names = {s.name for s in BASE_SERIES}
    assert unknown_series(PLOTS, names) == []
    misspelt = {**PLOTS, "Latency (ms)": [("ttft_p99ms", "TTFT p99", 0, True)]}
    assert unknown_series(misspelt, names) == ["ttft_p99ms"]
