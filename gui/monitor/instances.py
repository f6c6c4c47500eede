"""A fleet's instances overlaid on the Plots page: each instance's own store (fed by the Fleet
tab, or a fleet recording replayed in its window), one curve per instance on a row of
:data:`~quantdeck.gui.monitor.charts.INSTANCE_PLOTS` after the page's plots, while "Fleet
instances" is ticked. The overlay is the shown source's (a fleet instance's: its fleet's
instances); another source shown, it goes with it."""

from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtWidgets import QCheckBox

from quantdeck.core.monitor import TimeSeriesStore
from quantdeck.gui.monitor.charts import INSTANCE_PLOTS, with_gaps
from quantdeck.gui.monitor.plot_grid import PlotGrid
from quantdeck.gui.monitor.plot_items import Curve
from quantdeck.gui.style import SERIES_COLORS


class InstanceOverlay:
    """The instances overlaid (none until a fleet runs or is replayed) and their curves."""

    def __init__(self) -> None:
        self.stores: dict[str, TimeSeriesStore] = {}  # instance name -> its metrics
        self.drawn: tuple[str, ...] = ()  # the instances the plots were built for
        self._curves: list[tuple[str, str, Curve]] = []  # (instance, series, curve)
        self.box = QCheckBox("Fleet instances")
        self.box.setToolTip("Overlay the fleet's instances: one curve per instance")
        self.box.setChecked(True)
        self.box.setVisible(False)  # until a fleet runs or is replayed

    def set_stores(self, stores: dict[str, TimeSeriesStore]) -> None:
        self.stores = dict(stores)
        self.box.setVisible(bool(stores))

    def overlaid(self) -> tuple[str, ...]:
        """The instances drawn: all of them once any has a point (a fleet file only opened
        adds no empty row of plots), while the box is ticked."""
        shown = self.box.isChecked() and any(len(s) for s in self.stores.values())
        return tuple(self.stores) if shown else ()

    def build(self, grid: PlotGrid, first: int, window_s: float, legends: bool) -> None:
        """The per-instance plots on ``grid``, after its ``first`` plots (none while no
        instance is overlaid)."""
        self._curves = []
        names = self.overlaid()
        # the per-instance plots go on in the same three columns (a fourth column made the
        # plots' minimum width wider than a 1400-px window)
        for n, (title, figure) in enumerate(INSTANCE_PLOTS.items() if names else [], first):
            if n % 3 == 0:
                grid.graphics.nextRow()
            p = grid.add_plot(title, window_s)
            curves = []
            for i, name in enumerate(names):
                curve = Curve(pg.mkColor(SERIES_COLORS[i % len(SERIES_COLORS)]), name)
                p.vb.addItem(curve, ignoreBounds=True)
                self._curves.append((name, figure, curve))
                curves.append(curve)
            grid.finish_plot(title, p, curves, legends)
        self.drawn = names

    def draw(self, window_s: float, width: int) -> None:
        """Each instance's curves on one time axis: now is the newest point of any."""
        lasts = [s.last_t for s in self.stores.values() if s.last_t is not None]
        now = max(lasts, default=0.0)
        series = list(INSTANCE_PLOTS.values())
        for name, key, curve in self._curves:
            store = self.stores.get(name)
            last = store.last_t if store is not None else None
            if store is None or last is None:
                curve.setData([], [])
                continue
            t, cols = store.window(window_s + (now - last), series, max_points=2 * width)
            t, cols = with_gaps(t, cols)
            curve.setData(t + (last - now), cols.get(key, np.full(len(t), np.nan)))
