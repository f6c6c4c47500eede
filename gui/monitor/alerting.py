"""The Plots page's alerts: judged on every new sample of the live source, whatever tab is shown.

The operator's limits (p99 TTFT, KV-cache usage) are spin boxes in the page's bar and dotted
lines on its plots; vLLM's own thresholds are always on. The alerts of now are in a banner above
the plots; every alert raised, cleared or acknowledged is in the :class:`AlertLog` that the
Alerts page lists (:mod:`quantdeck.gui.monitor.alerts`)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pyqtgraph as pg
from PySide6.QtCore import QObject, QTimer, Signal
from PySide6.QtWidgets import QDoubleSpinBox, QLabel, QWidget

from quantdeck.core.monitor import TimeSeriesStore
from quantdeck.core.monitor.alerts import AlertLog
from quantdeck.gui.flow import group
from quantdeck.gui.style import ALERT_BANNER_SHEET, LIMIT_LINE

# vLLM's dashboard thresholds, always on (the limits in the bar are the operator's own)
KV_ALERT_PCT = 98.0  # KV cache nearly full: preemptions follow
SLO_ALERT_PCT = 99.0  # a window's attainment under this
ENDED_STATES = ("stopped", "crashed")  # the live source's life ended: its alerts end with it
# The alert banner's row stays this long after the last alert cleared. An alert that comes and
# goes with the samples (KV usage about its threshold) would otherwise move every plot up and
# down with it, and each move lays out all the plots and draws all their axes again (about
# 0.1 s of the UI thread; it was most of the frame time while an alert flapped).
BANNER_HOLD_S = 10.0

# the limits' lines: alert key -> the plot they are drawn on
LIMIT_PLOTS = {"ttft": "Latency (ms)", "kv": "KV-cache usage %"}


class PanelAlerts(QObject):
    """The alerts of a Monitor panel's live source: limits, banner, log. ``live_store`` gives
    the live source's samples (the alerts are of now, whatever source is shown); a panel that
    is not ``live`` (a replay: its thresholds are history) raises none."""

    alert = Signal(str)  # an alert was raised or cleared: its line (time, reading)
    changed = Signal()  # the log changed (raised, cleared, acknowledged)
    slo_changed = Signal(object)  # {"ttft": ms}: the p99 TTFT limit is also the TTFT SLO

    def __init__(
        self, live_store: Callable[[], TimeSeriesStore], parent: QWidget, *, live: bool
    ) -> None:
        super().__init__(parent)
        self._live_store = live_store
        self.live = live
        self.log = AlertLog()  # raised, cleared, acknowledged (the Alerts page lists them)
        self._seen: Any = None  # the live store's version the alerts were judged at
        self._ended_at: float | None = None  # when the live source stopped or crashed
        self._lines: dict[str, pg.InfiniteLine] = {}
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
        # the limits as the bar shows them (a replay's bar does not)
        self.limits = group(
            QLabel("Alert: p99 TTFT >"), self.ttft_limit, QLabel("KV >"), self.kv_limit
        )
        self.banner = QLabel()
        self.banner.setStyleSheet(ALERT_BANNER_SHEET)
        self.banner.hide()
        self._banner_hold = QTimer(self)
        self._banner_hold.setSingleShot(True)
        self._banner_hold.setInterval(int(BANNER_HOLD_S * 1000))
        self._banner_hold.timeout.connect(lambda: self._keep_banner_row(False))

    def _limits(self) -> dict[str, QDoubleSpinBox]:
        return {"ttft": self.ttft_limit, "kv": self.kv_limit}

    def add_lines(self, plots: dict[str, pg.PlotItem]) -> None:
        """The limits' dotted lines on newly built ``plots`` (the old went with the old)."""
        self._lines.clear()
        for key, limit in self._limits().items():
            pen = pg.mkPen(LIMIT_LINE, width=1, style=pg.QtCore.Qt.DotLine)
            line = pg.InfiniteLine(angle=0, pen=pen)
            line.setVisible(limit.value() > 0)
            line.setValue(limit.value())
            plots[LIMIT_PLOTS[key]].addItem(line, ignoreBounds=True)
            self._lines[key] = line

    def _on_limits_changed(self, *_: Any) -> None:
        for key, limit in self._limits().items():
            line = self._lines.get(key)
            if line is not None:
                line.setValue(limit.value())
                line.setVisible(limit.value() > 0)
        self.check()
        self.slo_changed.emit({"ttft": self.ttft_limit.value()})

    def judge(self) -> None:
        """Check the alerts if the live source has a new sample since they were checked."""
        version = self._live_store().version
        if version != self._seen:
            self._seen = version
            self.check()

    def check(self) -> None:
        """Raise or clear each alert on the live source's latest reading."""
        if not self.live:  # a recording's thresholds are history, not alerts of now
            return
        live = self._live_store()  # alerts are of now: the live source's, whatever is shown
        if self._ended_at is not None and (live.last_t or 0.0) <= self._ended_at:
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
        t = live.last_t or time.time()  # the sample's time: the reading's own
        version = self.log.version
        for key, series, lim, fmt in (*checks, *slo):
            v = live.latest(series)
            if key.startswith("slo_"):
                over = v is not None and v < lim
            elif key == "preempt":
                over = v is not None and v > 0
            else:
                over = lim > 0 and v is not None and (v >= lim if key == "kv_full" else v > lim)
            text = fmt.format(v=v, lim=lim) if over else ""
            changed = self.log.update(key, over, text, t)
            if changed is not None:  # raised or cleared: the Logs tab has it too
                self.alert.emit(changed.text())
            if over:
                messages.append(text)
        self._show_banner("⚠ " + " · ".join(messages) if messages else "")
        if self.log.version != version:
            self.changed.emit()

    def follow_state(self, state: str, before: tuple[str, float] | None, t: float) -> None:
        """The live source moved from ``before`` to ``state`` at ``t``: a source that stopped
        or crashed takes its alerts with it (what it read last is not of now any more)."""
        if state not in ENDED_STATES:
            self._ended_at = None
        elif before is not None and before[0] not in ENDED_STATES:
            self._ended_at = t
            self.end(f"server {state}", t)

    def end(self, why: str, t: float) -> None:
        """The live source's life ended: its active alerts end (listed, each with why), the
        banner goes."""
        ended = self.log.end_all(why, t) if self.live else []
        for alert in ended:
            self.alert.emit(alert.text())  # the Logs tab has it too
        self._show_banner("")
        if ended:
            self.changed.emit()

    def acknowledge(self) -> int:
        """The operator has seen them: the badge goes (active alerts stay listed)."""
        n = self.log.acknowledge_all()
        if n:
            self.changed.emit()
        return n

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
