"""Two spans of the Plots page's shown source compared: the Compare spans button, a pair of
shaded regions on every plot (drag one: every plot follows, the table again), and the table
under the plots (:class:`~quantdeck.gui.monitor.timeline.ComparePanel`)."""

from __future__ import annotations

from typing import Protocol

import pyqtgraph as pg
from PySide6.QtCore import QSignalBlocker
from PySide6.QtGui import QColor
from PySide6.QtWidgets import QLabel, QPushButton, QSplitter

from quantdeck.core.errors import QuantdeckError
from quantdeck.core.monitor import TimeSeriesStore
from quantdeck.core.monitor.timeline import (
    Span,
    SpanComparison,
    Timeline,
    compare_spans,
    default_spans,
)
from quantdeck.gui.monitor.timeline import ComparePanel
from quantdeck.gui.style import SPAN_ALPHA, SPAN_COLORS, SPAN_HOVER_ALPHA


class SpanHost(Protocol):
    """What a comparison needs of the Plots page it is part of."""

    plots: dict[str, pg.PlotItem]
    problem: QLabel  # where a comparison that cannot be made says why

    @property
    def store(self) -> TimeSeriesStore: ...

    @property
    def timeline(self) -> Timeline: ...

    def redraw(self) -> None: ...

    def draw_timeline(self) -> None: ...


class CompareSpans:
    """The span comparison of a Plots page (``host``): off until the button is pressed."""

    def __init__(self, host: SpanHost) -> None:
        self.host = host
        self.spans: tuple[Span, Span] | None = None
        # (plot, before, after) for every plot while spans are compared
        self.regions: list[tuple[pg.PlotItem, pg.LinearRegionItem, pg.LinearRegionItem]] = []
        self._moving_regions = False
        self.button = QPushButton("Compare spans")
        self.button.setCheckable(True)
        self.button.setToolTip(
            "Two spans side by side (throughput, TTFT/ITL, KV use, prefix hits) and the "
            "launches, knob changes, fleet switches and benchmark runs between them; they start "
            "either side of your latest change (launch, knob change, restart, fleet switch), "
            "equally long, the one after at the load nearest the one before"
        )
        self.button.toggled.connect(self._on_compare_changed)
        self.panel = ComparePanel()
        self.panel.hide()

    def _on_compare_changed(self, on: bool) -> None:
        host = self.host
        if not on:
            self.spans = None
            self._remove_regions()
            self.panel.hide()
            host.redraw()
            return
        try:
            before, after = default_spans(host.store, host.timeline)
        except QuantdeckError as e:
            host.problem.setText(str(e))
            host.problem.show()
            self.button.setChecked(False)
            return
        self.set_spans(before, after)

    def set_spans(self, before: Span, after: Span) -> SpanComparison:
        """Compare these spans (unix seconds): the shaded regions and the table."""
        host = self.host
        if not self.button.isChecked():
            with QSignalBlocker(self.button):
                self.button.setChecked(True)
        self.spans = (before, after)
        if not self.regions:
            self.make_regions()
        cmp = compare_spans(host.store, before, after, host.timeline)
        self.panel.show_comparison(cmp, host.timeline.markers)
        if self.panel.isHidden():
            self.panel.show()
            self._make_room()
        host.draw_timeline()  # the regions where the spans are, shown or not
        host.redraw()
        return cmp

    def _make_room(self) -> None:
        """The table's every row shown as the comparison opens: the splitter it shares with the
        plots gives it its height, the plots keeping at least their own minimum (a smaller
        window: the table scrolls; the operator moves the line either way)."""
        split = self.panel.parentWidget()
        if not isinstance(split, QSplitter) or split.count() != 2:
            return
        split.refresh()  # the panel just shown: its handle and share counted
        sizes = split.sizes()
        total = sum(sizes)
        if total <= 0:
            return
        i = split.indexOf(self.panel)
        plots = split.widget(1 - i)
        keep = plots.minimumHeight() if plots is not None else 0
        want = min(self.panel.sizeHint().height(), total - keep)
        if want > sizes[i]:
            sizes[i], sizes[1 - i] = want, total - want
            split.setSizes(sizes)

    def comparison(self) -> SpanComparison | None:
        return self.panel.comparison if self.spans is not None else None

    def make_regions(self) -> None:
        """The two regions on each of the host's plots (again after the plots were built)."""
        self._remove_regions()
        for p in self.host.plots.values():
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
            self.regions.append((p, regions[0], regions[1]))

    def _remove_regions(self) -> None:
        for p, before, after in self.regions:
            p.removeItem(before)
            p.removeItem(after)
        self.regions = []

    def place_regions(self, now: float) -> None:
        """The regions where the spans are on the plots' time axis (seconds before ``now``)."""
        if self.spans is None:
            return
        self._moving_regions = True
        try:
            for _, before, after in self.regions:
                before.setRegion((self.spans[0].t0 - now, self.spans[0].t1 - now))
                after.setRegion((self.spans[1].t0 - now, self.spans[1].t1 - now))
        finally:
            self._moving_regions = False

    def _on_region_changed(self, region: pg.LinearRegionItem) -> None:
        """A span was dragged on one plot: the same span on every plot, the table again."""
        now = self.host.store.last_t
        if self._moving_regions or now is None or self.spans is None:
            return
        which = next(
            (i for _, *pair in self.regions for i, r in enumerate(pair) if r is region), None
        )
        if which is None:
            return
        lo, hi = region.getRegion()
        spans = list(self.spans)
        spans[which] = Span(now + float(lo), now + float(hi))
        self.set_spans(spans[0], spans[1])
