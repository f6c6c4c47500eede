"""The Tune page's live mode: the search run as a chain of live trials of an instance of the
fleet the Fleet tab runs (:mod:`quantdeck.gui.live_tune`): no server of its own, no load of its
own (the fleet's traffic), a row per trial as it goes, the goal figure of both arms per trial
in the plot, and the instance's launch at the end."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from quantdeck.core.bench.results import LiveTuneResult
from quantdeck.core.errors import ConfigError
from quantdeck.core.events import Event, LiveTuneEvent, TrialEvent
from quantdeck.core.launch.diff import knobs_text
from quantdeck.core.payloads import TrialArms, Verdict
from quantdeck.gui.bench.columns import diff_text
from quantdeck.gui.bench.results import BenchResults
from quantdeck.gui.live_tune import (
    NO_FLEET,
    RESULT_COLORS,
    FleetTrials,
    LiveTrialRow,
    LiveTuneForm,
    LiveTuneJob,
    live_columns,
    tunable_instances,
)
from quantdeck.gui.style import POINT

if TYPE_CHECKING:
    from quantdeck.core.fleet import Fleet


class LiveChain:
    """A live chain's trials as they go, shown in ``results`` (its table and plot), its steps
    said by ``say`` (the status line); ``form`` is the Tune page's live fields, ``fleet()``
    the fleet the Fleet tab runs (None: none)."""

    def __init__(
        self,
        results: BenchResults,
        form: LiveTuneForm,
        fleet: Callable[[], Fleet | None],
        say: Callable[[str], None],
    ) -> None:
        self._results, self._form, self._fleet, self._say = results, form, fleet, say
        self.rows: list[LiveTrialRow] = []  # the chain's trials so far
        self._goal = ""  # the chain's trial goal (ttft_p99...)
        self._until = False  # the chain has a goal of its own (until)

    @property
    def goal(self) -> str:
        """The goal the trials are judged on: the last chain's, else the form's."""
        return self._goal or self._form.goal.currentText()

    def refresh_instances(self) -> None:
        """The Fleet tab's fleet's instances in the live form (none: no fleet serves)."""
        fleet = self._fleet()
        self._form.set_instances(None if fleet is None else tunable_instances(fleet))

    def make_job(self, space_items: list[str], on_event: Callable[[Event], None]) -> LiveTuneJob:
        """The live chain the form asks for over the space ``space_items``, checked: a fleet
        serves, the instance serves, the space, the options and the budgets are good
        (ConfigError, one line)."""
        from quantdeck.core.bench import LiveTuner, parse_space
        from quantdeck.core.launch import detect_device

        self.refresh_instances()
        fleet = self._fleet()
        if fleet is None:
            raise ConfigError(NO_FLEET)
        settings = self._form.settings()
        space = parse_space(space_items, detect_device(), None)
        tuner = LiveTuner(
            space,
            budget=settings.budget,
            budget_s=settings.budget_s,
            until=settings.until,
            on_event=on_event,
        )
        trials = FleetTrials(fleet, settings.instance, settings.opts, on_event=on_event)
        trials.check()
        self.rows = []
        self._goal, self._until = settings.opts.goal, settings.until is not None
        return LiveTuneJob(tuner, trials)

    # -- the chain's events ------------------------------------------------------------------
    def on_trying(self, step: int, knobs: dict[str, list[Any]]) -> None:
        """Trial ``step`` is sent to the fleet: a new row."""
        row = LiveTrialRow(step, knobs)
        self.rows.append(row)
        self._row_changed(len(self.rows) - 1)
        self._say(f"trial {step} ({row.change}): sent to the fleet")

    def on_tried(self, step: int, knobs: dict[str, list[Any]], ev: LiveTuneEvent) -> None:
        """Trial ``step`` is over: its result, decision and reason."""
        i = self._row(step)
        if i < 0:  # refused before the fleet was asked: no "trying" came
            self.rows.append(LiveTrialRow(step, knobs))
            i = len(self.rows) - 1
        row = self.rows[i]
        row.result = ev.result or "failed"
        row.decision = ev.decision or None
        row.reason = ev.reason or ""
        if isinstance(ev.verdict, Verdict):
            row.verdict = ev.verdict
        row.meets = ev.meets if isinstance(ev.meets, bool) else None
        self._row_changed(i)
        goal = "" if row.meets is None else "; meets the goal" if row.meets else "; misses the goal"
        self._say(f"trial {step} ({row.change}): {row.result}{goal}")

    def on_trial(self, ev: TrialEvent) -> None:
        """A step of the trial under way (the fleet's own event): its row and the status."""
        if not self.rows or self.rows[-1].result:
            return
        i = len(self.rows) - 1
        row = self.rows[i]
        row.phase, row.news = ev.phase, ev.reason or ""
        if isinstance(ev.verdict, Verdict):
            row.verdict = ev.verdict
        if isinstance(ev.arms, TrialArms):
            row.arms = ev.arms
        self._row_changed(i)
        head = f"trial {row.step} ({row.change})"
        match ev:
            case TrialEvent(phase="admitted"):  # the fit: in the detail line
                self._say(f"{head}: admitted; starting the candidate…")
            case TrialEvent(phase="started"):
                self._say(f"{head}: the candidate is ready; warming up, routing…")
            case TrialEvent(phase="measuring", verdict=Verdict() as v):
                self._say(f"{head}: measuring · {v.describe()}")
            case TrialEvent(phase="decided", decision=decision, reason=why):
                self._say(f"{head}: decided: {decision} ({why}); carrying it out…")
            case TrialEvent(phase=phase, reason=why):
                self._say(f"{head}: {phase}" + (f" ({why})" if why else ""))

    # -- showing the chain ---------------------------------------------------------------------
    def _row(self, step: int) -> int:
        """The table row of trial ``step`` (-1: none yet)."""
        return next((i for i, r in enumerate(self.rows) if r.step == step), -1)

    def _row_changed(self, i: int) -> None:
        """Row ``i`` of the chain's trials is new or changed: the table (back to the trials
        if the History's comparison took it meanwhile) and the plot follow."""
        model = self._results.results_model
        if model.column_names[1:2] != ["knob change"]:
            self.show()
        elif i >= model.rowCount():
            model.append(self.rows[i])
        else:
            model.row_changed(i)
        self._changed()

    def show(self) -> None:
        """The chain's trials in the table and the plot."""
        self._results.results_model.set_rows(self.rows, live_columns(self._until))
        self._changed()

    def _changed(self) -> None:
        """The table's columns fit their contents (the reason takes the rest, on one line; the
        detail line below says it in full); the plot shows each trial's arms' goal figure."""
        res = self._results
        for c in range(res.results_model.columnCount() - 1):
            res.table.resizeColumnToContents(c)
        res.table.resizeRowsToContents()
        self.on_row_selected()
        goal = self.goal
        inc = [(r.step, r.figure("incumbent", goal)) for r in self.rows]
        cand = [(r.step, r.figure("candidate", goal), r.result) for r in self.rows]
        inc_ = [(x, y) for x, y in inc if y is not None]
        cand_ = [(x, y, outcome) for x, y, outcome in cand if y is not None]
        res.incumbent_curve.setData([x for x, _ in inc_], [y for _, y in inc_])
        res.candidate_curve.setData(
            [x for x, _, _ in cand_],
            [y for _, y, _ in cand_],
            symbolBrush=[RESULT_COLORS.get(r, POINT) for _, _, r in cand_],
        )
        high = max([y for _, y in inc_] + [y for _, y, _ in cand_], default=0.0)
        res.plot.setXRange(0.5, max(len(self.rows), 1) + 0.5, padding=0)
        res.plot.setYRange(0, high * 1.2 if high > 0 else 1.0, padding=0.04)

    def on_row_selected(self, *_: Any) -> None:
        """The detail line: the selected trial in full, else the latest."""
        res = self._results
        if res.plot_mode != "live" or not self.rows:
            res.trial_detail.setText("")
            return
        i = res.table.selectionModel().currentIndex().row()
        row = self.rows[i] if 0 <= i < len(self.rows) else self.rows[-1]
        res.trial_detail.setText(row.detail)

    def show_result(self, result: LiveTuneResult, instance: str | None) -> None:
        """The chain's end: the instance's launch now, what the chain changed, the goal."""
        from quantdeck.core.bench.live_tune import until_text

        trials = result.trials
        ran = sum(1 for t in trials if t.ran)
        won = sum(1 for t in trials if t.result == "promoted")
        best = knobs_text(result.best)
        changed = diff_text(result.changed) or "nothing"
        lines = [
            f"Final launch of {instance or 'the instance'}: {best} "
            f"(changed by the chain: {changed})."
        ]
        ended = f"; ended: {result.ended}"
        if result.until:
            goal = until_text(result.until)
            if result.goal_met:  # the chain ended there: its reason says how
                lines.append(f"Goal {goal}: {result.ended.removeprefix('the goal: ')}.")
                ended = ""
            else:
                lines.append(f"Goal {goal}: not met (no promoted launch met every limit).")
        lines.append(
            f"{ran} trial{'' if ran == 1 else 's'} in {result.seconds or 0:.0f} s, {won} promoted, "
            f"{len(trials) - ran} not run{ended}."
        )
        summary = self._results.tune_summary
        summary.setText("\n".join(lines))
        launch = "\n".join(f"{k}: {v}" for k, v in result.launch.items())
        summary.setToolTip(f"The instance's launch now:\n{launch}")
