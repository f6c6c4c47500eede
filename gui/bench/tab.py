"""The Benchmark tab: the load form and a page per mode (Run, A/B, Tune with its live mode,
History) on the left, the results (plot and table) on the right, and the job the chosen mode
runs.

The jobs are core objects (:class:`quantdeck.core.bench.client.Bench`,
:class:`quantdeck.core.bench.ab.ABRun`, :class:`quantdeck.core.bench.tune.Tuner`, a live chain),
each run by a generator worker (:meth:`quantdeck.gui.workers.WorkerSet.follow`): the job's
callbacks put its events in a queue that the worker's generator drains and yields in batches,
which the ``yielded`` slot shows on the GUI thread (progress bar, live latency plot); nothing
polls while it measures. Cancel calls the job's thread-safe ``cancel()``: the run ends early and
its partial result is kept. ``shutdown()`` quits the worker: the job is cancelled and nothing is
returned. A tuning run shows its points as they are measured (point i of n, why a point was
dropped), marks the best in the table and the plot, names the profile it saved and loads it
into the Launch tab on request. The form scrolls; the results keep at least half the width."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import Signal
from PySide6.QtGui import QShowEvent
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QProgressBar,
    QPushButton,
    QScrollArea,
    QSplitter,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from quantdeck.core.bench import LoadSpec
from quantdeck.core.bench.results import (
    ABResult,
    BenchJob,
    BenchResult,
    LiveTuneResult,
    PointFigures,
    RunResult,
    TuneResult,
)
from quantdeck.core.errors import QuantdeckError
from quantdeck.core.events import (
    ArmEvent,
    ArmServerEvent,
    BenchProgress,
    Event,
    InstanceEvent,
    LiveTuneEvent,
    PointEvent,
    ProgressEvent,
    StateEvent,
    TrialEvent,
)
from quantdeck.core.launch import LaunchConfig
from quantdeck.gui.bench.ab_page import ABPage
from quantdeck.gui.bench.columns import (
    METRIC_COLUMN,
    TunePoint,
    series_column,
    stage_text,
    values_text,
)
from quantdeck.gui.bench.history_page import HistoryPage
from quantdeck.gui.bench.live_chain import LiveChain
from quantdeck.gui.bench.load_form import LoadForm
from quantdeck.gui.bench.results import BenchResults
from quantdeck.gui.bench.run_gate import SERVER_RUNS, RunGate
from quantdeck.gui.bench.run_page import RunPage
from quantdeck.gui.bench.tune_page import TunePage
from quantdeck.gui.labels import plain_label
from quantdeck.gui.workers import EventQueue, WorkerSet

if TYPE_CHECKING:
    from quantdeck.core.fleet import Fleet


class BenchTab(QWidget):
    """The Benchmark tab: the pages, the results, and the job that runs."""

    finished = Signal(object)  # the RunResult of the last job (bench, ab or tune)
    failed = Signal(str)
    _worker_failed = Signal(str)  # a worker's error, on the way to _on_error

    def __init__(
        self,
        target: Callable[[], tuple[str | None, str | None, str | None]],
        launch_config: Callable[[], LaunchConfig],
        server_running: Callable[[], bool],
        parent: QWidget | None = None,
        *,
        apply_profile: Callable[[str], None] | None = None,
        fleet: Callable[[], Fleet | None] | None = None,
    ) -> None:
        """``target()`` gives (url, model, api_key) of the current server; ``launch_config()``
        the Launch tab's config (the base of A/B arms and tuning); ``apply_profile(name)``
        loads a saved profile into the Launch tab (the tuned one: "Apply to Launch");
        ``fleet()`` the fleet the Fleet tab runs while it serves (None: none), which the Tune
        page's live mode tunes."""
        super().__init__(parent)
        self._target, self._launch_config, self._server_running = (
            target,
            launch_config,
            server_running,
        )
        self._apply_profile = apply_profile
        self.job: BenchJob | None = None
        self.job_kind = "bench"
        self._grid = False  # a tuning job walks its whole grid (else at most its points)
        self._arm_labels: list[str] = []  # an A/B job's arms
        self._live_instance: str | None = None  # the instance a live chain tunes
        self.worker: Any = None
        self.result: RunResult | None = None
        self.saved_profile: str | None = None  # the profile the last tune saved
        # through a signal: a bound method of the tab's own would keep it in a reference cycle,
        # freed by the garbage collector whenever it runs (in a paint event too: a crash)
        self._worker_failed.connect(self._on_error)
        self._workers = WorkerSet(self._worker_failed.emit)
        self._tune_points: list[TunePoint] = []  # the tuning run's points measured so far
        self._tune_knobs: list[str] = []
        self._planned = 0  # the most points the tuning run measures
        self._tune_base: LaunchConfig | None = None

        # -- the load, the modes' pages, the results ------------------------------------------
        self.load_box = LoadForm()  # hidden in live tuning: the fleet's own traffic is the load
        self.run_page = RunPage()
        self.ab_page = ABPage(launch_config)
        self.tune_page = TunePage()
        self.history_page = HistoryPage()
        self.modes = QTabWidget()
        self.modes.addTab(self.run_page, "Run")
        self.modes.addTab(self.ab_page, "A/B")
        self.modes.addTab(self.tune_page, "Tune")
        self.modes.addTab(self.history_page, "History")
        self.run_button = QPushButton("Run")
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setEnabled(False)
        self.progress = QProgressBar()
        self.status = plain_label("—")
        self.status.setWordWrap(True)
        self.results = BenchResults(apply_profile is not None)
        self.live_chain = LiveChain(
            self.results, self.tune_page.live, fleet or (lambda: None), self.status.setText
        )
        self._name_parts()
        # Run off where the chosen page cannot run, saying why
        self.gate = RunGate(self, target, server_running, fleet or (lambda: None), self)

        left = QWidget()
        ll = QVBoxLayout(left)
        ll.addWidget(self.load_box)
        ll.addWidget(self.modes, 1)
        bb = QHBoxLayout()
        bb.addWidget(self.run_button)
        bb.addWidget(self.cancel_button)
        ll.addLayout(bb)
        ll.addWidget(self.gate.note)
        ll.addWidget(self.progress)
        ll.addWidget(self.status)
        # the form scrolls rather than squeezing the results
        scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setFrameShape(QFrame.Shape.NoFrame)
        scroll.setWidget(left)
        scroll.setMinimumWidth(260)
        self.splitter = QSplitter()
        self.splitter.addWidget(scroll)
        self.splitter.addWidget(self.results)
        self.splitter.setChildrenCollapsible(False)
        self.splitter.setStretchFactor(0, 2)
        self.splitter.setStretchFactor(1, 3)
        self.splitter.setSizes([2000, 3000])  # the results take three fifths of the width
        QVBoxLayout(self).addWidget(self.splitter)

        self.run_button.clicked.connect(self.run)
        self.cancel_button.clicked.connect(self.cancel)
        self.history_page.said.connect(self.status.setText)
        self.history_page.compared.connect(self.results.show_rows)
        self.apply_button.clicked.connect(self._on_apply_clicked)
        self.modes.currentChanged.connect(self.ab_page.refresh_diffs)
        self.modes.currentChanged.connect(self._on_tune_where_changed)
        self.table.selectionModel().currentRowChanged.connect(self.live_chain.on_row_selected)
        self.tune_where.currentIndexChanged.connect(self._on_tune_where_changed)
        self.refresh_history()
        self.ab_page.refresh_diffs()

    def _name_parts(self) -> None:
        """The pages' and the results' widgets by name on the tab, as the window, the
        screenshots and the tests reach them."""
        load = self.load_box
        self.load_rows, self.slo_rows, self.more_load = (
            load.load_rows,
            load.slo_rows,
            load.more_load,
        )
        self.concurrency, self.rate, self.dataset = load.concurrency, load.rate, load.dataset
        self.num_prompts, self.input_len, self.output_len = (
            load.num_prompts,
            load.input_len,
            load.output_len,
        )
        self.slo_ttft, self.slo_tpot = load.slo_ttft, load.slo_tpot
        self.label = self.run_page.label
        ab = self.ab_page
        self.arms, self.arm_diffs, self.arm_warning = ab.arms, ab.arm_diffs, ab.arm_warning
        tune = self.tune_page
        self.tune_where, self.space, self.live = tune.tune_where, tune.space, tune.live
        self.tune_ttft, self.tune_tpot = tune.tune_ttft, tune.tune_tpot
        self.max_points, self.grid, self.save_profile = (
            tune.max_points,
            tune.grid,
            tune.save_profile,
        )
        hist = self.history_page
        self.runs_model, self.history = hist.runs_model, hist.history
        self.compare_button, self.report_button = hist.compare_button, hist.report_button
        self.refresh_button = hist.refresh_button
        res = self.results
        self.plot, self.curve, self.table = res.plot, res.curve, res.table
        self.results_model, self.trial_detail = res.results_model, res.trial_detail
        self.goodput_curve, self.no_goodput_curve = res.goodput_curve, res.no_goodput_curve
        self.best_marker, self.best_text = res.best_marker, res.best_text
        self.incumbent_curve, self.candidate_curve = res.incumbent_curve, res.candidate_curve
        self.tune_summary, self.apply_button = res.tune_summary, res.apply_button

    # -- building the job ----------------------------------------------------------------------
    def load_spec(self) -> LoadSpec:
        """The load the form asks for (checked when the job starts); ConfigError names a bad
        field."""
        return self.load_box.load_spec()

    def slo(self) -> dict[str, float]:
        return self.load_box.slo()

    def _make_job(self, on_event: Callable[[Event], None]) -> tuple[str, BenchJob]:
        """The job the chosen mode runs, and its kind (bench, ab, tune, live); ``on_event``
        gets its events (from the job's thread)."""
        mode = self.modes.tabText(self.modes.currentIndex())
        if self.live_mode:  # no server of its own: the Launch tab's may run
            chain = self.live_chain.make_job(self.tune_page.space_items(), on_event)
            self._live_instance = chain.instance
            return "live", chain
        if mode == "Run":
            return "bench", self.run_page.make_job(self._target(), self.load_box, on_event)
        if mode == "History":
            raise QuantdeckError("choose Run, A/B or Tune to measure")
        if self._server_running():
            raise QuantdeckError(SERVER_RUNS)
        base = self._launch_config()
        if mode == "A/B":
            ab = self.ab_page.make_job(base, self.load_box, on_event)
            self._arm_labels = [arm.label for arm in ab.arms]
            return "ab", ab
        tuner = self.tune_page.make_job(base, self.load_box, on_event)
        self._tune_base, self._tune_knobs = tuner.base, list(tuner.space)
        self._grid = tuner.strategy == "grid"
        self._planned = tuner.planned_points()
        return "tune", tuner

    # -- running -----------------------------------------------------------------------------
    def run(self) -> None:
        events: EventQueue = EventQueue()
        self.live.error.setText("")
        try:
            kind, job = self._make_job(events.put)
        except QuantdeckError as e:
            if self.live_mode:  # the refusal in one red line under the live form
                self.live.error.setText(str(e))
                self.status.setText("—")
            else:
                self.status.setText(str(e))
            self.failed.emit(str(e))
            return
        self.job, self.job_kind = job, kind
        self.results.reset_ttfts()
        self.curve.setData([], [])
        self._tune_points = []
        self.saved_profile = None
        self.tune_summary.setText("")
        self.tune_summary.setToolTip("")
        self.apply_button.setEnabled(False)
        self._set_plot_mode(kind if kind in ("tune", "live") else "ttft")
        if kind == "tune":
            self._show_tune([])
        if kind == "live":
            self.live_chain.show()
        self.progress.setRange(0, 0 if kind == "live" else 100)  # live: busy, no count known
        self.progress.setValue(0)
        if kind == "live":
            self.status.setText(f"live tune of {self._live_instance}: starting the chain…")
        else:
            self.status.setText(f"{kind}: running…")
        self.run_button.setEnabled(False)
        self.cancel_button.setEnabled(True)
        self.worker = self._workers.follow(
            job.run,
            events,
            cancel=job.cancel,
            yielded=self._on_events,
            returned=self._on_done,
            finished=self._on_finished,
        )

    def cancel(self) -> None:
        """End the run early; what it measured so far is its result (a live chain: no trial
        starts, the one under way is rolled back)."""
        if self.job is not None:
            self.job.cancel()
            if self.job_kind == "live":
                self.status.setText("stopping: the trial under way is rolled back…")
            else:
                self.status.setText("cancelling…")

    def shutdown(self, timeout: float = 30.0) -> None:
        """Quit the run (cancelled, no result) and wait for its worker (the window is closing)."""
        self._workers.quit()
        self._workers.wait(timeout)

    def _point_text(self, n: int) -> str:
        """``point 2 of 6`` (the grid), ``point 2 of at most 6`` (the coordinate walk)."""
        return f"point {n} of {'' if self._grid else 'at most '}{self._planned}"

    def _arm_text(self, index: int) -> str:
        """``arm 1 of 2 (eager)``."""
        arms = self._arm_labels
        label = f" ({arms[index]})" if 0 <= index < len(arms) else ""
        return f"arm {index + 1} of {len(arms) or '?'}{label}"

    def _on_events(self, events: list[Event]) -> None:
        changed = False
        for ev in events:
            match ev:
                case BenchProgress(done=done, total=total, ttft_ms=ttft):
                    if isinstance(ttft, (int, float)) and self.results.plot_mode == "ttft":
                        self.results.add_ttft(float(ttft))
                        changed = True
                    self.progress.setMaximum(total)
                    self.progress.setValue(done)
                case PointEvent(index=n, values=values, stage="starting"):
                    self.progress.setValue(0)  # the bar counts this point's requests
                    self.status.setText(f"{self._point_text(n)} ({values_text(values)}): starting")
                case PointEvent(index=n, values=values, result=result):
                    from quantdeck.core.bench import point_outcome

                    figures = PointFigures.from_json(result)
                    self._tune_points.append(TunePoint(n, dict(values), figures))
                    self._show_tune(self._tune_points)
                    self.status.setText(
                        f"{self._point_text(n)} ({values_text(values)}): " + point_outcome(figures)
                    )
                case ArmEvent(point=int() as n, stage=stage, error=error):  # a tuning point's
                    self.status.setText(f"{self._point_text(n)}: {stage_text(stage, error)}")
                case ArmEvent(index=i, stage=stage, error=error):
                    self.status.setText(f"{self._arm_text(i)}: {stage_text(stage, error)}")
                    if stage == "starting":
                        self.results.reset_ttfts()
                        self.progress.setValue(0)
                        changed = True
                case ArmServerEvent(index=i, point=point, server=server):
                    who = self._point_text(point) if isinstance(point, int) else self._arm_text(i)
                    match server:
                        case ProgressEvent(stage=stage, pct=pct):
                            self.status.setText(f"{who}: server {stage} {pct:.0f}%")
                        case StateEvent(state=state, reason=str() as why) if why:
                            self.status.setText(f"{who}: server {state}: {why}")
                        case StateEvent(state=state):
                            self.status.setText(f"{who}: server {state}")
                case LiveTuneEvent(phase="trying", step=n, knobs=knobs):
                    self.live_chain.on_trying(n, dict(knobs))
                case LiveTuneEvent(phase="tried", step=n, knobs=knobs) as tried:
                    self.live_chain.on_tried(n, dict(knobs), tried)
                case InstanceEvent(event=TrialEvent() as trial):
                    self.live_chain.on_trial(trial)
        if changed:
            self.results.draw_ttfts()

    # -- the Tune page's live mode -------------------------------------------------------------
    @property
    def live_mode(self) -> bool:
        """The Tune page is shown, set to tune live on the Fleet tab's fleet."""
        return self.modes.currentWidget() is self.tune_page and self.tune_page.where_live

    def _on_tune_where_changed(self, *_: Any) -> None:
        """Live: the live form in place of the offline one, no load form (the fleet's traffic
        is the load), the Fleet tab's instances listed."""
        self.tune_page.show_where()
        self.load_box.setVisible(not self.live_mode)
        if self.tune_page.where_live:
            self.refresh_instances()
        if self.job is not None:
            return
        # nothing runs: the results of the mode shown (the last chain's trials, or none)
        if self.live_mode and self.results.plot_mode != "live":
            self._set_plot_mode("live")
            self.live_chain.show()
        elif not self.live_mode and self.results.plot_mode == "live":
            self._set_plot_mode("ttft")
            self.results_model.set_rows([], (METRIC_COLUMN, series_column("value", None)))
            if self.result is not None and not isinstance(self.result, LiveTuneResult):
                self.show_result(self.result)

    def refresh_instances(self) -> None:
        """The Fleet tab's fleet's instances in the live form (none: no fleet serves), and Run
        on or off with them (a fleet that came to serve since: Run on)."""
        self.live_chain.refresh_instances()
        self.gate.refresh()

    # -- a job's end ---------------------------------------------------------------------------
    def _on_done(self, result: RunResult) -> None:
        from quantdeck.core.bench import environment, save_run

        if isinstance(result, LiveTuneResult):  # the fleet saved each promoted launch
            self.result = result
            self.live_chain.show_result(result, self._live_instance)
            self.status.setText(f"live tune done: {result.ended}")
            return
        if result.env is None:
            server = result.server_version if isinstance(result, BenchResult) else None
            result.env = environment(server)
        label = self.label.text().strip() or None
        if isinstance(result, TuneResult):
            self._save_tuned(result)
            label = label or f"tune-{result.strategy}"
        elif isinstance(result, ABResult):
            label = label or "ab-" + "-vs-".join(a.label for a in result.arms)
        path = save_run(result, label)
        self.result = result
        self.show_result(result)
        ended = result.ended_early if isinstance(result, BenchResult) else None
        self.status.setText(
            f"{self.job_kind} done · saved {path.name}"
            + (f" · ended early: {ended}" if ended else "")
        )
        self.refresh_history()
        self.finished.emit(result)  # the Monitor marks it

    def _save_tuned(self, result: TuneResult) -> None:
        """Save the best point as a profile and say so (its name, in plain view)."""
        text, self.saved_profile = self.tune_page.save_best(result, self._tune_base)
        self.tune_summary.setText(text)
        self.apply_button.setEnabled(self.saved_profile is not None)

    def _on_apply_clicked(self) -> None:
        if self._apply_profile is not None and self.saved_profile:
            self._apply_profile(self.saved_profile)
            self.status.setText(f"profile '{self.saved_profile}' loaded into the Launch tab")

    def _on_error(self, msg: str) -> None:
        self.status.setText(msg)
        self.failed.emit(msg)

    def _on_finished(self) -> None:
        if self.progress.maximum() == 0:  # a live chain's busy bar: done
            self.progress.setRange(0, 1)
            self.progress.setValue(1)
        self.worker = None
        self.cancel_button.setEnabled(False)
        self.job = None
        self.gate.refresh()  # Run on again where the page can run

    def showEvent(self, event: QShowEvent) -> None:
        """The Launch tab's config may have changed meanwhile: the arms' diffs follow it."""
        super().showEvent(event)
        self.ab_page.refresh_diffs()
        if self.tune_page.where_live:  # the Fleet tab's fleet may have changed
            self.refresh_instances()

    # -- showing results -----------------------------------------------------------------------
    def _set_plot_mode(self, mode: str) -> None:
        self.results.set_plot_mode(mode, self.live_chain.goal)

    def _show_tune(self, points: Sequence[TunePoint], best: int | None = None) -> None:
        self.results.show_tune(points, self._tune_knobs, self._planned, best)

    def show_result(self, result: RunResult) -> None:
        if isinstance(result, TuneResult):
            points = [TunePoint(i, p.values, p) for i, p in enumerate(result.points, start=1)]
            best = result.best
            index = next((p.index for p in points if best and p.values == best.values), None)
            self._tune_knobs = list(result.space or self._tune_knobs)
            self._set_plot_mode("tune")
            self._show_tune(points, best=index if index is not None else -1)
            return
        self.results.show_figures(result, self.ab_page.diffs)

    # -- the History page ----------------------------------------------------------------------
    def refresh_history(self) -> None:
        self.history_page.refresh()

    def compare_selected(self) -> None:
        self.history_page.compare_selected()

    def write_report(self, folder: str | Path) -> Path | None:
        return self.history_page.write_report(folder)
