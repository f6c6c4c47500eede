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
    left = next(a for a in m._axes if a.axis is m.plots["Requests"].getAxis("left"))
    ticks = [
        v for _, vs in left.axis.tickValues(*m.plots["Requests"].vb.viewRange()[1], 200) for v in vs
    ]
    assert max(ticks) <= 3 and not left.pixmap().isNull()
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
    assert metrics and all(ev.get("gpus") for ev in metrics)
    assert max(g["utilization_pct"] for ev in metrics for g in ev.get("gpus")) > 50
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
    for i in range(30):
        m.add_event(metrics_event(100.0 + i, generation_tokens_per_s=10.0 + i % 3))
    m.refresh(force=True)
    plot = m.plots["Tokens / s"]
    y0, y1 = plot.vb.viewRange()[1]
    assert y0 <= 10.0 and 12.0 <= y1 < 20.0
    m.add_event(metrics_event(131.0, generation_tokens_per_s=500.0))
    m.refresh(force=True)
    assert plot.vb.viewRange()[1][1] >= 500.0
    m.window_box.setCurrentText("10 min")
    assert plot.vb.viewRange()[0] == [-600.0, 0.0]
