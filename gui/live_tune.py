"""Tune, live, on the Benchmark tab's Tune page: the tuner's search as a chain of live trials of
an instance of the fleet that the Fleet tab runs in this process.

The chain is :class:`~quantdeck.core.bench.live_tune.LiveTuner` (as ``quantdeck tune --live``
runs it); its trial function here is :class:`FleetTrials`: each candidate is
``fleet.start_trial(instance, cfg, opts)``, waited on in the chain's worker thread (never the
GUI thread), its ``decided`` event read for the reason and the candidate's figures. The trial's
own events (admitted, started, measuring...) and the chain's
:class:`~quantdeck.core.events.LiveTuneEvent` reach the page as typed objects through the
worker's queue. A refused candidate (it does not fit: nothing started) is skipped, as the CLI
skips it.

:class:`LiveTuneForm` holds the live fields of the Tune page (the instance, the trial's goal,
SLO, minimum requests and time limit, the chain's budgets and goal); :class:`LiveTrialRow` and
:func:`live_columns` are the table of trials as they go.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from PySide6.QtWidgets import (
    QComboBox,
    QDoubleSpinBox,
    QFormLayout,
    QLineEdit,
    QSpinBox,
    QWidget,
)

from quantdeck.core.errors import ConfigError, QuantdeckError, ServerError
from quantdeck.core.events import Event, InstanceEvent, TrialEvent
from quantdeck.core.launch.diff import change_text
from quantdeck.core.payloads import TrialArms, Verdict
from quantdeck.gui.labels import error_label, plain_label
from quantdeck.gui.style import GREEN, HINT_SHEET, ORANGE, RED
from quantdeck.gui.table_model import Column

if TYPE_CHECKING:
    from quantdeck.core.bench import LiveTuner, TrialOutcome
    from quantdeck.core.bench.results import LiveTuneResult
    from quantdeck.core.fleet import Fleet
    from quantdeck.core.fleet.trial import TrialOptions
    from quantdeck.core.launch import LaunchConfig

NO_FLEET = "no fleet serves in the Fleet tab: start one there first"
STOPPED = "stopped by the operator"
RESULT_COLORS = {"promoted": GREEN, "rolled back": ORANGE, "refused": RED, "failed": RED}


@dataclass(frozen=True)
class GoalFigure:
    """A trial goal's figure of an arm: its key in the trial's arms' figures, its title, unit."""

    key: str
    title: str
    unit: str


GOAL_FIGURES = {
    "ttft_p99": GoalFigure("ttft_p99_ms", "TTFT p99", "ms"),
    "itl_p99": GoalFigure("itl_p99_ms", "ITL p99", "ms"),
    "e2e_p99": GoalFigure("e2e_p99_ms", "E2E p99", "ms"),
    "goodput": GoalFigure("goodput_pct", "within the SLO", "%"),
    "throughput": GoalFigure("decode_tokens_per_s", "decode speed", "tokens/s"),
}


def _figure(v: float) -> str:
    """A figure in three digits or its whole part: 2250, 825, 18.7, 0.412."""
    return f"{v:.0f}" if abs(v) >= 100 else f"{v:.3g}"


def tunable_instances(fleet: Fleet) -> list[str]:
    """The instances a live trial can be of: the primaries Quantdeck starts."""
    return [i.name for i in fleet.spec.instances if i.cfg is not None and i.role == "primary"]


class FleetTrials:
    """A chain's two functions over ``fleet`` (run in this process): :meth:`launch`, instance
    ``name``'s launch as it runs now, and the call, one trial of a candidate launch (the
    fleet's :meth:`~quantdeck.core.fleet.Fleet.start_trial`, waited on). ``on_event`` gets the
    trial's own events (the instance's :class:`TrialEvent`, in an :class:`InstanceEvent`) from
    the fleet's threads; :meth:`stop` rolls back the trial under way."""

    def __init__(
        self,
        fleet: Fleet,
        name: str,
        opts: TrialOptions,
        on_event: Callable[[Event], None] | None = None,
    ) -> None:
        self.fleet, self.name, self.opts = fleet, name, opts
        self._on_event = on_event
        self._lock = threading.Lock()
        self._trial: Any = None  # the LiveTrial under way
        self._stopped = False

    def check(self) -> None:
        """Refused (ConfigError, one line) unless the instance can be tried now."""
        if self.name not in tunable_instances(self.fleet):
            names = ", ".join(tunable_instances(self.fleet)) or "none"
            raise ConfigError(
                f"no instance '{self.name}' that Quantdeck starts in this fleet (it has {names})"
            )
        self.launch()

    def launch(self) -> LaunchConfig:
        """The instance's launch as it runs now; ServerError when it does not serve (the
        fleet stopped: the chain stops)."""
        inst = next(i for i in self.fleet.spec.instances if i.name == self.name)
        server = self.fleet.servers.get(self.name)
        if inst.cfg is None or server is None or server.state != "ready":
            state = server.state if server is not None else "gone"
            raise ServerError(f"instance '{self.name}' does not serve now ({state})")
        return inst.cfg.copy()

    def stop(self) -> None:
        """Roll back the trial under way (and any that would start after)."""
        with self._lock:
            self._stopped = True
            trial = self._trial
        if trial is not None:
            trial.decide("rollback", STOPPED)

    def __call__(self, cfg: LaunchConfig) -> TrialOutcome:
        from quantdeck.core.bench import TrialOutcome
        from quantdeck.core.bench.live_tune import carried_out

        decided: list[TrialEvent] = []

        def mine(ev: Event) -> None:
            if (
                isinstance(ev, InstanceEvent)
                and ev.instance == self.name
                and isinstance(ev.event, TrialEvent)
            ):
                if ev.event.phase == "decided":
                    decided.append(ev.event)
                if self._on_event is not None:
                    self._on_event(ev)

        unsubscribe = self.fleet.subscribe(mine)
        try:
            try:
                trial = self.fleet.start_trial(self.name, cfg, self.opts)
            except QuantdeckError as e:  # nothing started
                try:
                    self.launch()
                except QuantdeckError as gone:
                    return TrialOutcome("failed", str(gone))
                return TrialOutcome("refused", str(e))
            with self._lock:
                self._trial = trial
                stopped = self._stopped
            if stopped:
                trial.decide("rollback", STOPPED)
            while not trial.wait(0.5):
                pass
        finally:
            with self._lock:
                self._trial = None
            unsubscribe()
        result = trial.result
        d = decided[-1] if decided else None
        if result not in ("promoted", "rolled back"):
            return TrialOutcome("failed", f"the trial ended {result or 'without a decision'}")
        return carried_out(str(result), d)


class LiveTuneJob:
    """A chain as the Benchmark tab runs its jobs: :meth:`run` (blocking, in a worker) and a
    thread-safe :meth:`cancel` (no trial starts after it; the one under way is rolled back)."""

    def __init__(self, tuner: LiveTuner, trials: FleetTrials) -> None:
        self.tuner, self.trials = tuner, trials

    @property
    def instance(self) -> str:
        return self.trials.name

    def run(self) -> LiveTuneResult:
        return self.tuner.run(self.trials.launch, self.trials)

    def cancel(self) -> None:
        self.tuner.cancel()
        self.trials.stop()


# -- the table of trials -----------------------------------------------------------------------
@dataclass
class LiveTrialRow:
    """A candidate of the chain: its knob change and, as they come, its trial's phase, the
    running or final verdict, what became of it and why."""

    step: int
    knobs: dict[str, list[Any]]
    phase: str = "sent"  # the trial's phase while it runs (admitted, started, measuring...)
    result: str = ""  # promoted, rolled back, refused, failed ("" while it runs)
    decision: str | None = None
    reason: str = ""
    verdict: Verdict | None = None
    arms: TrialArms = field(default_factory=TrialArms)  # the latest figures
    meets: bool | None = None
    news: str = ""  # while it runs: the reason its latest event gave (the fit, the start-up)

    def figure(self, arm: str, goal: str) -> float | None:
        """Arm ``arm``'s figure of ``goal`` (its p99, not the verdict's effect quantile)."""
        figures = self.arms.of(arm)
        return figures.figure(GOAL_FIGURES[goal].key) if figures is not None else None

    @property
    def change(self) -> str:
        return change_text(self.knobs)

    @property
    def result_text(self) -> str:
        return self.result or self.phase  # under way: the trial's phase

    @property
    def verdict_text(self) -> str:
        """The trial's verdict as every view says it (:meth:`Verdict.describe`)."""
        return self.verdict.describe() if self.verdict is not None and self.verdict.outcome else ""

    @property
    def detail(self) -> str:
        """The row in a sentence: the trial, what became of it, the full reason."""
        if self.result:
            return f"Trial {self.step} ({self.change}), {self.result}: {self.reason}"
        v = self.verdict if self.phase == "measuring" else None
        why = v.reason if v is not None else self.news
        return f"Trial {self.step} ({self.change}), under way ({self.phase})" + (
            f": {why}" if why else ""
        )


def live_columns(goal: bool) -> tuple[Column[LiveTrialRow], ...]:
    """The table of trials: with ``goal`` (``--until``), whether a promoted launch meets it."""
    meets = {True: "meets", False: "misses", None: ""}
    return (
        Column("trial", lambda r: str(r.step), align_right=True),
        Column("knob change", lambda r: r.change),
        Column("result", lambda r: r.result_text, color=lambda r: RESULT_COLORS.get(r.result)),
        Column("verdict (goal figure)", lambda r: r.verdict_text),
        Column("decision", lambda r: r.decision or ""),
        *((Column("goal", lambda r: meets[r.meets]),) if goal else ()),
        Column("reason", lambda r: r.reason, tooltip=lambda r: r.reason),
    )


# -- the form ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LiveTuneSettings:
    """What the live form says: the instance, each trial's options, the chain's budgets (None:
    none) and goal (``until``: ``{"ttft_p99": ms}``; None: none)."""

    instance: str
    opts: TrialOptions
    budget: int | None = None
    budget_s: float | None = None
    until: dict[str, float] | None = None


class LiveTuneForm:
    """The live fields of the Tune page, as rows of its form (``form``: one form with the
    offline fields, so that the labels line up; :meth:`set_visible` shows one set or the
    other): the fleet's instance, each trial's goal, SLO, minimum requests and time limit, the
    chain's budget (trials, seconds) and goal (``until``), a note, and the refusal of the last
    Run in one red line."""

    def __init__(self, form: QFormLayout) -> None:
        from quantdeck.core.fleet.trial import GOALS, TrialOptions

        self.form = form
        defaults = TrialOptions()
        self.instance = QComboBox()
        self.instance.setToolTip("The Fleet tab's instance whose launch the chain tunes")
        self.goal = QComboBox()
        self.goal.addItems(list(GOALS))
        self.goal.setCurrentText(defaults.goal)
        self.goal.setToolTip("What each trial's verdict is on")
        self.slo = QLineEdit()
        self.slo.setPlaceholderText("none (e.g. ttft_p99<=500ms,itl_p99<=50ms)")
        self.slo.setToolTip("A breach by a candidate rolls it back at once; goodput's limits")
        self.min_requests = QSpinBox()
        self.min_requests.setRange(5, 1_000_000)
        self.min_requests.setValue(defaults.min_requests)
        self.min_requests.setSuffix(" per arm")
        self.max_duration = QDoubleSpinBox()
        self.max_duration.setRange(1, 86_400)
        self.max_duration.setDecimals(0)
        self.max_duration.setValue(defaults.max_duration_s)
        self.max_duration.setSuffix(" s per trial")
        self.budget = QSpinBox()
        self.budget.setRange(0, 10_000)
        self.budget.setSpecialValueText("none")
        self.budget.setSuffix(" trials")
        self.budget.setToolTip("The most trials run (refused candidates not counted)")
        self.budget_s = QDoubleSpinBox()
        self.budget_s.setRange(0, 7 * 86_400)
        self.budget_s.setDecimals(0)
        self.budget_s.setSpecialValueText("none")
        self.budget_s.setSuffix(" s")
        self.budget_s.setToolTip("No trial starts after this many seconds")
        self.until = QLineEdit()
        self.until.setPlaceholderText("none (e.g. ttft_p99<=200ms)")
        self.until.setToolTip(
            "The chain's goal: it stops once a promoted launch meets every limit (p50 or p99 of "
            "ttft, itl, e2e), read on the candidate's figures in the trial that promoted it"
        )
        self.note = plain_label()
        self.note.setWordWrap(True)
        self.note.setStyleSheet(HINT_SHEET)
        self.error = error_label()
        self.fields: list[QWidget] = []
        for label, widget in (
            ("Instance", self.instance),
            ("Trial goal", self.goal),
            ("SLO", self.slo),
            ("Min requests", self.min_requests),
            ("Max duration", self.max_duration),
            ("Budget", self.budget),
            ("Budget (time)", self.budget_s),
            ("Until", self.until),
        ):
            form.addRow(label, widget)
            self.fields.append(widget)
        for line in (self.note, self.error):
            form.addRow(line)
            self.fields.append(line)
        self.set_instances(None)

    def set_visible(self, shown: bool) -> None:
        for widget in self.fields:
            self.form.setRowVisible(widget, shown)

    def is_visible(self) -> bool:
        return self.instance.isVisible()

    def set_instances(self, names: list[str] | None) -> None:
        """The serving fleet's instances (None: no fleet serves); the choice kept if it can."""
        current = self.instance.currentText()
        self.instance.clear()
        self.instance.addItems(names or [])
        if current in (names or []):
            self.instance.setCurrentText(current)
        self.instance.setEnabled(bool(names))
        if names is None:
            self.note.setText(
                "No fleet serves in the Fleet tab: start one there, then tune one of its "
                "instances here without downtime."
            )
        else:
            self.note.setText(
                "Each candidate is the instance's running launch with one knob of the space "
                "changed, tried beside it on the fleet's own traffic: promoted or rolled back "
                "by the verdict. The traffic never sees a restart."
            )

    def settings(self) -> LiveTuneSettings:
        """The chain's settings as the form says them; ConfigError names a bad field."""
        from quantdeck.core.bench.live_tune import check_until
        from quantdeck.core.fleet.trial import TrialOptions, parse_slo

        name = self.instance.currentText()
        if not name:
            raise ConfigError(NO_FLEET)
        slo = self.slo.text().strip()
        until = self.until.text().strip()
        opts = TrialOptions(
            goal=self.goal.currentText(),
            slo=parse_slo(slo) if slo else {},
            min_requests=self.min_requests.value(),
            max_duration_s=float(self.max_duration.value()),
        )
        try:
            goal = check_until(parse_slo(until)) if until else None
        except ConfigError as e:
            raise ConfigError(str(e).replace("--slo", "--until", 1)) from None
        return LiveTuneSettings(
            name,
            opts,
            budget=self.budget.value() or None,
            budget_s=float(self.budget_s.value()) or None,
            until=goal,
        )
