"""The Plots page's graphics items, drawn by Qt without calling into Python per frame: a curve
as a path, the grid as paths, an axis and a legend as pixmaps (pyqtgraph's own items run
several Python methods per item and frame; docs/performance.md)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyqtgraph as pg
from numpy.typing import NDArray
from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QFont, QFontMetrics, QPainter, QPainterPath, QPen, QPixmap
from PySide6.QtWidgets import QGraphicsItem, QGraphicsPathItem, QGraphicsPixmapItem


def blend(fg: QColor, alpha: float, bg: QColor) -> QColor:
    """The opaque colour of ``fg`` at ``alpha`` (0..1) over ``bg``: the raster engine draws
    opaque lines without reading the pixels under them, several times faster."""
    return QColor.fromRgbF(
        *(
            b + (f - b) * alpha
            for f, b in (
                (fg.redF(), bg.redF()),
                (fg.greenF(), bg.greenF()),
                (fg.blueF(), bg.blueF()),
            )
        )
    )


class Curve(QGraphicsPathItem):
    """One series as a path in data coordinates, which Qt draws without calling into Python
    (pyqtgraph's curve items run several Python methods per item and frame). It keeps the
    data it shows and its bounds."""

    def __init__(self, color: QColor, label: str) -> None:
        super().__init__()
        pen = QPen(color, 0)  # width 0: a cosmetic 1-px pen (wider or dashed pens are slow)
        self.setPen(pen)
        self.label = label
        self.xData: NDArray[np.float64] = np.empty(0)
        self.yData: NDArray[np.float64] = np.empty(0)
        self.bounds: tuple[float, float] | None = None  # y min, max; None: no finite data

    def setData(self, x: Any, y: Any) -> None:
        self.xData, self.yData = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
        with np.errstate(invalid="ignore"):
            lo = np.fmin.reduce(self.yData) if len(self.yData) else np.nan
            hi = np.fmax.reduce(self.yData) if len(self.yData) else np.nan
        self.bounds = None if np.isnan(lo) else (float(lo), float(hi))
        if self.bounds is None:  # nothing finite to show
            self.xData = self.yData = np.empty(0)
        self.setPath(
            pg.arrayToQPath(self.xData, self.yData, connect="finite")
            if self.bounds
            else QPainterPath()
        )

    def getData(self) -> tuple[np.ndarray, np.ndarray]:
        return self.xData, self.yData


class Grid:
    """The plot's grid as paths in data coordinates, at the axes' ticks and in the shade
    pyqtgraph's own grid gives them (which lives in each axis item: an axis then covers the
    whole plot and, cached, blends a plot-sized pixmap per axis on every frame), as opaque
    lines (:func:`blend`)."""

    ALPHA = 51  # pyqtgraph's grid alpha 0.2, in 0..255
    # a tick level whose lines differ from the background by less than this (of full scale)
    # is not drawn: pyqtgraph's finest level comes out 2 % off white, too faint to see, and
    # its dozens of lines per plot were a third of a frame
    FAINTEST = 0.03

    def __init__(self, plot: pg.PlotItem, background: QColor) -> None:
        self.plot = plot
        self.background = background
        self.items: list[QGraphicsPathItem] = []
        plot.vb.sigRangeChanged.connect(self.update)
        plot.vb.sigResized.connect(self.update)

    def update(self, *_: Any) -> None:
        vb = self.plot.vb
        (x0, x1), (y0, y1) = vb.viewRange()
        fg, bg = self.plot.getAxis("left").pen().color(), self.background
        contrast = max(
            abs(fg.redF() - bg.redF()), abs(fg.greenF() - bg.greenF()), abs(fg.blueF() - bg.blueF())
        )
        paths: list[tuple[int, QPainterPath]] = []
        for axis, lo, hi, px in (("bottom", x0, x1, vb.width()), ("left", y0, y1, vb.height())):
            if px <= 0 or hi <= lo:
                continue
            for i, (_, ticks) in enumerate(self.plot.getAxis(axis).tickValues(lo, hi, px)):
                alpha = 255 / (i + 1) * self.ALPHA / 255 * min(1.0, 0.05 * px / (len(ticks) + 1))
                if int(alpha) / 255 * fg.alphaF() * contrast < self.FAINTEST:
                    continue  # finer levels are fainter still
                path = QPainterPath()
                for v in ticks:
                    if lo <= v <= hi:
                        if axis == "bottom":
                            path.moveTo(v, y0)
                            path.lineTo(v, y1)
                        else:
                            path.moveTo(x0, v)
                            path.lineTo(x1, v)
                paths.append((int(alpha), path))
        while len(self.items) < len(paths):
            item = QGraphicsPathItem()
            item.setZValue(-100)  # under the curves
            vb.addItem(item, ignoreBounds=True)
            self.items.append(item)
        for n, item in enumerate(self.items):
            if n < len(paths):
                item.setPen(QPen(blend(fg, paths[n][0] / 255 * fg.alphaF(), bg), 0))
                item.setPath(paths[n][1])
            item.setVisible(n < len(paths))


class PercentAxis(pg.AxisItem):
    """A percent plot's left axis: ticks (and so grid lines) only from 0 to 100. The range
    above 100 is the legend's headroom, and a "150" there read as a possible value. ``capped``
    is off while the data leaves 0..100 (a CPU share over all cores, a zoom)."""

    capped = True

    def tickValues(self, minVal: float, maxVal: float, size: float) -> list[Any]:
        levels = super().tickValues(minVal, maxVal, size)
        if not self.capped:
            return levels
        return [(spacing, [v for v in values if 0 <= v <= 100]) for spacing, values in levels]


class AxisPixmap(QGraphicsPixmapItem):
    """A pyqtgraph axis shown as a pixmap child of it, drawn again only after the axis
    changed. The axis itself is marked as having no contents, so Qt neither paints it nor
    asks it (in Python) for its bounding rect on every frame. pyqtgraph drops its recorded
    ``picture`` on every change of range, size or style and redraws it in ``paint``:
    :meth:`sync` does that ``paint`` into the pixmap when the picture is gone."""

    def __init__(self, axis: pg.AxisItem) -> None:
        super().__init__(axis)
        self.axis = axis
        axis.setFlag(QGraphicsItem.GraphicsItemFlag.ItemHasNoContents, True)

    def sync(self, ratio: float) -> None:
        if self.axis.picture is not None:
            return
        br = self.axis.boundingRect()
        pm = QPixmap(
            max(1, int(np.ceil(br.width() * ratio))), max(1, int(np.ceil(br.height() * ratio)))
        )
        pm.setDevicePixelRatio(ratio)
        pm.fill(Qt.GlobalColor.transparent)
        qp = QPainter(pm)
        qp.translate(-br.topLeft())
        self.axis.paint(qp, None, None)  # records a new picture and plays it
        qp.end()
        self.setPixmap(pm)
        self.setPos(br.topLeft())


def legend_font() -> QFont:
    font = QFont()
    font.setPointSizeF(7)
    return font


def legend_entry(curves: list[Curve]) -> tuple[int, int]:
    """The width and height of one legend entry (a column's width, a row's height)."""
    fm = QFontMetrics(legend_font())
    row = fm.height() + 2  # compact: the y range leaves the legend its rows above the data
    return 26 + max(fm.horizontalAdvance(c.label) for c in curves) + 8, row


def legend_image(curves: list[Curve], ratio: float, columns: int = 1) -> QPixmap:
    """The plot's legend: a 20-px line in the curve's pen and its label per entry, as
    pyqtgraph's LegendItem draws them (which is a dozen Python items per plot), in
    ``columns`` columns filled down first (a short plot gets a wider, flatter legend)."""
    font = legend_font()
    w, row = legend_entry(curves)
    rows = -(-len(curves) // columns)
    pm = QPixmap(int(w * columns * ratio), int(row * rows * ratio))
    pm.setDevicePixelRatio(ratio)
    pm.fill(Qt.GlobalColor.transparent)
    qp = QPainter(pm)
    qp.setFont(font)
    for i, c in enumerate(curves):
        x, y = (i // rows) * w, (i % rows) * row
        qp.setPen(QPen(c.pen().color(), 1))
        qp.drawLine(x, y + row // 2, x + 20, y + row // 2)
        qp.setPen(pg.mkColor(pg.getConfigOption("foreground")))
        qp.drawText(
            x + 26,
            y,
            w - 26,
            row,
            int(Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter),
            c.label,
        )
    qp.end()
    return pm


def legend_pixmap(curves: list[Curve], ratio: float) -> QGraphicsPixmapItem:
    """The legend as an item above the curves, in one column (see :func:`legend_image`)."""
    item = QGraphicsPixmapItem(legend_image(curves, ratio))
    item.setZValue(1000)  # above the curves
    return item
