"""The Monitor tab: live pyqtgraph plots over a :class:`core.timeseries.TimeSeriesStore`.

Curves are created once and updated with ``setData`` from one QTimer (10 Hz), only when the
store changed; long windows use peak downsampling and clip-to-view. Live events and replayed
recordings feed the same store, so a recording from a GPU host looks exactly as if live.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QTimer, Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QGraphicsItem,
    QComboBox,
    QDoubleSpinBox,
    QFileDialog,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from core.timeseries import TimeSeriesStore

WINDOWS = {"1 min": 60.0, "10 min": 600.0, "1 h": 3600.0}
COLORS = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1")

# plot title -> [(series, label, color index, light)]; GPU series are added per GPU.
# p99 curves are drawn in the p50 colour, lighter.
PLOTS: dict[str, list[tuple[str, str, int, bool]]] = {
    "Host CPU %": [("host_cpu_pct", "CPU %", 0, False)],
    "Memory (GiB)": [("host_ram_used_gib", "host RAM", 0, False),
                     ("server_rss_gib", "server RSS", 1, False)],
    "KV-cache blocks": [("kv_blocks_used", "used", 4, False),
                        ("kv_blocks_total", "total", 4, True)],
    "KV-cache usage %": [("kv_usage_pct", "usage %", 4, False)],
    "Requests": [("running", "running", 0, False), ("waiting", "waiting", 1, False)],
    "Latency (ms)": [("ttft_p50_ms", "TTFT p50", 0, False), ("ttft_p99_ms", "TTFT p99", 0, True),
                     ("itl_p50_ms", "ITL p50", 1, False), ("itl_p99_ms", "ITL p99", 1, True),
                     ("e2e_p50_ms", "E2E p50", 2, False), ("e2e_p99_ms", "E2E p99", 2, True)],
    "Tokens / s": [("prompt_tokens_per_s", "prompt", 0, False),
                   ("generation_tokens_per_s", "generation", 4, False)],
    "Preemptions / s": [("preemptions_per_s", "preemptions", 2, False)],
}


def _gpu_plots(n: int) -> dict[str, list[tuple[str, str, int, bool]]]:
    return {
        "GPU utilisation %": [(f"gpu{i}_util_pct", f"GPU {i}", i % 7, False) for i in range(n)],
        "GPU memory (GiB)": [(f"gpu{i}_memory_used_gib", f"GPU {i}", i % 7, False)
                             for i in range(n)],
        "GPU power (W)": [(f"gpu{i}_power_w", f"GPU {i}", i % 7, False) for i in range(n)],
    }


class MonitorPanel(QWidget):
    """Plots, window choice, pause, alerts, PNG/CSV export, replay of a recording."""

    alert = Signal(str)  # a threshold was crossed: the message

    def __init__(self, store: TimeSeriesStore | None = None, parent: QWidget | None = None,
                 *, fps: float = 10.0) -> None:
        super().__init__(parent)
        self.store = store or TimeSeriesStore()
        self._drawn_version = -1
        self._gpus_drawn = -1
        self.paused = False
        self.window_s = 60.0
        self.curves: dict[str, pg.PlotDataItem] = {}
        self.plots: dict[str, pg.PlotItem] = {}
        self._alert_lines: dict[str, pg.InfiniteLine] = {}
        self._alert_active: dict[str, bool] = {}

        bar = QHBoxLayout()
        self.window_box = QComboBox()
        self.window_box.addItems(list(WINDOWS))
        self.window_box.currentTextChanged.connect(self._on_window_changed)
        self.pause_box = QCheckBox("Pause")
        self.pause_box.toggled.connect(self._on_pause_changed)
        self.ttft_limit = QDoubleSpinBox()
        self.ttft_limit.setRange(0, 1e6)
        self.ttft_limit.setSuffix(" ms")
        self.ttft_limit.setSpecialValueText("off")
        self.ttft_limit.setToolTip("Alert when p99 TTFT rises above this")
        self.kv_limit = QDoubleSpinBox()
        self.kv_limit.setRange(0, 100)
        self.kv_limit.setSuffix(" %")
        self.kv_limit.setSpecialValueText("off")
        self.kv_limit.setToolTip("Alert when KV-cache usage rises above this")
        self.ttft_limit.valueChanged.connect(self._on_limits_changed)
        self.kv_limit.valueChanged.connect(self._on_limits_changed)
        self.png_button = QPushButton("Export PNG…")
        self.csv_button = QPushButton("Export CSV…")
        self.open_button = QPushButton("Open recording…")
        self.png_button.clicked.connect(lambda: self._ask_export("png"))
        self.csv_button.clicked.connect(lambda: self._ask_export("csv"))
        for w in (QLabel("Window"), self.window_box, self.pause_box, QLabel("Alert: p99 TTFT >"),
                  self.ttft_limit, QLabel("KV >"), self.kv_limit):
            bar.addWidget(w)
        bar.addStretch(1)
        for w in (self.open_button, self.png_button, self.csv_button):
            bar.addWidget(w)
        self.banner = QLabel()
        self.banner.setStyleSheet("background:#fde2e1; color:#8a1c1c; padding:4px;")
        self.banner.hide()
        self.graphics = pg.GraphicsLayoutWidget()
        self.graphics.setBackground("w")
        lay = QVBoxLayout(self)
        lay.addLayout(bar)
        lay.addWidget(self.banner)
        lay.addWidget(self.graphics, 1)
        self._build_plots(0)
        self.timer = QTimer(self)
        self.timer.setInterval(int(1000 / fps))
        self.timer.timeout.connect(self.refresh)
        self.timer.start()

    # -- plots -------------------------------------------------------------------------------
    def _build_plots(self, gpus: int) -> None:
        self.graphics.clear()
        self.curves.clear()
        self.plots.clear()
        self._alert_lines.clear()
        spec = dict(PLOTS)
        if gpus:
            spec = {**_gpu_plots(gpus), **{k: v for k, v in PLOTS.items()
                                           if k != "Host CPU %"}}
        for n, (title, series) in enumerate(spec.items()):
            if n and n % 3 == 0:
                self.graphics.nextRow()
            p = self.graphics.addPlot(title=title)
            p.showGrid(x=True, y=True, alpha=0.2)
            # the store hands over peak-decimated data, about two points per pixel
            p.setClipToView(False)
            legend = p.addLegend(offset=(5, 5), labelTextSize="7pt")
            legend.setCacheMode(QGraphicsItem.DeviceCoordinateCache)
            p.setLabel("bottom", "s")
            for ax in ("left", "bottom"):
                # tick text is slow to draw in the raster engine: keep each axis as a pixmap,
                # redrawn only when its ticks change, not on every frame of the curves
                p.getAxis(ax).setCacheMode(QGraphicsItem.DeviceCoordinateCache)
            p.setMouseEnabled(x=False, y=True)
            for name, label, color, light in series:
                # 1-px solid pens: dashed or wider pens cost 10-100x in the raster engine
                c = pg.mkColor(COLORS[color])
                if light:
                    c.setAlpha(110)
                self.curves[name] = p.plot([], [], pen=pg.mkPen(c, width=1), name=label,
                                           connect="finite")
            self.plots[title] = p
        for key, plot, limit in (("ttft", "Latency (ms)", self.ttft_limit),
                                 ("kv", "KV-cache usage %", self.kv_limit)):
            pen = pg.mkPen("#c00", width=1, style=pg.QtCore.Qt.DotLine)
            line = pg.InfiniteLine(angle=0, pen=pen)
            line.setVisible(limit.value() > 0)
            line.setValue(limit.value())
            self.plots[plot].addItem(line, ignoreBounds=True)
            self._alert_lines[key] = line
        self._gpus_drawn = gpus

    def refresh(self, force: bool = False) -> None:
        """Redraw from the store if it changed and the tab is shown (the QTimer's slot);
        ``force`` draws a hidden panel too (exports, tests)."""
        if self.paused or self.store.version == self._drawn_version:
            return
        if not force and not self.isVisible():
            return
        if self.store.num_gpus != self._gpus_drawn:
            self._build_plots(self.store.num_gpus)
        self._drawn_version = self.store.version
        width = max(200, int(self.graphics.width() / 3))  # pixels per plot, about
        t, cols = self.store.window(self.window_s, list(self.curves), max_points=2 * width)
        for name, curve in self.curves.items():
            y = cols.get(name)
            if y is None or len(y) == 0 or np.all(np.isnan(y)):
                curve.setData([], [])
            else:
                curve.setData(t, y, skipFiniteCheck=False)
        for p in self.plots.values():
            p.setXRange(-self.window_s, 0, padding=0)
        self._check_alerts()

    def add_event(self, ev: dict[str, Any]) -> None:
        """Feed one event (live or replayed); plots update on the next timer tick."""
        self.store.append(ev)

    # -- controls ----------------------------------------------------------------------------
    def _on_window_changed(self, text: str) -> None:
        self.window_s = WINDOWS[text]
        self._drawn_version = -1
        self.refresh(force=True)

    def _on_pause_changed(self, paused: bool) -> None:
        self.paused = paused
        if not paused:
            self._drawn_version = -1
            self.refresh(force=True)

    def _on_limits_changed(self, *_: Any) -> None:
        for key, limit in (("ttft", self.ttft_limit), ("kv", self.kv_limit)):
            line = self._alert_lines.get(key)
            if line is not None:
                line.setValue(limit.value())
                line.setVisible(limit.value() > 0)
        self._alert_active.clear()
        self._check_alerts()

    def _check_alerts(self) -> None:
        checks = (("ttft", "ttft_p99_ms", self.ttft_limit.value(), "p99 TTFT {v:.0f} ms > "
                   "{lim:.0f} ms"),
                  ("kv", "kv_usage_pct", self.kv_limit.value(), "KV-cache usage {v:.1f}% > "
                   "{lim:.0f}%"))
        messages = []
        for key, series, lim, fmt in checks:
            v = self.store.latest(series)
            over = lim > 0 and v is not None and v > lim
            if over and not self._alert_active.get(key):
                msg = time.strftime("%H:%M:%S ") + fmt.format(v=v, lim=lim)
                self.alert.emit(msg)
            self._alert_active[key] = over
            if over:
                messages.append(fmt.format(v=v, lim=lim))
        self.banner.setVisible(bool(messages))
        self.banner.setText("⚠ " + " · ".join(messages))

    # -- export ------------------------------------------------------------------------------
    def export_png(self, path: str | Path) -> None:
        self.refresh(force=True)
        self.graphics.grab().save(str(path))

    def export_csv(self, path: str | Path) -> int:
        return self.store.to_csv(path)

    def _ask_export(self, kind: str) -> None:
        path, _ = QFileDialog.getSaveFileName(self, f"Export {kind.upper()}", f"monitor.{kind}",
                                              f"{kind.upper()} (*.{kind})")
        if path:
            (self.export_png if kind == "png" else self.export_csv)(path)

    def data_of(self, name: str) -> np.ndarray:
        """The y-data a curve shows now (for tests and exports)."""
        _, y = self.curves[name].getData()
        return np.asarray(y if y is not None else [])
