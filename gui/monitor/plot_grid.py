"""The Plots page's grid of plots: each plot made cheap to draw, its y range fitted to its
curves with its legend's rows above them, and its axes drawn as pixmaps when they change.

The page builds the grid (which plots, which curves) and feeds the curves; this keeps what
frames cost low: pyqtgraph neither autoranges, clips nor downsamples, text is cached, and the
axes are drawn one per turn of the event loop (:mod:`quantdeck.gui.monitor.plot_items`)."""

from __future__ import annotations

from typing import Any

import pyqtgraph as pg
from PySide6.QtCore import QRectF, QTimer
from PySide6.QtGui import QFont, QFontMetrics
from PySide6.QtWidgets import QGraphicsItem, QGraphicsPixmapItem, QGraphicsView, QWidget

from quantdeck.gui.monitor.plot_items import (
    AxisPixmap,
    Curve,
    Grid,
    PercentAxis,
    legend_entry,
    legend_image,
    legend_pixmap,
)
from quantdeck.gui.style import PLOT_BACKGROUND


class PlotGrid:
    """The plots of ``view`` (the page: the grid draws its axes while it is shown), by title."""

    def __init__(self, view: QWidget) -> None:
        self.view = view
        self.graphics = pg.GraphicsLayoutWidget()
        self.graphics.setBackground(PLOT_BACKGROUND)
        # every frame changes every plot: one full repaint is cheaper than many update rects
        # (and than Qt's threaded blending of the many exposed pieces)
        self.graphics.setViewportUpdateMode(QGraphicsView.ViewportUpdateMode.FullViewportUpdate)
        self.plots: dict[str, pg.PlotItem] = {}
        self.plot_curves: dict[str, list[Curve]] = {}
        self.legends: dict[str, QGraphicsPixmapItem] = {}
        self.legend_columns: dict[str, int] = {}  # columns each legend is drawn in now
        self._legend_entries: dict[str, tuple[int, int]] = {}  # an entry's width, height
        self._grids: dict[str, Grid] = {}
        self.axes: list[AxisPixmap] = []
        self.manual_y: set[str] = set()  # plots whose y range the user zoomed: left alone
        self._axes_timer = QTimer(view)  # a child: it goes with the page
        self._axes_timer.setSingleShot(True)
        self._axes_timer.setInterval(0)
        self._axes_timer.timeout.connect(self.sync_axes)

    def clear(self) -> None:
        """No plot (before the grid is built again)."""
        self.graphics.clear()
        self.plots.clear()
        self.plot_curves.clear()
        self.legends.clear()
        self.legend_columns.clear()
        self._grids.clear()
        self.axes.clear()
        self.manual_y.clear()

    def add_plot(self, title: str, window_s: float) -> pg.PlotItem:
        """A plot of the last ``window_s`` seconds in the next cell; its curves are added to
        its view box, then :meth:`finish_plot`."""
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
        p.setXRange(-window_s, 0, padding=0)
        p.vb.sigRangeChangedManually.connect(lambda *_, title=title: self._zoomed(title))
        p.autoBtn.clicked.connect(lambda *_, title=title: self.manual_y.discard(title))
        p.setLabel("bottom", "s")
        p.setMouseEnabled(x=False, y=True)
        return p

    def _zoomed(self, title: str) -> None:
        """The operator zoomed ``title``'s y axis: its range is theirs until they press the
        plot's auto button, and a percent axis ticks every value they zoomed to."""
        self.manual_y.add(title)
        axis = self.plots[title].getAxis("left")
        if isinstance(axis, PercentAxis):
            axis.capped = False

    def finish_plot(self, title: str, p: pg.PlotItem, curves: list[Curve], legend: bool) -> None:
        """``p`` with its ``curves``: its legend (shown if ``legend``), grid and axes."""
        self.plot_curves[title] = curves
        pixmap = legend_pixmap(curves, self.graphics.devicePixelRatioF())
        self._legend_entries[title] = legend_entry(curves)
        pixmap.setParentItem(p.vb)
        pixmap.setPos(13, 12)  # where pyqtgraph's legend at offset (5, 5) draws
        pixmap.setVisible(legend)
        self.legends[title] = pixmap
        # text is slow to draw in the raster engine: axes and titles are kept as pixmaps,
        # redrawn only when they change, not on every frame of the curves (a parent's
        # cache does not cover its children: each item is set)
        for item in (p.getAxis("bottom").label, p.titleLabel, p.titleLabel.item):
            item.setCacheMode(QGraphicsItem.CacheMode.DeviceCoordinateCache)
        self.axes += [AxisPixmap(p.getAxis("left")), AxisPixmap(p.getAxis("bottom"))]
        p.vb.sigRangeChanged.connect(self.sync_axes_soon)
        p.vb.sigResized.connect(self.sync_axes_soon)
        # pyqtgraph's containers paint nothing themselves, but Qt asks each of them for its
        # (Python) bounding rect on every frame unless told they have no contents
        for item in (p, p.vb, p.titleLabel):
            item.setFlag(QGraphicsItem.GraphicsItemFlag.ItemHasNoContents, True)
        self.plots[title] = p
        self._grids[title] = Grid(p, pg.mkColor(PLOT_BACKGROUND))

    def set_window(self, window_s: float) -> None:
        """Every plot shows the last ``window_s`` seconds, its y range fitted again."""
        for p in self.plots.values():
            p.setXRange(-window_s, 0, padding=0)
        self.manual_y.clear()

    def sync_axes(self, force: bool = False) -> None:
        """Draw the axes that changed, one per turn of the event loop (a few ms each, the
        text being the slow part: a first show or a resize changes all of them at once);
        ``force``: all now (exports). A hidden page waits for its show, which resizes it."""
        self._axes_timer.stop()
        if not force and not self.view.isVisible():
            return
        stale = [a for a in self.axes if a.axis.picture is None]
        ratio = self.graphics.devicePixelRatioF()
        for axis in stale if force else stale[:1]:
            axis.sync(ratio)
        if not force and len(stale) > 1:
            self._axes_timer.start()

    def sync_axes_soon(self, *_: Any) -> None:
        """After a range or size change (a zoom, a resize) outside the page's refresh: once,
        when the layout has settled."""
        if not self._axes_timer.isActive():
            self._axes_timer.start()

    def fit(self) -> None:
        """Each plot's y range from its curves, but for those the operator zoomed."""
        for title, p in self.plots.items():
            if title not in self.manual_y:
                self.fit_y(title, p)

    def fit_y(self, title: str, p: pg.PlotItem, force: bool = False) -> None:
        """Y range from the curves' data: a percent plot shows 0-100, a plot of figures that
        are never negative (counts, rates, memory, latency) starts at 0, with headroom above
        the data and the legend's rows above that (a legend never hides a curve). It changes
        (and the axis redraws its ticks) only when the data leaves it or fills less than half
        of it."""
        bounds = [c.bounds for c in self.plot_curves[title] if c.isVisible() and c.bounds]
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
        legend = self.legends.get(title)
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
        curves = self.plot_curves[title]
        entry_w, row_h = self._legend_entries[title]
        columns = 1
        while (
            columns < len(curves)
            and -(-len(curves) // columns) * row_h + 14 > 0.4 * height
            and (columns + 1) * entry_w + 26 <= width
        ):
            columns += 1
        if self.legend_columns.get(title, 1) != columns:
            self.legend_columns[title] = columns
            legend.setPixmap(legend_image(curves, self.graphics.devicePixelRatioF(), columns))

    def legend_rect(self, plot: pg.PlotItem) -> QRectF | None:
        """Where ``plot``'s legend is, in its view box's pixels (None: hidden or none)."""
        for title, p in self.plots.items():
            legend = self.legends.get(title)
            if p is plot and legend is not None and legend.isVisible():
                return legend.mapRectToParent(legend.boundingRect())
        return None

    def show_legends(self, on: bool) -> None:
        """Show or hide every legend: the y ranges give their rows or take them back."""
        for legend in self.legends.values():
            legend.setVisible(on)
        for title, p in self.plots.items():
            if title in self.plot_curves and title not in self.manual_y:
                self.fit_y(title, p, force=True)
