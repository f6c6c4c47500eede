"""The Monitor's Plots page: live pyqtgraph plots over a
:class:`quantdeck.core.monitor.timeseries.TimeSeriesStore`.

Curves are created once and updated from one QTimer (10 Hz), only when the store changed, with
peak-decimated data (about two points per pixel) that the store keeps ready for long windows.
Frames are cheap because Qt draws them without calling into Python per item
(:mod:`quantdeck.gui.monitor.plot_items`): curves, grid, axes and legends are plain Qt path /
pixmap items, text is cached as pixmaps, and the ranges are set by
:mod:`~quantdeck.gui.monitor.plot_grid` (pyqtgraph's autorange scans every curve on every
update). Live events and replayed recordings feed the same store, so a recording from a GPU host
looks exactly as if live. What is plotted is :mod:`~quantdeck.gui.monitor.charts`; where it comes
from, :mod:`~quantdeck.gui.monitor.sources`. The page's features are parts it owns: its alerts
(:mod:`~quantdeck.gui.monitor.alerting`), two spans compared
(:mod:`~quantdeck.gui.monitor.spans`), a fleet's instances overlaid
(:mod:`~quantdeck.gui.monitor.instances`).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QFileDialog,
    QGraphicsItem,
    QLabel,
    QPushButton,
    QSplitter,
    QVBoxLayout,
    QWidget,
)

from quantdeck.core.events import Event, MarkerEvent, MetricsEvent, StateEvent, TrialEvent
from quantdeck.core.monitor import TimeSeriesStore
from quantdeck.core.monitor.timeline import Span, SpanComparison, Timeline
from quantdeck.gui.flow import FlowLayout, group
from quantdeck.gui.monitor.alerting import PanelAlerts
from quantdeck.gui.monitor.charts import PLOTS, WINDOWS, gpu_plots, with_gaps
from quantdeck.gui.monitor.instances import InstanceOverlay
from quantdeck.gui.monitor.plot_grid import PlotGrid
from quantdeck.gui.monitor.plot_items import Curve, blend
from quantdeck.gui.monitor.sources import (
    SERVER_SOURCE,
    MonitorSource,
    instance_key,
    instance_label,
    source_cue,
)
from quantdeck.gui.monitor.spans import CompareSpans
from quantdeck.gui.monitor.timeline import MarkerLines
from quantdeck.gui.style import CUE_SHEET, P99_SHADE, PLOT_BACKGROUND, PROBLEM_SHEET, SERIES_COLORS

if TYPE_CHECKING:
    from quantdeck.core.bench.results import RunResult


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
        # the fleet instances the next attach to their URL is (url -> fleet file, name)
        self._expected: dict[str, tuple[str, str]] = {}
        # each fleet's instances (fleet file -> name -> store), its instance sources' overlay
        self._fleets: dict[str, dict[str, TimeSeriesStore]] = {}
        # the shown source's fleet instances, each its own store (fed by the Fleet tab, or
        # replayed), overlaid on a row of plots while "Fleet instances" is ticked
        self.overlay = InstanceOverlay()
        self._drawn_version: Any = -1
        self._gpus_drawn = -1
        self.paused = False
        self.window_s = 60.0
        self.curves: dict[str, Curve] = {}
        # the plots, their y ranges, legends and axes
        self.grid = PlotGrid(self)
        self.graphics = self.grid.graphics
        self.plots = self.grid.plots
        self._plot_curves = self.grid.plot_curves  # each plot's curves, by title (tests read it)
        # the alerts, of the live source whatever is shown: limits, banner, log
        self.alerting = PanelAlerts(lambda: self._live.store, self, live=live)
        self.alerts = self.alerting.log  # the Alerts page lists them
        self.ttft_limit = self.alerting.ttft_limit
        self.kv_limit = self.alerting.kv_limit
        self.banner = self.alerting.banner
        self.alerting.alert.connect(self.alert)
        self.alerting.changed.connect(self.alerts_changed)
        self.alerting.slo_changed.connect(self.slo_changed)

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
        self.instances_box = self.overlay.box
        self.instances_box.toggled.connect(lambda _: self.redraw())
        self.png_button = QPushButton("Export PNG…")
        self.csv_button = QPushButton("Export CSV…")
        self.open_button = QPushButton("Open recording…")
        self.png_button.clicked.connect(lambda: self._ask_export("png"))
        self.csv_button.clicked.connect(lambda: self._ask_export("csv"))
        limits = self.alerting.limits
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
        self.compare = CompareSpans(self)
        self.compare_button = self.compare.button
        self.compare_panel = self.compare.panel
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
        # why the last sample lacks figures (the sampler goes on; this says what it misses)
        self.problem = QLabel()
        self.problem.setStyleSheet(PROBLEM_SHEET)
        self.problem.setWordWrap(True)
        self.problem.hide()
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
        self.grid.clear()
        self.curves.clear()
        spec = dict(PLOTS)
        if gpus:
            spec = {**gpu_plots(gpus), **{k: v for k, v in PLOTS.items() if k != "Host CPU %"}}
        legends = self.legend_box.isChecked()
        for n, (title, series) in enumerate(spec.items()):
            if n and n % 3 == 0:
                self.graphics.nextRow()
            p = self.grid.add_plot(title, self.window_s)
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
            self.grid.finish_plot(title, p, curves, legends)
        self.overlay.build(self.grid, len(spec), self.window_s, legends)
        self.graphics.ci.setFlag(QGraphicsItem.GraphicsItemFlag.ItemHasNoContents, True)
        self.alerting.add_lines(self.plots)
        self._gpus_drawn = gpus
        self.marker_lines = MarkerLines()  # the old plots went with their lines
        if self.compare.spans is not None:
            self.compare.make_regions()

    # -- a fleet's instances -----------------------------------------------------------------
    def set_instances(self, stores: dict[str, TimeSeriesStore], fleet: str | None = None) -> None:
        """Overlay these instances (name -> its metrics store; empty: none), one curve each
        on per-instance plots after the others, while "Fleet instances" is ticked: on the
        sources of ``fleet``'s instances (its file; those to come too), or on the live source
        (None). An overlay belongs to its source: another source shown, it goes."""
        if fleet is None:
            self._live.instances = dict(stores)
        else:
            self._fleets[fleet] = dict(stores)
            for src in self.sources.values():
                if src.fleet == fleet:
                    src.instances = self._fleets[fleet]
        self.overlay.set_stores(self._shown.instances)
        self.redraw()

    @property
    def instances(self) -> dict[str, TimeSeriesStore]:
        """The fleet's instances overlaid on the shown source (name -> its metrics store)."""
        return self._shown.instances

    def expect_instance(self, url: str, fleet: str, name: str) -> None:
        """The next attach to ``url`` is instance ``name`` of the fleet in file ``fleet`` (the
        Fleet tab chose it, or a promotion moved it there): the Monitor follows the
        instance's own source, whatever URL it served at before."""
        self._expected[url.rstrip("/")] = (fleet, name)

    def follow_instance(self, fleet: str, name: str) -> MonitorSource:
        """Feed (and show) instance ``name`` of ``fleet``'s source, with its fleet's overlay."""
        src = self.follow_source(instance_key(fleet, name), instance_label(fleet, name), fleet)
        self.overlay.set_stores(self._shown.instances)
        return src

    def instance_state(self, fleet: str, name: str, ev: StateEvent, *, follow: bool) -> None:
        """Instance ``name`` of ``fleet`` moved to ``ev``'s state (its fleet says so, whatever
        the scrape of its URL reads): on its source's cue and alerts while it is the source
        followed; ``follow``: made the source followed first (nothing else is)."""
        if self._live.key != instance_key(fleet, name):
            if not follow:
                return
            self.follow_instance(fleet, name)
        self.set_source_state(ev.state, ev.t)

    def add_instance_event(self, fleet: str, name: str, ev: Event) -> MarkerEvent | None:
        """A fleet instance's event: a live trial's start, promotion, rollback or undo marks
        the instance's source (where it has one), whichever source is followed."""
        from quantdeck.core.fleet.rows import trial_marker

        src = self.sources.get(instance_key(fleet, name))
        marker = trial_marker(ev) if isinstance(ev, TrialEvent) else None
        return src.timeline.add(marker) if src is not None and marker is not None else None

    def redraw(self) -> None:
        """Draw again now (shown) or when next shown, whether or not the data changed."""
        self._drawn_version = -1
        self.refresh(force=self.isVisible())

    def _version(self) -> Any:
        """What the plots show changes only when one of these does."""
        return (
            self._shown.key,
            self.store.version,
            self.timeline.version,
            self.compare.spans,
            *(s.version for s in self.instances.values()),
        )

    # -- the source ---------------------------------------------------------------------------
    def follow(self, controller: Any) -> None:
        """Take a :class:`~quantdeck.gui.server_control.QtServerController`'s samples, markers
        and states (the panel subscribes itself: the window does not relay)."""
        controller.metrics.connect(self.add_event)
        controller.event.connect(self.add_server_event)

    def add_server_event(self, ev: Event) -> None:
        match ev:
            case MarkerEvent(what="launch"):  # a start from the Launch tab: its server's
                self.follow_source(SERVER_SOURCE, "this panel's server")
                self.add_event(ev)
            case MarkerEvent():
                self.add_event(ev)
            case StateEvent(state="attached", url=url):
                found = self._expected.pop(url.rstrip("/"), None) if isinstance(url, str) else None
                if found is not None:  # a fleet's instance: its own source, across URLs
                    self.follow_instance(*found)
                else:
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

    def follow_source(self, key: str, label: str, fleet: str | None = None) -> MonitorSource:
        """Feed (and show) the source ``key`` from now on, made on first use (``fleet``: a
        fleet instance's, its fleet file); the others keep their samples and markers, and stay
        in the source list."""
        src = self.sources.get(key)
        if src is not self._live:  # the alerts were of the source followed until now
            self.alerting.end(f"{self._live.label} no longer followed", time.time())
        if src is None:
            store = TimeSeriesStore(self._live.store.capacity)
            src = MonitorSource(key, label, store, fleet=fleet)
            src.instances = self._fleets.get(fleet, {}) if fleet is not None else {}
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
        self.overlay.set_stores(src.instances)  # an overlay goes with its source
        self.grid.manual_y.clear()
        self.redraw()

    def drop_source(self, key: str) -> None:
        """Forget source ``key`` unless it is fed or shown (a fleet's replay has no server of
        its own to show)."""
        src = self.sources.get(key)
        if src is None or src is self._live or src is self._shown:
            return
        del self.sources[key]
        self.source_box.removeItem(self.source_box.findData(key))
        self.source_box.setVisible(len(self.sources) > 1)

    def set_source_state(self, state: str, t: float | None = None) -> None:
        """The live source moved to ``state`` (the server's: starting, ready, stopped...) at
        ``t``: the cue above the plots follows."""
        when = time.time() if t is None else t
        before, self._live.state = self._live.state, (state, when)
        self._update_source_cue()
        self.alerting.follow_state(state, before, when)

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
        self.alerting.judge()
        version = self._version()
        if self.paused or version == self._drawn_version:
            return
        if not force and not self.isVisible():
            return
        if self.store.num_gpus != self._gpus_drawn or self.overlay.overlaid() != self.overlay.drawn:
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
        self.overlay.draw(self.window_s, width)
        self.draw_timeline()
        self.grid.fit()
        self.grid.sync_axes(force)

    def showEvent(self, ev: Any) -> None:
        super().showEvent(ev)
        self.grid.sync_axes_soon()

    def _on_legends_toggled(self, on: bool) -> None:
        self.grid.show_legends(on)  # the legends' rows given or taken back
        self.draw_timeline()  # the marker labels the legends pushed down come back up

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
    def mark_bench(self, result: RunResult) -> None:
        """A benchmark run ended: its marker on the live source's timeline."""
        from quantdeck.core.bench.results import bench_marker

        self._live.timeline.add(bench_marker(result))

    def clear_history(self) -> None:
        """Forget the shown source's samples and markers."""
        self.compare_button.setChecked(False)
        self.store.clear()
        self.timeline.clear()

    def draw_timeline(self) -> None:
        """The markers, and the compared spans, where they are on the plots' time axis."""
        now = self.store.last_t
        if now is None:
            self.marker_lines.clear()
            return
        self.marker_lines.draw(
            self.timeline, list(self.plots.values()), 3, now, keep_clear=self.grid.legend_rect
        )
        self.compare.place_regions(now)

    def set_spans(self, before: Span, after: Span) -> SpanComparison:
        """Compare these spans (unix seconds): the shaded regions and the table."""
        return self.compare.set_spans(before, after)

    def comparison(self) -> SpanComparison | None:
        return self.compare.comparison()

    # -- controls ----------------------------------------------------------------------------
    def _on_window_changed(self, text: str) -> None:
        self.window_s = WINDOWS[text]
        self.grid.set_window(self.window_s)
        self._drawn_version = -1
        self.refresh(force=True)

    def _on_pause_changed(self, paused: bool) -> None:
        self.paused = paused
        if not paused:
            self._drawn_version = -1
            self.refresh(force=True)

    def acknowledge_alerts(self) -> int:
        """The operator has seen them: the badge goes (active alerts stay listed)."""
        return self.alerting.acknowledge()

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
