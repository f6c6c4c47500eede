"""The Monitor's Plots page: live pyqtgraph plots over a
:class:`quantdeck.core.monitor.timeseries.TimeSeriesStore`.

Curves are created once and updated from one QTimer (10 Hz), only when the store changed, with
peak-decimated data (about two points per pixel) that the store keeps ready for long windows.
Frames are cheap because Qt draws them without calling into Python per item
(:mod:`quantdeck.gui.monitor.plot_items`): curves, grid, axes and legends are plain Qt path /
pixmap items, text is cached as pixmaps, and the ranges are set here (pyqtgraph's autorange
scans every curve on every update). Live events and replayed recordings feed the same store, so
a recording from a GPU host looks exactly as if live. What is plotted is
:mod:`~quantdeck.gui.monitor.charts`; where it comes from, :mod:`~quantdeck.gui.monitor.sources`.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QRectF, QSignalBlocker, Qt, QTimer, Signal
from PySide6.QtGui import QColor, QFont, QFontMetrics
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QFileDialog,
    QGraphicsItem,
    QGraphicsPixmapItem,
    QGraphicsView,
    QLabel,
    QPushButton,
    QSplitter,
    QVBoxLayout,
    QWidget,
)

from quantdeck.core.errors import QuantdeckError
from quantdeck.core.events import Event, MarkerEvent, MetricsEvent, StateEvent
from quantdeck.core.monitor import TimeSeriesStore
from quantdeck.core.monitor.alerts import AlertLog
from quantdeck.core.monitor.timeline import (
    Span,
    SpanComparison,
    Timeline,
    compare_spans,
    default_spans,
)
from quantdeck.gui.flow import FlowLayout, group
from quantdeck.gui.monitor.charts import INSTANCE_PLOTS, PLOTS, WINDOWS, gpu_plots, with_gaps
from quantdeck.gui.monitor.plot_items import (
    AxisPixmap,
    Curve,
    Grid,
    PercentAxis,
    blend,
    legend_entry,
    legend_image,
    legend_pixmap,
)
from quantdeck.gui.monitor.sources import SERVER_SOURCE, MonitorSource, source_cue
from quantdeck.gui.monitor.timeline import ComparePanel, MarkerLines
from quantdeck.gui.style import (
    ALERT_BANNER_SHEET,
    CUE_SHEET,
    LIMIT_LINE,
    P99_SHADE,
    PLOT_BACKGROUND,
    PROBLEM_SHEET,
    SERIES_COLORS,
    SPAN_ALPHA,
    SPAN_COLORS,
    SPAN_HOVER_ALPHA,
)

# vLLM's dashboard thresholds, always on (the limits in the bar are the operator's own)
KV_ALERT_PCT = 98.0  # KV cache nearly full: preemptions follow
SLO_ALERT_PCT = 99.0  # a window's attainment under this
ENDED_STATES = ("stopped", "crashed")  # the live source's life ended: its alerts end with it
# The alert banner's row stays this long after the last alert cleared. An alert that comes and
# goes with the samples (KV usage about its threshold) would otherwise move every plot up and
# down with it, and each move lays out all the plots and draws all their axes again (about
# 0.1 s of the UI thread; it was most of the frame time while an alert flapped).
BANNER_HOLD_S = 10.0


class MonitorPanel(QWidget):
    """Plots, window choice, pause, alerts, PNG/CSV export, replay of a recording."""

    alert = Signal(str)  # an alert was raised or cleared: its line (time, reading)
    alerts_changed = Signal()  # the alert log changed (raised, cleared, acknowledged)
    slo_changed = Signal(object)  # {"ttft": ms}: the p99 TTFT limit is also the TTFT SLO

    def __init__(
        self,
        store: TimeSeriesStore | None = None,
        parent: QWidget | None = None,
        *,
        fps: float = 10.0,
        live: bool = True,
    ) -> None:
        """``live``: a server's samples as they come (alerts, limits, Open recording…); a
        replay's panel is not live: it raises no alert and offers neither."""
        super().__init__(parent)
        self.live = live
        first = MonitorSource(
            SERVER_SOURCE,
            "this panel's server",
            store if store is not None else TimeSeriesStore(),  # an empty one is falsy
        )
        self.sources: dict[str, MonitorSource] = {first.key: first}
        self._live = self._shown = first  # the source fed, and the one shown
        # a fleet's instances, each its own store (fed by the Fleet tab), overlaid on a row of
        # INSTANCE_PLOTS while "Fleet instances" is ticked
        self.instances: dict[str, TimeSeriesStore] = {}
        self._instances_drawn: tuple[str, ...] = ()
        self._instance_curves: list[tuple[str, str, Curve]] = []  # (instance, series, curve)
        self._drawn_version: Any = -1
        self._gpus_drawn = -1
        self.paused = False
        self.window_s = 60.0
        self.curves: dict[str, Curve] = {}
        self.plots: dict[str, pg.PlotItem] = {}
        self._alert_lines: dict[str, pg.InfiniteLine] = {}
        self.alerts = AlertLog()  # raised, cleared, acknowledged (the Alerts page lists them)
        self._alerts_seen: Any = None  # the live store's version the alerts were judged at
        self._ended_at: float | None = None  # when the live source stopped or crashed
        self._manual_y: set[str] = set()  # plots whose y range the user zoomed: left alone
        self._plot_curves: dict[str, list[Curve]] = {}
        self._legends: dict[str, QGraphicsPixmapItem] = {}
        self._legend_columns: dict[str, int] = {}  # columns each legend is drawn in now
        self._legend_entries: dict[str, tuple[int, int]] = {}  # an entry's width, height
        self._grids: dict[str, Grid] = {}
        self._axes: list[AxisPixmap] = []
        self._axes_timer = QTimer(self)  # a child: it goes with the panel
        self._axes_timer.setSingleShot(True)
        self._axes_timer.setInterval(0)
        self._axes_timer.timeout.connect(self._sync_axes)

        # which source the plots show (shown once there are two: a server, an attached URL)
        self.source_box = QComboBox()
        self.source_box.addItem(first.label, first.key)
        self.source_box.setVisible(False)
        self.source_box.currentIndexChanged.connect(self._on_source_chosen)
        # the toolbar wraps onto a second row in a narrow window (one row did not fit 1400 px
        # once a fleet added its source list and overlay box, and widened the window)
        bar = FlowLayout()
        self.window_box = QComboBox()
        self.window_box.addItems(list(WINDOWS))
        self.window_box.currentTextChanged.connect(self._on_window_changed)
        # the legends: kept above the curves (the y range leaves them their rows), or hidden
        self.legend_box = QCheckBox("Legends")
        self.legend_box.setChecked(True)
        self.legend_box.toggled.connect(self._on_legends_toggled)
        self.pause_box = QCheckBox("Pause")
        self.pause_box.toggled.connect(self._on_pause_changed)
        self.instances_box = QCheckBox("Fleet instances")
        self.instances_box.setToolTip("Overlay the fleet's instances: one curve per instance")
        self.instances_box.setChecked(True)
        self.instances_box.setVisible(False)  # until a fleet runs or is replayed
        self.instances_box.toggled.connect(lambda _: self._redraw())
        self.ttft_limit = QDoubleSpinBox()
        self.ttft_limit.setDecimals(0)  # whole ms (and a narrower box: the toolbar fits a row)
        self.ttft_limit.setRange(0, 600_000)
        self.ttft_limit.setSuffix(" ms")
        self.ttft_limit.setSpecialValueText("off")
        self.ttft_limit.setToolTip(
            "Alert when p99 TTFT rises above this; it is also the TTFT SLO whose attainment "
            "(the share of requests at or under it) the Hits · SLO plot shows"
        )
        self.kv_limit = QDoubleSpinBox()
        self.kv_limit.setDecimals(1)
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
        limits = group(QLabel("Alert: p99 TTFT >"), self.ttft_limit, QLabel("KV >"), self.kv_limit)
        for w in (
            self.source_box,
            group(QLabel("Window"), self.window_box),
            self.pause_box,
            self.legend_box,
            self.instances_box,
            limits,
        ):
            bar.addWidget(w)
        # the tuning timeline: markers on the plots, two spans compared
        self.marker_lines = MarkerLines()
        self.spans: tuple[Span, Span] | None = None
        self._regions: list[tuple[pg.PlotItem, pg.LinearRegionItem, pg.LinearRegionItem]] = []
        self._moving_regions = False
        self.compare_button = QPushButton("Compare spans")
        self.compare_button.setCheckable(True)
        self.compare_button.setToolTip(
            "Two spans side by side (throughput, TTFT/ITL, KV use, prefix hits) and the "
            "launches, knob changes, fleet switches and benchmark runs between them; they start "
            "either side of your latest change (launch, knob change, restart, fleet switch), "
            "equally long, the one after at the load nearest the one before"
        )
        self.compare_button.toggled.connect(self._on_compare_changed)
        self.compare_panel = ComparePanel()
        self.compare_panel.hide()
        for button in (self.compare_button, self.open_button, self.png_button, self.csv_button):
            bar.addWidget(button)
        if not live:  # a replay: no alerts, no other recording from here
            for hidden in (limits, self.open_button):
                hidden.hide()
        # whether the data still comes: a stopped, crashed, starting or stale source says so
        # above the plots (the curves hold what came until then)
        self.source_state = QLabel()
        self.source_state.setStyleSheet(CUE_SHEET)
        self.source_state.hide()
        self.banner = QLabel()
        self.banner.setStyleSheet(ALERT_BANNER_SHEET)
        self.banner.hide()
        self._banner_hold = QTimer(self)
        self._banner_hold.setSingleShot(True)
        self._banner_hold.setInterval(int(BANNER_HOLD_S * 1000))
        self._banner_hold.timeout.connect(lambda: self._keep_banner_row(False))
        # why the last sample lacks figures (the sampler goes on; this says what it misses)
        self.problem = QLabel()
        self.problem.setStyleSheet(PROBLEM_SHEET)
        self.problem.setWordWrap(True)
        self.problem.hide()
        self.graphics = pg.GraphicsLayoutWidget()
        self.graphics.setBackground(PLOT_BACKGROUND)
        # every frame changes every plot: one full repaint is cheaper than many update rects
        # (and than Qt's threaded blending of the many exposed pieces)
        self.graphics.setViewportUpdateMode(QGraphicsView.ViewportUpdateMode.FullViewportUpdate)
        lay = QVBoxLayout(self)
        lay.addLayout(bar)
        lay.addWidget(self.source_state)
        lay.addWidget(self.banner)
        lay.addWidget(self.problem)
        # the plots and the span comparison share the height in a splitter (the operator
        # moves the line; the plots keep at least a readable height)
        self.splitter = QSplitter(Qt.Orientation.Vertical)
        self.splitter.addWidget(self.graphics)
        self.splitter.addWidget(self.compare_panel)
        self.splitter.setChildrenCollapsible(False)
        self.splitter.setStretchFactor(0, 3)
        self.splitter.setStretchFactor(1, 1)
        self.graphics.setMinimumHeight(240)
        self.compare_panel.setMinimumHeight(120)
        lay.addWidget(self.splitter, 1)
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
        self._plot_curves.clear()
        self._legends.clear()
        self._legend_columns.clear()
        self._grids.clear()
        self._axes.clear()
        self._manual_y.clear()
        self._alert_lines.clear()
        spec = dict(PLOTS)
        if gpus:
            spec = {**gpu_plots(gpus), **{k: v for k, v in PLOTS.items() if k != "Host CPU %"}}
        for n, (title, series) in enumerate(spec.items()):
            if n and n % 3 == 0:
                self.graphics.nextRow()
            p = self._add_plot(title)
            curves = []
            for name, label, color, light in series:
                c = pg.mkColor(SERIES_COLORS[color])
                shade = blend(c, P99_SHADE, pg.mkColor(PLOT_BACKGROUND))
                curve = Curve(shade if light else c, label)
                if light:
                    curve.setZValue(-1)  # a p99 under its p50, where they meet
                p.vb.addItem(curve, ignoreBounds=True)
                self.curves[name] = curve
                curves.append(curve)
            self._finish_plot(title, p, curves)
        self._instance_curves = []
        names = self._overlaid()
        # the per-instance plots go on in the same three columns (a fourth column made the
        # plots' minimum width wider than a 1400-px window)
        for n, (title, figure) in enumerate(INSTANCE_PLOTS.items() if names else [], len(spec)):
            if n % 3 == 0:
                self.graphics.nextRow()
            p = self._add_plot(title)
            curves = []
            for i, name in enumerate(names):
                curve = Curve(pg.mkColor(SERIES_COLORS[i % len(SERIES_COLORS)]), name)
                p.vb.addItem(curve, ignoreBounds=True)
                self._instance_curves.append((name, figure, curve))
                curves.append(curve)
            self._finish_plot(title, p, curves)
        self._instances_drawn = names
        self.graphics.ci.setFlag(QGraphicsItem.GraphicsItemFlag.ItemHasNoContents, True)
        for key, plot, limit in (
            ("ttft", "Latency (ms)", self.ttft_limit),
            ("kv", "KV-cache usage %", self.kv_limit),
        ):
            pen = pg.mkPen(LIMIT_LINE, width=1, style=pg.QtCore.Qt.DotLine)
            line = pg.InfiniteLine(angle=0, pen=pen)
            line.setVisible(limit.value() > 0)
            line.setValue(limit.value())
            self.plots[plot].addItem(line, ignoreBounds=True)
            self._alert_lines[key] = line
        self._gpus_drawn = gpus
        self.marker_lines = MarkerLines()  # the old plots went with their lines
        if self.spans is not None:
            self._make_regions()

    def _add_plot(self, title: str) -> pg.PlotItem:
        axes = {"left": PercentAxis("left")} if "%" in title else None
        p = self.graphics.addPlot(title=title, axisItems=axes)
        for ax in ("left", "bottom"):  # grid lines: self._grids; as pyqtgraph draws
            p.getAxis(ax).setStyle(tickLength=0)  # them, without ticks on the axis
        # a fixed width for the tick labels (7 digits): pyqtgraph would widen the axis
        # to each new label, relaying out and repainting all plots several times in a row
        left = p.getAxis("left")
        left.setWidth(
            QFontMetrics(left.style["tickFont"] or QFont()).horizontalAdvance("-000000")
            + left.style["tickTextOffset"][0]
            + 6
        )
        # the store hands over peak-decimated data, about two points per pixel, and the
        # ranges are set here from that data: pyqtgraph neither clips, downsamples nor
        # autoranges (its autorange walks every curve's data on every update)
        p.setClipToView(False)
        p.vb.disableAutoRange()
        p.setXRange(-self.window_s, 0, padding=0)
        p.vb.sigRangeChangedManually.connect(lambda *_, title=title: self._zoomed(title))
        p.autoBtn.clicked.connect(lambda *_, title=title: self._manual_y.discard(title))
        p.setLabel("bottom", "s")
        p.setMouseEnabled(x=False, y=True)
        return p

    def _zoomed(self, title: str) -> None:
        """The operator zoomed ``title``'s y axis: its range is theirs until they press the
        plot's auto button, and a percent axis ticks every value they zoomed to."""
        self._manual_y.add(title)
        axis = self.plots[title].getAxis("left")
        if isinstance(axis, PercentAxis):
            axis.capped = False

    def _finish_plot(self, title: str, p: pg.PlotItem, curves: list[Curve]) -> None:
        self._plot_curves[title] = curves
        legend = legend_pixmap(curves, self.graphics.devicePixelRatioF())
        self._legend_entries[title] = legend_entry(curves)
        legend.setParentItem(p.vb)
        legend.setPos(13, 12)  # where pyqtgraph's legend at offset (5, 5) draws
        legend.setVisible(self.legend_box.isChecked())
        self._legends[title] = legend
        # text is slow to draw in the raster engine: axes and titles are kept as pixmaps,
        # redrawn only when they change, not on every frame of the curves (a parent's
        # cache does not cover its children: each item is set)
        for item in (p.getAxis("bottom").label, p.titleLabel, p.titleLabel.item):
            item.setCacheMode(QGraphicsItem.CacheMode.DeviceCoordinateCache)
        self._axes += [AxisPixmap(p.getAxis("left")), AxisPixmap(p.getAxis("bottom"))]
        p.vb.sigRangeChanged.connect(self._sync_axes_soon)
        p.vb.sigResized.connect(self._sync_axes_soon)
        # pyqtgraph's containers paint nothing themselves, but Qt asks each of them for its
        # (Python) bounding rect on every frame unless told they have no contents
        for item in (p, p.vb, p.titleLabel):
            item.setFlag(QGraphicsItem.GraphicsItemFlag.ItemHasNoContents, True)
        self.plots[title] = p
        self._grids[title] = Grid(p, pg.mkColor(PLOT_BACKGROUND))

    # -- a fleet's instances -----------------------------------------------------------------
    def set_instances(self, stores: dict[str, TimeSeriesStore]) -> None:
        """Overlay these instances (name -> its metrics store; empty: none), one curve each
        on per-instance plots after the others, while "Fleet instances" is ticked."""
        self.instances = dict(stores)
        self.instances_box.setVisible(bool(stores))
        self._redraw()

    def _overlaid(self) -> tuple[str, ...]:
        """The instances drawn: all of them once any has a point (a fleet file only opened
        adds no empty row of plots), while the box is ticked."""
        shown = self.instances_box.isChecked() and any(len(s) for s in self.instances.values())
        return tuple(self.instances) if shown else ()

    def _redraw(self) -> None:
        self._drawn_version = -1
        self.refresh(force=self.isVisible())

    def _version(self) -> Any:
        """What the plots show changes only when one of these does."""
        return (
            self._shown.key,
            self.store.version,
            self.timeline.version,
            self.spans,
            *(s.version for s in self.instances.values()),
        )

    def _draw_instances(self, width: int) -> None:
        """Each instance's curves on one time axis: now is the newest point of any."""
        lasts = [s.last_t for s in self.instances.values() if s.last_t is not None]
        now = max(lasts, default=0.0)
        series = list(INSTANCE_PLOTS.values())
        for name, key, curve in self._instance_curves:
            store = self.instances.get(name)
            last = store.last_t if store is not None else None
            if store is None or last is None:
                curve.setData([], [])
                continue
            t, cols = store.window(self.window_s + (now - last), series, max_points=2 * width)
            t, cols = with_gaps(t, cols)
            curve.setData(t + (last - now), cols.get(key, np.full(len(t), np.nan)))

    # -- the source ---------------------------------------------------------------------------
    def follow(self, controller: Any) -> None:
        """Take a :class:`~quantdeck.gui.server_control.QtServerController`'s samples, markers
        and states (the panel subscribes itself: the window does not relay)."""
        controller.metrics.connect(self.add_event)
        controller.event.connect(self._on_server_event)

    def _on_server_event(self, ev: Event) -> None:
        match ev:
            case MarkerEvent(what="launch"):  # a start from the Launch tab: its server's
                self.follow_source(SERVER_SOURCE, "this panel's server")
                self.add_event(ev)
            case MarkerEvent():
                self.add_event(ev)
            case StateEvent(state="attached", url=url):
                self.follow_source(f"url {url}", f"attached {url}")
                self.set_source_state("attached", ev.t)
            case StateEvent(state=state):
                self.set_source_state(state, ev.t)
                self._live.timeline.observe(ev)  # a launch that crashed before ready

    @property
    def store(self) -> TimeSeriesStore:
        """The samples the plots show (the shown source's)."""
        return self._shown.store

    @property
    def timeline(self) -> Timeline:
        """The markers the plots show (the shown source's)."""
        return self._shown.timeline

    def follow_source(self, key: str, label: str) -> MonitorSource:
        """Feed (and show) the source ``key`` from now on, made on first use; the others keep
        their samples and markers, and stay in the source list."""
        src = self.sources.get(key)
        if src is not self._live:  # the alerts were of the source followed until now
            self._end_alerts(f"{self._live.label} no longer followed", time.time())
        if src is None:
            src = MonitorSource(key, label, TimeSeriesStore(self._live.store.capacity))
            self.sources[key] = src
            self.source_box.addItem(label, key)
        self._live = src
        self.source_box.setVisible(len(self.sources) > 1)
        self.source_box.setCurrentIndex(self.source_box.findData(key))  # shows it
        return src

    def _on_source_chosen(self, index: int) -> None:
        src = self.sources.get(self.source_box.itemData(index))
        if src is None or src is self._shown:
            return
        self.compare_button.setChecked(False)  # spans belong to a source's samples
        self._shown = src
        self._manual_y.clear()
        self._redraw()

    def set_source_state(self, state: str, t: float | None = None) -> None:
        """The live source moved to ``state`` (the server's: starting, ready, stopped...) at
        ``t``: the cue above the plots follows."""
        when = time.time() if t is None else t
        before, self._live.state = self._live.state, (state, when)
        self._update_source_cue()
        if state not in ENDED_STATES:
            self._ended_at = None
        elif before is not None and before[0] not in ENDED_STATES:
            # its alerts end with it: what it read last is not of now any more
            self._ended_at = when
            self._end_alerts(f"server {state}", when)

    def _end_alerts(self, why: str, t: float) -> None:
        """The live source's life ended: its active alerts end (listed, each with why), the
        banner goes."""
        ended = self.alerts.end_all(why, t) if self.live else []
        for alert in ended:
            self.alert.emit(alert.text())  # the Logs tab has it too
        self._show_banner("")
        if ended:
            self.alerts_changed.emit()

    def _update_source_cue(self) -> None:
        text = source_cue(self._shown, self._live, time.time()) if self.live else ""
        if text != self.source_state.text():
            self.source_state.setText(text)
            self.source_state.setVisible(bool(text))

    def refresh(self, force: bool = False) -> None:
        """Redraw from the store if it changed and the tab is shown (the QTimer's slot);
        ``force`` draws a hidden panel too (exports, tests)."""
        self._update_source_cue()
        # alerts are judged on every new live sample, whatever tab is shown (the badges on
        # the Monitor tab and the status bar are for when the plots are not in view)
        if self._live.store.version != self._alerts_seen:
            self._alerts_seen = self._live.store.version
            self._check_alerts()
        version = self._version()
        if self.paused or version == self._drawn_version:
            return
        if not force and not self.isVisible():
            return
        if self.store.num_gpus != self._gpus_drawn or self._overlaid() != self._instances_drawn:
            self._build_plots(self.store.num_gpus)
        self._drawn_version = version
        # two points per pixel of the plots' width (peak decimation keeps spikes)
        width = max([200] + [int(p.vb.width()) for p in self.plots.values()])
        t, cols = self.store.window(self.window_s, list(self.curves), max_points=2 * width)
        t, cols = with_gaps(t, cols)
        for name, curve in self.curves.items():
            y = cols.get(name)
            if y is not None:
                curve.setData(t, y)  # all NaN: an empty path
            elif len(curve.yData):
                curve.setData([], [])
        self._draw_instances(width)
        self._draw_timeline()
        for title, p in self.plots.items():
            if title not in self._manual_y:
                self._fit_y(title, p)
        self._sync_axes(force)

    def _sync_axes(self, force: bool = False) -> None:
        """Draw the axes that changed, one per turn of the event loop (a few ms each, the
        text being the slow part: a first show or a resize changes all of them at once);
        ``force``: all now (exports). A hidden panel waits for its show, which resizes it."""
        self._axes_timer.stop()
        if not force and not self.isVisible():
            return
        stale = [a for a in self._axes if a.axis.picture is None]
        ratio = self.graphics.devicePixelRatioF()
        for axis in stale if force else stale[:1]:
            axis.sync(ratio)
        if not force and len(stale) > 1:
            self._axes_timer.start()

    def showEvent(self, ev: Any) -> None:
        super().showEvent(ev)
        self._sync_axes_soon()

    def _sync_axes_soon(self, *_: Any) -> None:
        """After a range or size change (a zoom, a resize) outside :meth:`refresh`: once, when
        the layout has settled."""
        if not self._axes_timer.isActive():
            self._axes_timer.start()

    def _fit_y(self, title: str, p: pg.PlotItem, force: bool = False) -> None:
        """Y range from the curves' data: a percent plot shows 0-100, a plot of figures that
        are never negative (counts, rates, memory, latency) starts at 0, with headroom above
        the data and the legend's rows above that (a legend never hides a curve). It changes
        (and the axis redraws its ticks) only when the data leaves it or fills less than half
        of it."""
        bounds = [c.bounds for c in self._plot_curves[title] if c.isVisible() and c.bounds]
        if not bounds:
            return
        lo, hi = min(b[0] for b in bounds), max(b[1] for b in bounds)
        axis = p.getAxis("left")
        percent = "%" in title and lo >= 0 and hi <= 100
        if isinstance(axis, PercentAxis) and axis.capped != percent:
            axis.capped = percent
            axis.picture = None  # its ticks drawn again
        if percent:
            lo, hi = 0.0, 100.0
        elif lo >= 0:
            lo, hi = 0.0, (hi * 1.05 if hi > 0 else 1.0)
        elif hi > lo:
            lo, hi = lo - 0.05 * (hi - lo), hi + 0.05 * (hi - lo)
        else:  # a negative constant: centred, as pyqtgraph shows one
            lo, hi = lo - abs(lo) * 0.05, hi + abs(lo) * 0.05
        legend = self._legends.get(title)
        height = p.vb.height()
        if legend is not None and legend.isVisible() and height > 0:
            self._fit_legend(title, legend, p.vb.width(), height)
            # the legend's rows are a share of the plot's height: the range grows by it
            share = min(0.4, (legend.boundingRect().height() + 14) / height)
            hi = lo + (hi - lo) / (1 - share)
        y0, y1 = p.vb.viewRange()[1]
        if force or lo != y0 or hi > y1 or (y1 - y0) > 2 * (hi - lo):
            p.setYRange(lo, hi, padding=0)

    def _fit_legend(
        self, title: str, legend: QGraphicsPixmapItem, width: float, height: float
    ) -> None:
        """Draw the legend in as many columns as it takes for its rows to stay within the
        share of the plot's height the y range gives them (a short plot: six rows in one
        column ran past its bottom and were cut), as long as the columns fit the width."""
        curves = self._plot_curves[title]
        entry_w, row_h = self._legend_entries[title]
        columns = 1
        while (
            columns < len(curves)
            and -(-len(curves) // columns) * row_h + 14 > 0.4 * height
            and (columns + 1) * entry_w + 26 <= width
        ):
            columns += 1
        if self._legend_columns.get(title, 1) != columns:
            self._legend_columns[title] = columns
            legend.setPixmap(legend_image(curves, self.graphics.devicePixelRatioF(), columns))

    def _legend_rect(self, plot: pg.PlotItem) -> QRectF | None:
        """Where ``plot``'s legend is, in its view box's pixels (None: hidden or none)."""
        for title, p in self.plots.items():
            legend = self._legends.get(title)
            if p is plot and legend is not None and legend.isVisible():
                return legend.mapRectToParent(legend.boundingRect())
        return None

    def _on_legends_toggled(self, on: bool) -> None:
        for legend in self._legends.values():
            legend.setVisible(on)
        for title, p in self.plots.items():  # the legends' rows given or taken back
            if title in self._plot_curves and title not in self._manual_y:
                self._fit_y(title, p, force=True)
        self._draw_timeline()  # the marker labels the legends pushed down come back up

    def add_event(self, ev: Event) -> None:
        """Feed one event (live or replayed); plots update on the next timer tick. Markers,
        and a fleet's fallback switches, go to the timeline."""
        if not isinstance(ev, MetricsEvent):
            self._live.timeline.observe(ev)
            return
        self._live.store.append(ev)
        text = f"monitoring: {ev.error[:300]}" if ev.error else ""
        if text != self.problem.text():
            self.problem.setText(text)
            self.problem.setVisible(bool(text))

    # -- the tuning timeline -----------------------------------------------------------------
    def mark_bench(self, result: Any) -> None:
        """A benchmark run ended (its saved figures): a marker on the live source's timeline."""
        self._live.timeline.bench(result)

    def clear_history(self) -> None:
        """Forget the shown source's samples and markers."""
        self.compare_button.setChecked(False)
        self.store.clear()
        self.timeline.clear()

    def _draw_timeline(self) -> None:
        now = self.store.last_t
        if now is None:
            self.marker_lines.clear()
            return
        self.marker_lines.draw(
            self.timeline, list(self.plots.values()), 3, now, keep_clear=self._legend_rect
        )
        if self.spans is not None:
            self._moving_regions = True
            try:
                for _, before, after in self._regions:
                    before.setRegion((self.spans[0].t0 - now, self.spans[0].t1 - now))
                    after.setRegion((self.spans[1].t0 - now, self.spans[1].t1 - now))
            finally:
                self._moving_regions = False

    def _on_compare_changed(self, on: bool) -> None:
        if not on:
            self.spans = None
            self._remove_regions()
            self.compare_panel.hide()
            self._redraw()
            return
        try:
            before, after = default_spans(self.store, self.timeline)
        except QuantdeckError as e:
            self.problem.setText(str(e))
            self.problem.show()
            self.compare_button.setChecked(False)
            return
        self.set_spans(before, after)

    def set_spans(self, before: Span, after: Span) -> SpanComparison:
        """Compare these spans (unix seconds): the shaded regions and the table."""
        if not self.compare_button.isChecked():
            with QSignalBlocker(self.compare_button):
                self.compare_button.setChecked(True)
        self.spans = (before, after)
        if not self._regions:
            self._make_regions()
        cmp = compare_spans(self.store, before, after, self.timeline)
        self.compare_panel.show_comparison(cmp, self.timeline.markers)
        self.compare_panel.show()
        self._draw_timeline()  # the regions where the spans are, shown or not
        self._redraw()
        return cmp

    def comparison(self) -> SpanComparison | None:
        return self.compare_panel.comparison if self.spans is not None else None

    def _make_regions(self) -> None:
        self._remove_regions()
        for p in self.plots.values():
            regions = []
            for color in SPAN_COLORS:
                r = pg.LinearRegionItem(pen=pg.mkPen(color))
                c = QColor(color)
                c.setAlpha(SPAN_ALPHA)
                r.setBrush(pg.mkBrush(c))
                c.setAlpha(SPAN_HOVER_ALPHA)
                r.setHoverBrush(pg.mkBrush(c))
                r.setZValue(-50)
                r.sigRegionChangeFinished.connect(self._on_region_changed)
                p.addItem(r, ignoreBounds=True)
                regions.append(r)
            self._regions.append((p, regions[0], regions[1]))

    def _remove_regions(self) -> None:
        for p, before, after in self._regions:
            p.removeItem(before)
            p.removeItem(after)
        self._regions = []

    def _on_region_changed(self, region: pg.LinearRegionItem) -> None:
        """A span was dragged on one plot: the same span on every plot, the table again."""
        now = self.store.last_t
        if self._moving_regions or now is None or self.spans is None:
            return
        which = next(
            (i for _, *pair in self._regions for i, r in enumerate(pair) if r is region), None
        )
        if which is None:
            return
        lo, hi = region.getRegion()
        spans = list(self.spans)
        spans[which] = Span(now + float(lo), now + float(hi))
        self.set_spans(spans[0], spans[1])

    # -- controls ----------------------------------------------------------------------------
    def _on_window_changed(self, text: str) -> None:
        self.window_s = WINDOWS[text]
        for p in self.plots.values():
            p.setXRange(-self.window_s, 0, padding=0)
        self._manual_y.clear()
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
        self._check_alerts()
        self.slo_changed.emit({"ttft": self.ttft_limit.value()})

    def _check_alerts(self) -> None:
        if not self.live:  # a recording's thresholds are history, not alerts of now
            return
        if self._ended_at is not None and (self._live.store.last_t or 0.0) <= self._ended_at:
            return  # its last readings are not of now (a limit changed after the stop)
        checks = (
            ("ttft", "ttft_p99_ms", self.ttft_limit.value(), "p99 TTFT {v:.0f} ms > {lim:.0f} ms"),
            ("kv", "kv_usage_pct", self.kv_limit.value(), "KV-cache usage {v:.1f}% > {lim:.0f}%"),
            ("kv_full", "kv_usage_pct", KV_ALERT_PCT, "KV cache {v:.1f}% full (≥ {lim:.0f}%)"),
            ("preempt", "preemptions_per_s", 0.0, "preempting {v:.1f} requests/s"),
        )
        slo = [
            (
                f"slo_{k}",
                f"{k}_slo_pct",
                SLO_ALERT_PCT,
                f"{k.upper()} SLO met by {{v:.1f}}% < {{lim:.0f}}%",
            )
            for k in ("ttft", "itl", "e2e")
        ]
        messages = []
        live = self._live.store  # alerts are of now: the live source's, whatever is shown
        t = live.last_t or time.time()  # the sample's time: the reading's own
        version = self.alerts.version
        for key, series, lim, fmt in (*checks, *slo):
            v = live.latest(series)
            if key.startswith("slo_"):
                over = v is not None and v < lim
            elif key == "preempt":
                over = v is not None and v > 0
            else:
                over = lim > 0 and v is not None and (v >= lim if key == "kv_full" else v > lim)
            text = fmt.format(v=v, lim=lim) if over else ""
            changed = self.alerts.update(key, over, text, t)
            if changed is not None:  # raised or cleared: the Logs tab has it too
                self.alert.emit(changed.text())
            if over:
                messages.append(text)
        self._show_banner("⚠ " + " · ".join(messages) if messages else "")
        if self.alerts.version != version:
            self.alerts_changed.emit()

    def _show_banner(self, text: str) -> None:
        """The alerts of now in the banner (empty: none). Hidden, it keeps its row for
        ``BANNER_HOLD_S``, so that an alert that flaps does not move the plots each time."""
        if text:
            self._banner_hold.stop()
            self._keep_banner_row(True)
            if text != self.banner.text():
                self.banner.setText(text)
            self.banner.show()
        elif not self.banner.isHidden():
            self.banner.hide()
            self._banner_hold.start()

    def _keep_banner_row(self, keep: bool) -> None:
        policy = self.banner.sizePolicy()
        if policy.retainSizeWhenHidden() != keep:
            policy.setRetainSizeWhenHidden(keep)
            self.banner.setSizePolicy(policy)  # lays the panel out again

    def acknowledge_alerts(self) -> int:
        """The operator has seen them: the badge goes (active alerts stay listed)."""
        n = self.alerts.acknowledge_all()
        if n:
            self.alerts_changed.emit()
        return n

    # -- export ------------------------------------------------------------------------------
    def export_png(self, path: str | Path) -> None:
        self.refresh(force=True)
        self.graphics.grab().save(str(path))

    def export_csv(self, path: str | Path) -> int:
        return self.store.to_csv(path)

    def _ask_export(self, kind: str) -> None:
        path, _ = QFileDialog.getSaveFileName(
            self, f"Export {kind.upper()}", f"monitor.{kind}", f"{kind.upper()} (*.{kind})"
        )
        if path:
            (self.export_png if kind == "png" else self.export_csv)(path)

    def data_of(self, name: str) -> np.ndarray:
        """The y-data a curve shows now (for tests and exports)."""
        _, y = self.curves[name].getData()
        return np.asarray(y if y is not None else [])
