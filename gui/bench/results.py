"""The Benchmark tab's results: the plot above (each request's TTFT live, goodput per tuning
point, or each live trial's goal figure) and the table below (an item model: a column per run
or arm, a row per tuning point or live trial, or a comparison of two runs), with the tuned
profile's line and the way into the Launch form."""

from __future__ import annotations

import collections
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QHBoxLayout,
    QPushButton,
    QSplitter,
    QTableView,
    QVBoxLayout,
    QWidget,
)

from quantdeck.core.bench.results import ABResult, BenchResult, RunResult
from quantdeck.gui.bench.columns import (
    AB_METRICS,
    MAX_LIVE_POINTS,
    METRIC_COLUMN,
    METRICS,
    Metric,
    TunePoint,
    best_point,
    series_column,
    tune_columns,
)
from quantdeck.gui.labels import plain_label
from quantdeck.gui.live_tune import GOAL_FIGURES
from quantdeck.gui.style import (
    BEST_POINT,
    DROPPED_POINT,
    GREY,
    PLOT_BACKGROUND,
    PLOT_TEXT,
    POINT,
)
from quantdeck.gui.table_model import Column, ObjectTableModel


class BenchResults(QSplitter):
    """The plot over the table (a vertical splitter); ``apply_shown``: the Apply to Launch
    button is offered (someone loads a tuned profile into the Launch tab)."""

    def __init__(self, apply_shown: bool, parent: QWidget | None = None) -> None:
        super().__init__(Qt.Orientation.Vertical, parent)
        self._apply_shown = apply_shown
        self._ttfts: collections.deque[float] = collections.deque(maxlen=MAX_LIVE_POINTS)
        self._ttft_count = 0  # requests plotted since the run (or arm, point) began
        self.plot_mode = ""  # ttft, tune or live: what the plot shows

        self.plot = pg.PlotWidget(background=PLOT_BACKGROUND)
        self.curve = self.plot.plot(
            [], [], pen=None, symbol="o", symbolSize=5, symbolBrush=POINT, symbolPen=None
        )
        self.goodput_curve = self.plot.plot(
            [], [], pen=None, symbol="o", symbolSize=9, symbolBrush=POINT, symbolPen=None
        )
        self.no_goodput_curve = self.plot.plot(
            [],
            [],
            pen=None,
            symbol="x",
            symbolSize=14,
            symbolBrush=DROPPED_POINT,
            symbolPen=DROPPED_POINT,
        )
        self.best_marker = self.plot.plot(
            [],
            [],
            pen=None,
            symbol="star",
            symbolSize=20,
            symbolBrush=BEST_POINT,
            symbolPen=PLOT_TEXT,
        )
        self.best_text = pg.TextItem("best", color=BEST_POINT, anchor=(0.5, 1.6))
        self.plot.addItem(self.best_text)
        # live tuning: each trial's goal figure, the incumbent's (hollow) and the candidate's
        # (filled, in its result's colour)
        self.incumbent_curve = self.plot.plot(
            [], [], pen=None, symbol="o", symbolSize=12, symbolBrush=None, symbolPen=GREY
        )
        self.candidate_curve = self.plot.plot(
            [], [], pen=None, symbol="o", symbolSize=11, symbolBrush=POINT, symbolPen=None
        )
        self.results_model: ObjectTableModel[Any] = ObjectTableModel(
            (METRIC_COLUMN, series_column("value", None)), self
        )
        self.table = QTableView()
        self.table.setModel(self.results_model)
        self.table.verticalHeader().setVisible(False)
        self.table.horizontalHeader().setStretchLastSection(True)
        self.table.setWordWrap(True)
        # the tuned profile, named in plain view, and the way into the Launch form
        self.tune_summary = plain_label()
        self.tune_summary.setWordWrap(True)
        self.tune_summary.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.apply_button = QPushButton("Apply to Launch")
        self.apply_button.setToolTip("Load the tuned profile into the Launch tab's form")
        self.apply_button.setEnabled(False)
        self.apply_button.setVisible(apply_shown)

        results = QWidget()
        rsl = QVBoxLayout(results)
        rsl.setContentsMargins(0, 0, 0, 0)
        rsl.addWidget(self.table, 1)
        # a live chain's trial in full (the table's reasons are one line): the selected one,
        # else the latest
        self.trial_detail = plain_label()
        self.trial_detail.setWordWrap(True)
        self.trial_detail.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.trial_detail.setVisible(False)
        rsl.addWidget(self.trial_detail)
        self.set_plot_mode("ttft")
        summary = QHBoxLayout()
        summary.addWidget(self.tune_summary, 1)
        summary.addWidget(self.apply_button)
        rsl.addLayout(summary)
        self.addWidget(self.plot)
        self.addWidget(results)
        self.setSizes([400, 500])

    # -- the live TTFT plot --------------------------------------------------------------------
    def reset_ttfts(self) -> None:
        """A run (or arm, point) begins: its requests are plotted from the first."""
        self._ttfts.clear()
        self._ttft_count = 0

    def add_ttft(self, ttft_ms: float) -> None:
        """A request's TTFT (plotted at the next :meth:`draw_ttfts`)."""
        self._ttfts.append(ttft_ms)
        self._ttft_count += 1

    def draw_ttfts(self) -> None:
        """The newest requests' TTFTs in the plot."""
        n = self._ttft_count
        self.curve.setData(np.arange(n - len(self._ttfts), n), np.asarray(self._ttfts))

    # -- what the plot and table show ------------------------------------------------------------
    def set_plot_mode(self, mode: str, goal: str = "") -> None:
        """``ttft``: each request's TTFT, live; ``tune``: goodput per tuning point; ``live``:
        each live trial's goal figure (``goal``'s), both arms."""
        if mode == "live":
            self.plot_mode = mode
            self.curve.setVisible(False)
            for item in (self.goodput_curve, self.no_goodput_curve, self.best_marker):
                item.setVisible(False)
            self.best_text.setVisible(False)
            self.incumbent_curve.setVisible(True)
            self.candidate_curve.setVisible(True)
            self.table.setWordWrap(False)  # one line a trial: the detail line says it in full
            self.trial_detail.setVisible(True)
            self.apply_button.setVisible(False)  # the fleet saves the instance's profile
            figure = GOAL_FIGURES[goal]
            self.plot.setTitle(
                f"{figure.title} per trial: ○ incumbent, ● candidate", color=PLOT_TEXT
            )
            self.plot.setLabel("bottom", "trial")
            self.plot.getAxis("bottom").setTickSpacing(1, 1)
            self.plot.setLabel("left", figure.title, units=figure.unit)
            self.plot.getAxis("left").enableAutoSIPrefix(False)  # 2500 ms, not 2.5 kms
            return
        self.plot.getAxis("left").enableAutoSIPrefix(True)
        self.table.setWordWrap(True)
        self.trial_detail.setVisible(False)
        self.apply_button.setVisible(self._apply_shown)
        self.incumbent_curve.setVisible(False)
        self.candidate_curve.setVisible(False)
        if mode == self.plot_mode:
            return
        self.plot_mode = mode
        ttft = mode == "ttft"
        self.curve.setVisible(ttft)
        for item in (self.goodput_curve, self.no_goodput_curve, self.best_marker, self.best_text):
            item.setVisible(not ttft)
        if ttft:
            self.plot.setTitle("TTFT per request (live)", color=PLOT_TEXT)
            self.plot.setLabel("bottom", "request (completion order)")
            self.plot.setLabel("left", "TTFT", units="ms")
            self.plot.getAxis("bottom").setTickSpacing()  # automatic
            self.plot.enableAutoRange()
        else:
            self.plot.setTitle(
                "Goodput per tuning point (★ best, × dropped or failed)", color=PLOT_TEXT
            )
            self.plot.setLabel("bottom", "tuning point")
            self.plot.getAxis("bottom").setTickSpacing(1, 1)  # points are whole numbers
            self.plot.setLabel("left", "goodput", units="req/s")

    def show_tune(
        self,
        points: Sequence[TunePoint],
        knobs: Sequence[str],
        planned: int,
        best: int | None = None,
    ) -> None:
        """The tuning points in the table (a column per knob of ``knobs``) and the plot (room
        for ``planned`` points), the best one marked (``best``: its index; None: the best so
        far)."""
        best = best_point(points) if best is None else best
        rows = [TunePoint(p.index, p.values, p.result, p.index == best) for p in points]
        self.results_model.set_rows(rows, tune_columns(knobs))
        self.table.resizeColumnsToContents()
        self.table.resizeRowsToContents()
        measured = [p for p in rows if p.goodput is not None]
        missing = [p for p in rows if p.goodput is None]
        self.goodput_curve.setData([p.index for p in measured], [p.goodput for p in measured])
        self.no_goodput_curve.setData([p.index for p in missing], [0.0] * len(missing))
        top = next((p for p in rows if p.best), None)
        if top is not None and top.goodput is not None:
            self.best_marker.setData([top.index], [top.goodput])
            self.best_text.setPos(top.index, top.goodput)
            self.best_text.setVisible(True)
        else:
            self.best_marker.setData([], [])
            self.best_text.setVisible(False)
        high = max((p.goodput or 0.0 for p in measured), default=0.0)
        self.plot.setXRange(0.5, max(len(rows), planned, 1) + 0.5, padding=0)
        # a little room below 0: the × of a point without goodput stays clear of the axis
        self.plot.setYRange(0, high * 1.25 if high > 0 else 1.0, padding=0.04)

    def show_figures(self, result: RunResult, arm_diffs: dict[str, str]) -> None:
        """A run's figures (a column), or an A/B run's (a column per arm, with what each arm
        changes against the Launch tab: ``arm_diffs``, and why an arm has none)."""
        rows: Sequence[Metric]
        columns: list[Column[Metric]]
        if isinstance(result, ABResult):
            rows = AB_METRICS
            columns = [
                series_column(
                    a.label,
                    a.result,
                    {"vs_launch": arm_diffs.get(a.label), "error": a.error or a.skipped},
                )
                for a in result.arms
            ]
        else:
            rows = METRICS
            columns = [series_column("value", result if isinstance(result, BenchResult) else None)]
        self.show_rows(rows, [METRIC_COLUMN, *columns])

    def show_rows(self, rows: Sequence[Any], columns: Sequence[Column[Any]]) -> None:
        """Any rows in the table, its columns fitted to them (a comparison of two runs)."""
        self.results_model.set_rows(rows, columns)
        self.table.resizeColumnsToContents()
