"""The Trial view: one live trial of a fleet instance
(:class:`~quantdeck.core.fleet.live.LiveTrial`), as the Fleet tab shows it below its table.

It shows the knob diff (incumbent → candidate), the goal, the phase, the running verdict with
its confidence and reason, both arms' figures side by side and the traffic split (the trial's own
``measuring`` events, every 2 s), both arms' curves on the same axes (the incumbent's and the
candidate's ``metrics`` events: instance ``NAME`` and ``NAME+try``), and Promote / Roll back /
Stop, which call :meth:`LiveTrial.decide`. After the decision: the result and its reason.

The view takes the trial and the fleet that runs it; it reads the trial's state once (events
before the view was built) and then follows the fleet's events, which come from the fleet's
threads through a Qt signal queued onto the GUI thread.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtWidgets import (
    QGridLayout,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from quantdeck.core.events import Event, InstanceEvent, MetricsEvent, StateEvent, TrialEvent
from quantdeck.core.fleet.trial import CANDIDATE
from quantdeck.core.launch.diff import after_text, change_text
from quantdeck.core.payloads import TrialArms, Verdict
from quantdeck.gui.labels import plain_label
from quantdeck.gui.style import (
    GREEN,
    GREY,
    ORANGE,
    PLOT_BACKGROUND,
    PLOT_TEXT,
    RED,
    SERIES_COLORS,
)
from quantdeck.gui.table_model import Column, ObjectTableModel, row_table

if TYPE_CHECKING:
    from quantdeck.core.fleet import Fleet
    from quantdeck.core.fleet.live import LiveTrial
    from quantdeck.core.snapshots import MetricsSnapshot

ARMS = ("incumbent", "candidate")
ARM_COLORS = {"incumbent": SERIES_COLORS[0], "candidate": SERIES_COLORS[1]}
POINTS = 1800  # each arm's curves: half an hour at the fleet's one sample a second
REDRAW_MS = 1000
OUTCOME_COLORS = {"better": GREEN, "worse": RED, "equivalent": GREY, "no difference": GREY}
RESULT_COLORS = {"promoted": GREEN, "rolled back": ORANGE, "refused": RED}
BY_OPERATOR = "by the operator"
STOPPED = "stopped by the operator"
UNDER_WAY = ("admitted", "started", "measuring")  # a decision can still be asked for


def _errors_per_s(m: MetricsSnapshot) -> float | None:
    """Requests that ended in an error or were aborted, per second (None: not known)."""
    parts = [m.finished_abort_per_s, m.finished_error_per_s]
    known = [p for p in parts if p is not None]
    return sum(known) if known else None


@dataclass(frozen=True)
class Curve:
    """One plot of both arms: its title (unit included), the figure of a scrape, its range."""

    title: str
    read: Callable[[MetricsSnapshot], float | None]
    percent: bool = False


CURVES = (
    Curve("TTFT p99 (ms)", lambda m: m.ttft_p99_ms),
    Curve("ITL p99 (ms)", lambda m: m.itl_p99_ms),
    Curve("Generation (tokens/s)", lambda m: m.generation_tokens_per_s),
    Curve("KV cache (%)", lambda m: m.kv_usage_pct, percent=True),
    Curve("Errors (requests/s)", _errors_per_s),
)


@dataclass(frozen=True)
class ArmFigure:
    """One line of the arms' table: a figure of each arm (``TrialEvent.arms``' key)."""

    key: str
    title: str
    lower_is_better: bool | None  # None: neither (a count, the time measured)


FIGURES = (
    ArmFigure("requests", "requests finished", None),
    ArmFigure("seconds", "measured (s)", None),
    ArmFigure("ttft_p50_ms", "TTFT p50 (ms)", True),
    ArmFigure("ttft_p99_ms", "TTFT p99 (ms)", True),
    ArmFigure("itl_p50_ms", "ITL p50 (ms)", True),
    ArmFigure("itl_p99_ms", "ITL p99 (ms)", True),
    ArmFigure("e2e_p50_ms", "E2E p50 (ms)", True),
    ArmFigure("e2e_p99_ms", "E2E p99 (ms)", True),
    ArmFigure("ttft_p90_ms", "TTFT p90 (ms)", True),
    ArmFigure("itl_p90_ms", "ITL p90 (ms)", True),
    ArmFigure("e2e_p90_ms", "E2E p90 (ms)", True),
    ArmFigure("tokens_per_s", "generation (tokens/s)", False),
    ArmFigure("decode_tokens_per_s", "decode per sequence (tokens/s)", False),
    ArmFigure("goodput_pct", "within the SLO (%)", False),
    ArmFigure("errors", "failed requests", True),
    ArmFigure("preemptions", "preemptions", True),
    ArmFigure("kv_usage_pct", "KV cache (%)", None),
)


@dataclass
class ArmRow:
    """A figure of both arms, as the last trial event gave them."""

    figure: ArmFigure
    incumbent: Any = None
    candidate: Any = None

    def change(self) -> str:
        """The candidate against the incumbent, in percent (blank without both)."""
        a, b = self.incumbent, self.candidate
        if self.figure.lower_is_better is None or not _number(a) or not _number(b):
            return ""
        return f"{100 * (b - a) / a:+.0f} %"

    def change_color(self) -> str | None:
        a, b = self.incumbent, self.candidate
        if self.figure.lower_is_better is None or not _number(a) or not _number(b) or a == b:
            return None
        return GREEN if (b < a) == self.figure.lower_is_better else RED


def _number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and v != 0


def _figure(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.1f}" if abs(v) < 1000 else f"{v:.0f}"
    return str(v)


ARM_COLUMNS: tuple[Column[ArmRow], ...] = (
    Column("figure", lambda r: r.figure.title),
    Column("incumbent", lambda r: _figure(r.incumbent), align_right=True),
    Column("candidate", lambda r: _figure(r.candidate), align_right=True),
    Column("change", lambda r: r.change(), align_right=True, color=lambda r: r.change_color()),
)


class ArmHistory:
    """One arm's curves in preallocated ring buffers: the time (s since the view began) and
    each curve's figure; a scrape without figures is a gap (NaN)."""

    def __init__(self, points: int = POINTS) -> None:
        self.t = np.full(points, np.nan)
        self.values = np.full((len(CURVES), points), np.nan)
        self.n = 0  # samples taken (the ring holds the last ``points``)

    def append(self, t: float, m: MetricsSnapshot | None) -> None:
        i = self.n % len(self.t)
        self.t[i] = t
        for c, curve in enumerate(CURVES):
            v = curve.read(m) if m is not None else None
            self.values[c, i] = np.nan if v is None else float(v)
        self.n += 1

    def series(self, c: int) -> tuple[np.ndarray, np.ndarray]:
        """Curve ``c``'s points in time order."""
        size = len(self.t)
        if self.n <= size:
            return self.t[: self.n], self.values[c, : self.n]
        order = np.roll(np.arange(size), -(self.n % size))
        return self.t[order], self.values[c, order]


class TrialView(QWidget):
    """One live trial: knobs, verdict, arms, curves, split, and the operator's buttons."""

    _fleet_event = Signal(object)  # the fleet's events, from its threads

    def __init__(
        self, trial: LiveTrial, fleet: Fleet | None = None, parent: QWidget | None = None
    ) -> None:
        super().__init__(parent)
        self.trial = trial
        self.name = trial.name
        self.candidate_name = trial.name + CANDIDATE  # its events' instance, until promoted
        self.phase = trial.phase
        self.asked: str | None = None  # what the operator asked for (promote, rollback, stop)
        self.result: str | None = None  # promoted, rolled back (refused), once carried out
        self.candidate_state = ""
        self.frozen = False  # the decision was made: the curves keep the trial's window
        self._t0: float | None = None
        self._dirty = False
        self.history = {arm: ArmHistory() for arm in ARMS}

        self.title = plain_label()
        self.title.setWordWrap(True)
        self.phase_label = plain_label()
        self.verdict_label = plain_label()
        self.verdict_label.setWordWrap(True)
        self.reason_label = plain_label()
        self.reason_label.setWordWrap(True)
        self.split_label = plain_label()
        self.result_label = plain_label()
        self.result_label.setWordWrap(True)
        self.promote_button = QPushButton("Promote")
        self.promote_button.setToolTip(
            "Make the candidate the instance now (the incumbent is drained and stopped)"
        )
        self.rollback_button = QPushButton("Roll back")
        self.rollback_button.setToolTip("Keep the incumbent: the candidate is drained and stopped")
        self.stop_button = QPushButton("Stop")
        self.stop_button.setToolTip("End the trial now: the candidate goes, the incumbent stays")
        self.arms_model: ObjectTableModel[ArmRow] = ObjectTableModel(ARM_COLUMNS, self)
        self.arm_rows = [ArmRow(f) for f in FIGURES]
        self.arms_model.set_rows(self.arm_rows)
        self.arms_table = row_table(self.arms_model)

        self.plots: dict[str, pg.PlotWidget] = {}
        self.curves: dict[tuple[str, str], pg.PlotDataItem] = {}  # (title, arm)
        plots = QGridLayout()
        plots.setSpacing(2)
        for n, curve in enumerate(CURVES):
            w = pg.PlotWidget(background=PLOT_BACKGROUND)
            w.setTitle(curve.title, color=PLOT_TEXT, size="9pt")
            w.setMinimumSize(160, 120)
            w.setMouseEnabled(x=False, y=False)
            w.setMenuEnabled(False)
            w.setLabel("bottom", "s")
            item = w.getPlotItem()
            item.setClipToView(True)
            item.setDownsampling(auto=True, mode="peak")
            if curve.percent:
                w.setYRange(0, 100, padding=0)
            else:
                item.enableAutoRange(axis="y")
                item.setLimits(yMin=0)
            for arm in ARMS:
                self.curves[(curve.title, arm)] = w.plot(
                    [], [], pen=pg.mkPen(ARM_COLORS[arm], width=2), name=arm, connect="finite"
                )
            self.plots[curve.title] = w
            plots.addWidget(w, 0, n)

        # the arms' colours above the plots (a legend inside one would hide its data)
        keys = " &nbsp; ".join(
            f"<span style='color:{ARM_COLORS[arm]}'>━━</span> {arm} ({html.escape(who)})"
            for arm, who in zip(ARMS, (self.name, self.candidate_name), strict=True)
        )
        self.legend = QLabel(keys)
        self.legend.setTextFormat(Qt.TextFormat.RichText)
        buttons = QHBoxLayout()
        for b in (self.promote_button, self.rollback_button, self.stop_button):
            buttons.addWidget(b)
        buttons.addStretch(1)
        facts = QVBoxLayout()
        for w in (
            self.title,
            self.phase_label,
            self.verdict_label,
            self.reason_label,
            self.split_label,
        ):
            facts.addWidget(w)
        facts.addLayout(buttons)
        facts.addWidget(self.result_label)
        facts.addStretch(1)
        top = QHBoxLayout()
        top.addLayout(facts, 1)
        top.addWidget(self.arms_table, 1)  # half: its change column shows at 1400x900
        # the arms' table never narrower than its columns (it scrolls down, not sideways)
        header = self.arms_table.horizontalHeader()
        self.arms_table.setMinimumWidth(min(560, header.length() + 24))
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addLayout(top, 2)
        lay.addWidget(self.legend)
        lay.addLayout(plots, 3)  # the curves get the room (they had ~100 px at 1400x900)

        if trial.undo is not None:  # nothing is compared: no figures, no curves
            self.arms_table.hide()
            self.legend.hide()
            for w in self.plots.values():
                w.hide()
        self.promote_button.clicked.connect(lambda: self.decide("promote"))
        self.rollback_button.clicked.connect(lambda: self.decide("rollback"))
        self.stop_button.clicked.connect(lambda: self.decide("stop"))
        self._timer = QTimer(self)
        self._timer.setInterval(REDRAW_MS)
        self._timer.timeout.connect(self.redraw)
        self._timer.start()
        self._fleet_event.connect(self._on_fleet_event)
        self._unsubscribe: Callable[[], None] | None = None
        if fleet is not None:
            unsubscribe = fleet.subscribe(self._fleet_event.emit)
            self._unsubscribe = unsubscribe
            self.destroyed.connect(lambda *_: unsubscribe())  # (idempotent)

        # what happened before the view was built: the trial's own state
        self._show_title()
        self._show_figures(trial.verdict, trial.arms)
        if trial.result is not None:
            self.result = trial.result
            self.frozen = True
        self._update()

    # -- the fleet's events ----------------------------------------------------------------------
    def close_subscription(self) -> None:
        """Stop following the fleet (the view is replaced or closed)."""
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None

    def on_event(self, event: Event) -> None:
        """One of the fleet's events (the trial's, the arms' metrics and the candidate's
        states); the others are not this view's."""
        self._on_fleet_event(event)

    def _on_fleet_event(self, event: Event) -> None:
        match event:
            case InstanceEvent(instance=name, event=TrialEvent() as ev) if name == self.name:
                self._on_trial_changed(ev)
            case InstanceEvent(instance=name, event=MetricsEvent() as ev) if (
                name in (self.name, self.candidate_name) and not self.frozen
            ):
                self._on_metrics_changed("incumbent" if name == self.name else "candidate", ev)
            case InstanceEvent(instance=name, event=StateEvent() as ev) if (
                name == self.candidate_name
            ):
                self.candidate_state = ev.state
                self._update()

    def _on_trial_changed(self, ev: TrialEvent) -> None:
        self.phase = ev.phase
        verdict = ev.verdict if isinstance(ev.verdict, Verdict) else None
        arms = ev.arms if isinstance(ev.arms, TrialArms) else None
        self._show_figures(verdict, arms)
        reason = ev.reason if isinstance(ev.reason, str) else ""
        if ev.phase == "decided":
            self.frozen = True  # the curves keep the trial's window
            decision = ev.decision if isinstance(ev.decision, str) else "?"
            self._set_result(f"decided: {decision} ({reason})", None)
        elif ev.phase in RESULT_COLORS:
            self.result = ev.phase
            self.frozen = True
            self._set_result(result_text(ev), ev.phase)
        elif ev.phase == "started" and reason:
            self.candidate_state = "ready"
        self._update()

    def _on_metrics_changed(self, arm: str, ev: MetricsEvent) -> None:
        if self._t0 is None:
            self._t0 = ev.t
        self.history[arm].append(ev.t - self._t0, ev.metrics if ev.error is None else None)
        self._dirty = True

    # -- what it shows -----------------------------------------------------------------------------
    def _show_title(self) -> None:
        t = self.trial
        if t.undo is not None:  # an undo, not a trial: nothing is compared
            back = after_text(t.knobs) or "the launch before"
            self.title.setText(f"Undo on {t.name}: back to {back}")
            return
        diff = change_text(t.knobs)
        self.title.setText(
            f"Trial of {t.name}: {diff or 'the same knobs (an A/A trial)'} · goal {t.opts.goal} "
            f"· decide {t.opts.decide}"
        )

    def _show_figures(self, verdict: Verdict | None, arms: TrialArms | None) -> None:
        if verdict is not None:
            self.verdict_label.setText(verdict_text(verdict))
            color = OUTCOME_COLORS.get(verdict.outcome)
            self.verdict_label.setStyleSheet(f"color: {color}" if color else "")
            self.reason_label.setText(verdict.reason)
        if arms is not None and (arms.incumbent or arms.candidate):
            for row in self.arm_rows:
                inc, cand = arms.incumbent, arms.candidate
                row.incumbent = inc.figure(row.figure.key) if inc is not None else None
                row.candidate = cand.figure(row.figure.key) if cand is not None else None
            for i in range(len(self.arm_rows)):
                self.arms_model.row_changed(i)
            self.split_label.setText(split_text(arms))

    def _set_result(self, text: str, result: str | None) -> None:
        self.result_label.setText(text)
        color = RESULT_COLORS.get(result or "")
        self.result_label.setStyleSheet(f"color: {color}; font-weight: bold" if color else "")

    def _update(self) -> None:
        state = f" · candidate {self.candidate_state}" if self.candidate_state else ""
        self.phase_label.setText(f"phase: {self.phase}{state}")
        under_way = self.phase in UNDER_WAY and self.result is None and self.asked is None
        measuring = under_way and self.phase == "measuring"
        self.promote_button.setEnabled(measuring)
        self.rollback_button.setEnabled(measuring)
        self.stop_button.setEnabled(under_way)
        if self.trial.undo is not None:  # nothing to decide: it is promoted once it serves
            self.promote_button.setEnabled(False)
            self.rollback_button.setEnabled(False)
            self.verdict_label.setText(
                "an undo: no comparison; the launch before takes over once it serves"
            )
        elif self.phase in UNDER_WAY and not self.verdict_label.text():
            self.verdict_label.setText("verdict: once both arms have finished requests")

    def redraw(self) -> None:
        """The curves from the ring buffers (one ``setData`` each, only when new points came)."""
        if not self._dirty:
            return
        self._dirty = False
        for c, curve in enumerate(CURVES):
            for arm in ARMS:
                x, y = self.history[arm].series(c)
                self.curves[(curve.title, arm)].setData(x, y, connect="finite")

    # -- the operator ------------------------------------------------------------------------------
    def decide(self, what: str) -> None:
        """Promote, roll back, or stop (a rollback at any step): the trial carries it out and
        says so in its events."""
        if self.asked is not None or self.result is not None:
            return
        self.asked = what
        if what == "stop":
            self.trial.decide("rollback", STOPPED)
            self._set_result("stopping: the candidate goes, the incumbent stays…", None)
        else:
            self.trial.decide(what, BY_OPERATOR)
            self._set_result(f"{what} asked {BY_OPERATOR}…", None)
        self._update()


def result_text(ev: TrialEvent) -> str:
    """A trial's (or an undo's) end in the operator's words: ``Promoted max-num-seqs 16: …``,
    ``Undone: back to max-num-seqs 8``, ``Rolled back: …``."""
    reason = ev.reason if isinstance(ev.reason, str) and ev.reason else ""
    if ev.phase == "promoted":
        head = (
            f"Undone: back to {after_text(ev.knobs) or 'the launch before'}"
            if ev.undo is True
            else f"Promoted {after_text(ev.knobs) or 'the same knobs'}"
        )
    else:
        head = ev.phase[:1].upper() + ev.phase[1:]
    return f"{head}: {reason}" if reason else head


def verdict_text(v: Verdict) -> str:
    """The running verdict in one line (:meth:`Verdict.describe`: the figure, the effect with
    its interval, the outcome, the requests)."""
    return "verdict: " + v.describe()


def split_text(arms: TrialArms) -> str:
    """Each arm's share of the requests finished since the measuring began."""
    counts: dict[str, float] = {}
    for arm in ARMS:
        figures = arms.of(arm)
        n = figures.requests if figures is not None else None
        if n is None:
            return ""
        counts[arm] = float(n)
    total = sum(counts.values())
    if total <= 0 or math.isnan(total):
        return "traffic split: no request finished yet" + probe_text(arms)
    shares = " · ".join(
        f"{arm} {100 * counts[arm] / total:.0f} % ({counts[arm]:.0f})" for arm in ARMS
    )
    return f"traffic split: {shares}" + probe_text(arms)


def probe_text(arms: TrialArms) -> str:
    """The paired probe's part, once it runs: its pairs decide."""
    probe = arms.probe
    if probe is None:
        return ""
    return f"; paired probe: {probe.pairs} pairs decide ({probe.why}), {probe.failed} failed"
