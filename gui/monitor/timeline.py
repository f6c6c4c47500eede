"""The tuning timeline on the Monitor: its markers drawn on every plot, and the table of two
spans side by side (:func:`quantdeck.core.monitor.timeline.compare_spans`).

:class:`MarkerLines` keeps one vertical line per marker and plot (labelled on the top row of
plots; its tooltip is the marker's diff), moved to the plots' time axis (seconds before the
newest point) when the Monitor redraws; a fleet instance's live trial marks it where the trial
started, was promoted, rolled back or undone (:func:`quantdeck.core.fleet.rows.trial_marker`).
:class:`ComparePanel`
shows a comparison: before | after | change per figure, the change that separates the spans,
and Export (the HTML report, as ``quantdeck timeline --report`` writes it).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyqtgraph as pg
from PySide6.QtCore import QRectF, QSize, Qt
from PySide6.QtGui import QColor
from PySide6.QtWidgets import QFileDialog, QHBoxLayout, QPushButton, QVBoxLayout, QWidget

from quantdeck.core.errors import QuantdeckError
from quantdeck.core.events import MarkerEvent
from quantdeck.core.monitor.timeline import (
    MetricRow,
    SpanComparison,
    Timeline,
    describe,
    plain_number,
)
from quantdeck.gui.labels import plain_label
from quantdeck.gui.report import write_report
from quantdeck.gui.style import CAVEAT_SHEET, MARKER_COLORS, ORANGE, OTHER_MARKER, PURPLE
from quantdeck.gui.table_model import Column, ObjectTableModel, row_table

LABEL_CHARS = 24  # a marker's label on the plot; the tooltip has it whole
LABEL_TOP = 0.95  # the top row of labels: this far up the plot (0 bottom, 1 top)
LABEL_GAP = 2  # pixels between labels, and around a legend
MARKER_COLOR = {**MARKER_COLORS, "trial": ORANGE, "promoted": PURPLE, "undone": PURPLE}


def _num(v: float | None) -> str:
    return plain_number(v)


COMPARE_COLUMNS: tuple[Column[MetricRow], ...] = (
    Column("metric", lambda r: r.name, tooltip=lambda r: f"series {r.series}"),
    Column("before", lambda r: _num(r.before), align_right=True),
    Column("after", lambda r: _num(r.after), align_right=True),
    Column(
        "change",
        lambda r: r.change_text() + (f"  {r.verdict}" if r.verdict else ""),
        align_right=True,
    ),
)


class MarkerLines:
    """The timeline's markers as lines on a set of plots (rebuilt when the timeline or the
    plots change; only moved on other redraws)."""

    def __init__(self) -> None:
        self.items: list[tuple[MarkerEvent, pg.InfiniteLine, pg.PlotItem]] = []
        self._drawn: Any = None

    def clear(self) -> None:
        for _, line, plot in self.items:
            if line.scene() is not None:
                plot.removeItem(line)
        self.items = []
        self._drawn = None

    def draw(
        self,
        timeline: Timeline,
        plots: list[pg.PlotItem],
        labelled: int,
        now: float,
        keep_clear: Callable[[pg.PlotItem], QRectF | None] | None = None,
    ) -> None:
        """Lines for every marker on every plot (labels on the first ``labelled`` plots),
        at ``marker.t - now``. ``keep_clear(plot)``: a rectangle of the plot's view box (in
        its pixels: the legend) that no label may cover; a label that would goes under it."""
        key = (timeline.version, tuple(id(p) for p in plots))
        if key != self._drawn:
            self.clear()
            for n, p in enumerate(plots):
                for m in timeline.markers:
                    color = QColor(MARKER_COLOR.get(m.what, OTHER_MARKER))
                    label = (
                        m.label if len(m.label) <= LABEL_CHARS else m.label[: LABEL_CHARS - 1] + "…"
                    )
                    line = pg.InfiniteLine(
                        angle=90,
                        movable=False,
                        pen=pg.mkPen(color, width=1, style=Qt.PenStyle.DashLine),
                        label=label if n < labelled else None,
                        # where no other label is (place_labels); the tooltip has the
                        # whole label and the diff
                        labelOpts={"position": LABEL_TOP, "color": color},
                    )
                    line.setToolTip(describe(m))
                    line.setZValue(50)
                    p.addItem(line, ignoreBounds=True)
                    self.items.append((m, line, p))
            self._drawn = key
        labels: dict[int, list[tuple[float, Any]]] = {}  # per plot: (time, label)
        for m, line, plot in self.items:
            line.setValue(m.t - now)
            text = getattr(line, "label", None)
            if text is not None:
                labels.setdefault(id(plot), []).append((m.t - now, text))
        for plot in plots:
            if id(plot) in labels:
                clear = keep_clear(plot) if keep_clear is not None else None
                place_labels(plot, labels[id(plot)], clear)


def place_labels(plot: pg.PlotItem, labels: list[tuple[float, Any]], clear: QRectF | None) -> None:
    """Lay out one plot's marker ``labels`` ((x on its time axis, label)) so that none covers
    another, nor ``clear`` (the legend, in the view box's pixels). Each reads away from the
    nearer edge (never cut off), the newest first: it takes the highest free place from the
    top row down, below the labels and legend it would cover. A label with no free place
    left is hidden; its line's tooltip still has it."""
    lo, hi = plot.vb.viewRange()[0]
    w, h = plot.vb.width(), plot.vb.height()
    if hi <= lo or w <= 0 or h <= 0:
        return
    top = (1 - LABEL_TOP) * h
    taken = [clear.adjusted(-LABEL_GAP, -LABEL_GAP, LABEL_GAP, LABEL_GAP)] if clear else []
    for x, text in sorted(labels, key=lambda xt: -xt[0]):
        px = (x - lo) / (hi - lo) * w
        left = x > (lo + hi) / 2
        size = text.textItem.boundingRect()
        x0 = px - size.width() if left else px
        ys = sorted({top, *(r.bottom() + LABEL_GAP for r in taken)})
        y = next(
            (
                y
                for y in ys
                if y >= top
                and y + size.height() <= h
                and not any(r.intersects(QRectF(x0, y, size.width(), size.height())) for r in taken)
            ),
            None,
        )
        if y is None:
            text.setVisible(False)
            continue
        taken.append(QRectF(x0, y, size.width(), size.height()))
        anchors = [(1, 0), (1, 0)] if left else [(0, 0), (0, 0)]
        pos = 1 - y / h
        if not text.isVisible():
            text.setVisible(True)
        if text.anchors != anchors or text.orthoPos != pos:
            text.anchors = anchors
            text.setPosition(pos)


class ComparePanel(QWidget):
    """Before | after | change, what separates the spans, and Export…."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.comparison: SpanComparison | None = None
        self.markers: list[MarkerEvent] = []
        self.heading = plain_label("")
        self.heading.setWordWrap(True)
        self.separated = plain_label("")
        self.separated.setWordWrap(True)
        self.separated.setStyleSheet(f"color:{PURPLE};")
        # why the spans may not be comparable (one idle, load apart): said, not hidden
        self.load_note = plain_label("")
        self.load_note.setWordWrap(True)
        self.load_note.setStyleSheet(CAVEAT_SHEET)
        self.load_note.hide()
        self.model: ObjectTableModel[MetricRow] = ObjectTableModel(COMPARE_COLUMNS, self)
        self.table = row_table(self.model)
        self.table.setObjectName("span comparison")
        self.export_button = QPushButton("Export…")
        self.export_button.setToolTip("Write the comparison as an HTML report (a folder)")
        self.export_button.clicked.connect(self._ask_export)
        # the table on the left, every row shown (its height is the panel's wish: the
        # splitter gives it that, CompareSpans.set_spans); what it says beside it, wrapped
        side = QVBoxLayout()
        top = QHBoxLayout()
        top.addWidget(self.heading, 1)
        top.addWidget(self.export_button, 0, Qt.AlignmentFlag.AlignTop)
        side.addLayout(top)
        side.addWidget(self.separated)
        side.addWidget(self.load_note)
        side.addStretch(1)
        lay = QHBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addWidget(self.table, 3)
        lay.addLayout(side, 2)

    def show_comparison(self, cmp: SpanComparison, markers: list[MarkerEvent]) -> None:
        self.comparison, self.markers = cmp, list(markers)
        self.heading.setText(
            f"Before {cmp.before.text()}, {cmp.samples[0]} samples · after "
            f"{cmp.after.text()}, {cmp.samples[1]} samples · drag the shaded spans"
        )
        self.separated.setText(f"Separated by: {cmp.separated_by()}")
        note = cmp.load_note()
        self.load_note.setText(f"⚠ {note}" if note else "")
        self.load_note.setVisible(bool(note))
        self.model.set_rows(cmp.rows)

    def table_height(self) -> int:
        """The table's height with every row shown (pixels): its header, rows and frame."""
        t = self.table
        t.ensurePolished()  # its frame is the style's
        rows = t.verticalHeader().length()
        bar = t.horizontalScrollBar()
        extra = bar.sizeHint().height() if bar.isVisible() else 0
        return t.horizontalHeader().sizeHint().height() + rows + 2 * t.frameWidth() + extra

    def sizeHint(self) -> QSize:
        hint = super().sizeHint()
        return QSize(hint.width(), max(hint.height(), self.table_height()))

    def export(self, folder: str | Path) -> Path | None:
        """Write the report folder (index.html); its path."""
        if self.comparison is None:
            return None
        return write_report([], Path(folder), comparison=self.comparison, markers=self.markers)

    def _ask_export(self) -> None:
        folder, _ = QFileDialog.getSaveFileName(
            self, "Export the comparison (a new report folder)", "quantdeck-timeline"
        )
        if folder:
            try:
                out = self.export(folder)
            except (QuantdeckError, OSError) as e:  # a user's folder: one line
                self.separated.setText(f"export failed: {e}")
                return
            self.separated.setText(f"exported: {out}")
