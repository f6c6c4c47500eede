"""The Benchmark tab: a load against the running server, A/B runs, auto-tuning, run history.

The jobs are core objects (:class:`quantdeck.core.bench.client.Bench`,
:class:`quantdeck.core.bench.ab.ABRun`, :class:`quantdeck.core.bench.tune.Tuner`), each run by a
generator worker (:meth:`quantdeck.gui.workers.WorkerSet.follow`): the job's callbacks put its
events in a queue that the worker's generator drains and yields in batches, which the ``yielded``
slot shows on the GUI thread (progress bar, live latency plot); nothing polls while it measures.
Cancel calls the job's thread-safe ``cancel()``: the run ends early and its partial result is
kept. ``shutdown()`` quits the worker: the job is cancelled and nothing is returned.

A/B arms are shown against the Launch tab's config (what each changes) before they run; arms
that cannot be told apart are refused (:func:`quantdeck.core.bench.check_arms`). A tuning run
shows its points as they are measured (point i of n, why a point was dropped), marks the best in
the table and the plot, names the profile it saved and loads it into the Launch tab on request.

The Tune page's live mode runs the search as a chain of live trials of an instance of the fleet
the Fleet tab runs (:mod:`quantdeck.gui.live_tune`): no server of its own, no load of its own
(the fleet's traffic), a row per trial as it goes, the goal figure of both arms per trial in
the plot, and the instance's launch at the end.

The results table and the run history are item models (:class:`ObjectTableModel`): the results
over :data:`METRICS` (a column per run or arm), a tuning run's over its points (a row each:
:class:`TunePoint`), the history over the run files. The form scrolls; the results keep at least
half the width."""

from __future__ import annotations

import collections
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QShowEvent
from PySide6.QtWidgets import (
    QAbstractItemView,
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QFormLayout,
    QFrame,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListView,
    QPlainTextEdit,
    QProgressBar,
    QPushButton,
    QScrollArea,
    QSpinBox,
    QSplitter,
    QTableView,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from quantdeck.core.bench import LoadSpec, SloLimits, load_fields, parse_slo
from quantdeck.core.errors import ConfigError, QuantdeckError
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
from quantdeck.gui.knob_form import SettingRows
from quantdeck.gui.labels import plain_label
from quantdeck.gui.live_tune import (
    GOAL_FIGURES,
    NO_FLEET,
    RESULT_COLORS,
    FleetTrials,
    LiveTrialRow,
    LiveTuneForm,
    LiveTuneJob,
    live_columns,
    tunable_instances,
)
from quantdeck.gui.report import fmt as _fmt
from quantdeck.gui.style import (
    BEST_POINT,
    DROPPED_POINT,
    ERROR,
    GREY,
    PLOT_BACKGROUND,
    PLOT_TEXT,
    POINT,
)
from quantdeck.gui.table_model import Column, ObjectTableModel
from quantdeck.gui.workers import EventQueue, WorkerSet

if TYPE_CHECKING:
    from quantdeck.core.fleet import Fleet


@dataclass(frozen=True)
class Metric:
    """A row of the results table: a key of the result, its title and number format."""

    key: str
    title: str
    fmt: str


METRICS = (
    Metric("completed", "completed", "d"),
    Metric("failed", "failed", "d"),
    Metric("duration", "duration s", ".2f"),
    Metric("output_throughput", "output tok/s", ".1f"),
    Metric("request_throughput", "requests/s", ".2f"),
    Metric("request_goodput", "goodput req/s", ".2f"),
    Metric("median_ttft_ms", "TTFT p50 ms", ".1f"),
    Metric("p99_ttft_ms", "TTFT p99 ms", ".1f"),
    Metric("median_tpot_ms", "TPOT p50 ms", ".2f"),
    Metric("p99_tpot_ms", "TPOT p99 ms", ".2f"),
    Metric("median_itl_ms", "ITL p50 ms", ".2f"),
    Metric("median_e2el_ms", "E2E p50 ms", ".0f"),
    Metric("p99_e2el_ms", "E2E p99 ms", ".0f"),
    Metric("ended_early", "ended early", "s"),
)

METRIC_COLUMN: Column[Metric] = Column("metric", lambda m: m.title)

# An A/B run's rows: what each arm changes against the Launch tab, its figures, why it has none.
AB_METRICS = (
    Metric("vs_launch", "vs Launch tab", "s"),
    *METRICS,
    Metric("error", "arm error", "s"),
)

# Eager against CUDA graphs, whatever the Launch tab says: the arms always differ.
DEFAULT_ARMS = "eager = --enforce-eager\ngraphs = --no-enforce-eager"


def diff_text(diff: Mapping[str, tuple[Any, Any]]) -> str:
    """``knob before → after`` per changed knob (``quantdeck.core.bench.knob_diff``'s)."""
    return ", ".join(f"{k} {a} → {b}" for k, (a, b) in diff.items())


@dataclass(frozen=True)
class TunePoint:
    """A row of a tuning run's table: point ``index`` (1-based, in measuring order), its knob
    values and figures (a ``point`` event's result, or an entry of the run's ``points``)."""

    index: int
    values: Mapping[str, Any]
    result: Mapping[str, Any]
    best: bool = False

    @property
    def goodput(self) -> float | None:
        g = self.result.get("goodput")
        return None if self.result.get("dropped") or self.result.get("error") else g


def best_point(points: Sequence[TunePoint]) -> int | None:
    """The index of the best point so far, as the tuner picks it: the most goodput, the
    earlier point on a tie; dropped and failed points never."""
    best: TunePoint | None = None
    for p in points:
        if p.goodput is not None and (best is None or p.goodput > (best.goodput or 0)):
            best = p
    return best.index if best else None


def _header(name: str, width: int = 14) -> str:
    """A long knob name broken at an underscore into two header lines."""
    if len(name) <= width or "_" not in name:
        return name
    cut = min((i for i, c in enumerate(name) if c == "_"), key=lambda i: abs(i - len(name) / 2))
    return name[: cut + 1] + "\n" + name[cut + 1 :]


def _outcome_cell(p: TunePoint) -> str:
    """What became of the point; its goodput has its own column."""
    from quantdeck.core.bench import point_outcome

    if p.goodput is None:
        return point_outcome(p.result)
    return "meets the p99 targets" if p.result.get("meets") else "misses the p99 targets"


def tune_columns(knobs: Sequence[str]) -> tuple[Column[TunePoint], ...]:
    """The columns of a tuning run's table: the point, one per knob, its figures, and what
    became of it (why a point has no goodput: dropped early, an error)."""
    from quantdeck.core.bench import point_outcome

    def _point_name(p: TunePoint) -> str:
        return f"{p.index} ★ best" if p.best else str(p.index)

    def _knob(k: str) -> Column[TunePoint]:
        return Column(_header(k), lambda p: _fmt(p.values.get(k), "s"))

    return (
        Column("point", _point_name),
        *(_knob(k) for k in knobs),
        Column("goodput\nreq/s", lambda p: _fmt(p.goodput, ".2f"), align_right=True),
        Column("TTFT p99\nms", lambda p: _fmt(p.result.get("p99_ttft_ms"), ".1f")),
        Column("TPOT p99\nms", lambda p: _fmt(p.result.get("p99_tpot_ms"), ".2f")),
        Column("completed", lambda p: _fmt(p.result.get("completed"), "d")),
        # a dropped point's unsent requests count as failed: its outcome says why instead
        Column(
            "failed",
            lambda p: "-" if p.result.get("dropped") else _fmt(p.result.get("failed"), "d"),
        ),
        Column("outcome", _outcome_cell, tooltip=lambda p: point_outcome(p.result)),
    )


def series_column(name: str, result: dict[str, Any]) -> Column[Metric]:
    """A column of the results table: one run, arm or tuning point (``result``'s figures)."""
    return Column(name, lambda m: _fmt(result.get(m.key), m.fmt))


def _ratio_text(row: dict[str, Any]) -> str:
    if row["ratio"] is None:
        return "-"
    return f"{row['ratio']:.3f}" + {True: " better", False: " worse", None: ""}[row["b_better"]]


def compare_columns(label_a: str, label_b: str) -> tuple[Column[dict[str, Any]], ...]:
    """The columns of a comparison of two runs (rows: quantdeck.core.bench.compare's)."""
    return (
        Column("metric", lambda r: r["metric"]),
        Column(label_a, lambda r: _fmt(r["a"], ".2f")),
        Column(label_b, lambda r: _fmt(r["b"], ".2f")),
        Column("B / A", _ratio_text),
    )


RUN_COLUMNS: tuple[Column[Path], ...] = (Column("run", lambda p: p.name, tooltip=str),)

# The form's load at start: the CLI's defaults but eight in flight, fewer and shorter requests,
# so that a first Run answers within seconds.
PANEL_LOAD = LoadSpec(concurrency=8, num_prompts=32, output_len=64)

# Requests the live TTFT plot shows: the newest (a 100 000-prompt run stays light to draw).
MAX_LIVE_POINTS = 10000

# The Tune page's two ways of running: servers of its own, or live trials on the Fleet tab's fleet
TUNE_OFFLINE = "own servers, one point at a time"
TUNE_LIVE = "live, on the Fleet tab's fleet"


def _values_text(values: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in values.items())


def _stage_text(stage: str, error: str | None | Any) -> str:
    """An arm's (or tuning point's) stage as the status line says it."""
    if stage == "starting":
        return "starting its server"
    if stage == "done" and isinstance(error, str) and error:
        return f"no result: {error}"
    return stage


def _wrapped(text: str) -> QLabel:
    label = plain_label(text)
    label.setWordWrap(True)
    return label


class BenchTab(QWidget):
    finished = Signal(dict)  # the result of the last job (bench, ab or tune)
    failed = Signal(str)

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
        self._fleet = fleet or (lambda: None)
        self._target, self._launch_config, self._server_running = (
            target,
            launch_config,
            server_running,
        )
        self._apply_profile = apply_profile
        self.job: Any = None
        self.job_kind = "bench"
        self.worker: Any = None
        self.result: dict[str, Any] | None = None
        self.saved_profile: str | None = None  # the profile the last tune saved
        self._workers = WorkerSet(self._on_error)
        self._ttfts: collections.deque[float] = collections.deque(maxlen=MAX_LIVE_POINTS)
        self._ttft_count = 0  # requests plotted since the run (or arm, point) began
        self._arm_diffs: dict[str, str] = {}  # the A/B run's arms: what each changes
        self._tune_points: list[TunePoint] = []  # the tuning run's points measured so far
        self._tune_knobs: list[str] = []
        self._planned = 0  # the most points the tuning run measures
        self._tune_base: LaunchConfig | None = None
        self._live_rows: list[LiveTrialRow] = []  # the live chain's trials so far
        self._live_goal = ""  # the live chain's trial goal (ttft_p99...)
        self._live_until = False  # the live chain has a goal of its own (until)

        # -- load: a row per field of the load and of the SLO limits (their declarations) ------
        self.load_box = QWidget()  # hidden in live tuning: the fleet's own traffic is the load
        load = QFormLayout(self.load_box)
        load.setContentsMargins(0, 0, 0, 0)
        self.load_rows = SettingRows(load, load_fields())
        self.slo_rows = SettingRows(load, load_fields(SloLimits))
        self.load_rows.set_values(PANEL_LOAD)
        self.slo_rows.set_values(SloLimits())
        self.concurrency = self.load_rows.widget("concurrency", QSpinBox)
        self.rate = self.load_rows.widget("request_rate", QDoubleSpinBox)
        self.num_prompts = self.load_rows.widget("num_prompts", QSpinBox)
        self.input_len = self.load_rows.widget("input_len", QSpinBox)
        self.output_len = self.load_rows.widget("output_len", QSpinBox)
        self.dataset = self.load_rows.widget("dataset", QComboBox)
        self.slo_ttft = self.slo_rows.widget("ttft", QDoubleSpinBox)
        self.slo_tpot = self.slo_rows.widget("tpot", QDoubleSpinBox)
        self.more_load = QCheckBox("More load options")
        self.more_load.setToolTip(
            "Arrival burstiness, prompt files, warm-up, sampling, seed, timeout, E2E SLO"
        )
        self.more_load.toggled.connect(self._on_more_load_changed)
        load.addRow("", self.more_load)
        self._on_more_load_changed(False)

        # -- modes -----------------------------------------------------------------------------
        self.modes = QTabWidget()
        run_page = QWidget()
        self.label = QLineEdit()
        self.label.setPlaceholderText("run label (optional)")
        rl = QVBoxLayout(run_page)
        rl.addWidget(_wrapped("Measures the server that runs now (Launch tab or attached)."))
        rl.addWidget(self.label)
        rl.addStretch(1)
        ab_page = QWidget()
        self.arms = QPlainTextEdit()
        self.arms.setPlaceholderText(
            "one arm per line: LABEL = OPTIONS\neager = --enforce-eager\n"
            "graphs = --no-enforce-eager"
        )
        self.arms.setPlainText(DEFAULT_ARMS)
        # what each arm changes against the Launch tab, and a refusal in plain view
        self.arm_diffs = plain_label()
        self.arm_diffs.setWordWrap(True)
        self.arm_warning = plain_label()
        self.arm_warning.setWordWrap(True)
        self.arm_warning.setStyleSheet(f"color:{ERROR}; font-weight:bold")
        al = QVBoxLayout(ab_page)
        al.addWidget(
            _wrapped(
                "Each arm: the Launch tab's config with these options on top "
                "(a model path, --profile NAME, knobs); started, warmed, measured, "
                "stopped in turn."
            )
        )
        al.addWidget(self.arms, 1)
        al.addWidget(self.arm_diffs)
        al.addWidget(self.arm_warning)
        tune_page = self.tune_page = QWidget()
        self.tune_where = QComboBox()
        self.tune_where.addItems([TUNE_OFFLINE, TUNE_LIVE])
        self.tune_where.setToolTip(
            "Own servers: each point started, measured under the load above and stopped in "
            "turn. Live: each candidate tried beside an instance of the Fleet tab's fleet on "
            "its own traffic, promoted or rolled back, without downtime"
        )
        self.space = QPlainTextEdit()
        self.space.setPlainText("max_num_seqs = 2,4,8,16\nenable_chunked_prefill = true,false")
        self.tune_ttft = QDoubleSpinBox()
        self.tune_tpot = QDoubleSpinBox()
        for w, v in ((self.tune_ttft, 2000.0), (self.tune_tpot, 200.0)):
            w.setRange(1, 1e7)
            w.setSuffix(" ms")
            w.setValue(v)
        self.max_points = QSpinBox()
        self.max_points.setRange(1, 1000)
        self.max_points.setValue(8)
        self.grid = QCheckBox("Exhaustive grid")
        self.save_profile = QLineEdit()
        self.save_profile.setPlaceholderText("profile for the best point (default: tuned-DATE)")
        # one form, so that the labels line up: the offline rows or the live ones shown
        tl = self.tune_form = QFormLayout(tune_page)
        tl.addRow("Run on", self.tune_where)
        tl.addRow("Space (KNOB = V1,V2)", self.space)
        self.offline_fields = (
            self.tune_ttft,
            self.tune_tpot,
            self.max_points,
            self.grid,
            self.save_profile,
        )
        tl.addRow("p99 TTFT target", self.tune_ttft)
        tl.addRow("p99 TPOT target", self.tune_tpot)
        tl.addRow("Max points", self.max_points)
        tl.addRow("", self.grid)
        tl.addRow("Save best as", self.save_profile)
        self.live = LiveTuneForm(tl)
        self.live.set_visible(False)
        hist_page = QWidget()
        self.runs_model: ObjectTableModel[Path] = ObjectTableModel(RUN_COLUMNS, self)
        self.history = QListView()
        self.history.setModel(self.runs_model)
        self.history.setSelectionMode(QAbstractItemView.SelectionMode.ExtendedSelection)
        self.compare_button = QPushButton("Compare two")
        self.report_button = QPushButton("HTML report…")
        self.refresh_button = QPushButton("Refresh")
        hl = QVBoxLayout(hist_page)
        hl.addWidget(self.history, 1)
        hb = QHBoxLayout()
        for b in (self.refresh_button, self.compare_button, self.report_button):
            hb.addWidget(b)
        hl.addLayout(hb)
        self.modes.addTab(run_page, "Run")
        self.modes.addTab(ab_page, "A/B")
        self.modes.addTab(tune_page, "Tune")
        self.modes.addTab(hist_page, "History")

        self.run_button = QPushButton("Run")
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setEnabled(False)
        self.progress = QProgressBar()
        self.status = plain_label("—")
        self.status.setWordWrap(True)

        # -- results: the plot (live TTFT per request, or goodput per tuning point), the table --
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
            (METRIC_COLUMN, series_column("value", {})), self
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
        self.apply_button.setVisible(apply_profile is not None)

        left = QWidget()
        ll = QVBoxLayout(left)
        ll.addWidget(self.load_box)
        ll.addWidget(self.modes, 1)
        bb = QHBoxLayout()
        bb.addWidget(self.run_button)
        bb.addWidget(self.cancel_button)
        ll.addLayout(bb)
        ll.addWidget(self.progress)
        ll.addWidget(self.status)
        # the form scrolls rather than squeezing the results
        scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setFrameShape(QFrame.Shape.NoFrame)
        scroll.setWidget(left)
        scroll.setMinimumWidth(260)
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
        self._plot_mode = ""
        self._set_plot_mode("ttft")
        summary = QHBoxLayout()
        summary.addWidget(self.tune_summary, 1)
        summary.addWidget(self.apply_button)
        rsl.addLayout(summary)
        right = QSplitter(Qt.Orientation.Vertical)
        right.addWidget(self.plot)
        right.addWidget(results)
        right.setSizes([400, 500])
        self.splitter = QSplitter()
        self.splitter.addWidget(scroll)
        self.splitter.addWidget(right)
        self.splitter.setChildrenCollapsible(False)
        self.splitter.setStretchFactor(0, 2)
        self.splitter.setStretchFactor(1, 3)
        self.splitter.setSizes([2000, 3000])  # the results take three fifths of the width
        QVBoxLayout(self).addWidget(self.splitter)

        self.run_button.clicked.connect(self.run)
        self.cancel_button.clicked.connect(self.cancel)
        self.refresh_button.clicked.connect(self.refresh_history)
        self.compare_button.clicked.connect(self.compare_selected)
        self.report_button.clicked.connect(self._ask_report)
        self.apply_button.clicked.connect(self._on_apply_clicked)
        self.arms.textChanged.connect(self._on_arms_changed)
        self.modes.currentChanged.connect(self._on_arms_changed)
        self.modes.currentChanged.connect(self._on_tune_where_changed)
        self.table.selectionModel().currentRowChanged.connect(self._on_live_row_changed)
        self.tune_where.currentIndexChanged.connect(self._on_tune_where_changed)
        self.refresh_history()
        self._on_arms_changed()

    # -- building the job ----------------------------------------------------------------------
    def load_spec(self) -> LoadSpec:
        """The load the form asks for (checked when the job starts); ConfigError names a bad
        field."""
        return LoadSpec(**self.load_rows.values())

    def slo(self) -> dict[str, float]:
        return parse_slo(None, **self.slo_rows.values())

    def _on_more_load_changed(self, shown: bool) -> None:
        self.load_rows.set_advanced_visible(shown)
        self.slo_rows.set_advanced_visible(shown)

    def _make_job(self, on_event: Callable[[Event], None]) -> tuple[str, Any]:
        """The job the chosen mode runs, and its kind (bench, ab, tune); ``on_event`` gets its
        events (from the job's thread)."""
        mode = self.modes.tabText(self.modes.currentIndex())
        if self.live_mode:  # no server of its own: the Launch tab's may run
            return "live", self._live_job(on_event)
        if mode == "Run":
            from quantdeck.core.bench import Bench

            url, model, key = self._target()
            if not url or not model:
                raise QuantdeckError("no server: start or attach one first")
            job = Bench(
                url,
                model,
                self.load_spec(),
                api_key=key,
                slo=self.slo(),
                on_record=lambda rec, done, total: on_event(
                    BenchProgress(done, total, ttft_ms=rec.ttft * 1000 if rec.success else None)
                ),
            )
            return "bench", job
        if mode == "History":
            raise QuantdeckError("choose Run, A/B or Tune to measure")
        if self._server_running():
            raise QuantdeckError(
                "stop the running server first: A/B and tuning start their "
                "own servers, one at a time"
            )
        base = self._launch_config()
        if mode == "A/B":
            from quantdeck.core.bench import ABRun, knob_diff

            arms = self._parse_arms(base)
            ab = ABRun(arms, self.load_spec(), slo=self.slo(), on_event=on_event)
            self._arm_diffs = {
                a.label: diff_text(knob_diff(base, a.config)) or "same as the Launch tab"
                for a in arms
            }
            return "ab", ab
        from quantdeck.core.bench import Tuner, parse_space
        from quantdeck.core.launch import detect_device, profiles

        name = self.save_profile.text().strip()
        if name:
            profiles.profile_path(name)  # a bad name is refused now, not after the run
        items = [ln for ln in self.space.toPlainText().splitlines() if ln.strip()]
        spec = self.load_spec()
        tuner = Tuner(
            base,
            spec,
            ttft_ms=self.tune_ttft.value(),
            tpot_ms=self.tune_tpot.value(),
            space=parse_space(items, detect_device(), spec.concurrency),
            strategy="grid" if self.grid.isChecked() else "coordinate",
            max_points=self.max_points.value(),
            on_event=on_event,
        )
        self._tune_base, self._tune_knobs = tuner.base, list(tuner.space)
        self._planned = tuner.planned_points()
        return "tune", tuner

    def _parse_arms(self, base: LaunchConfig) -> list[Any]:
        from quantdeck.core.bench import parse_arm

        lines = [ln for ln in self.arms.toPlainText().splitlines() if ln.strip()]
        return [parse_arm(ln, base) for ln in lines]

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
        self._reset_plot()
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
            self._show_live()
        self.progress.setRange(0, 0 if kind == "live" else 100)  # live: busy, no count known
        self.progress.setValue(0)
        if kind == "live":
            self.status.setText(f"live tune of {job.instance}: starting the chain…")
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
        grid = self.job is not None and getattr(self.job, "strategy", "") == "grid"
        return f"point {n} of {'' if grid else 'at most '}{self._planned}"

    def _arm_text(self, index: int) -> str:
        """``arm 1 of 2 (eager)``."""
        arms = getattr(self.job, "arms", None) or []
        label = f" ({arms[index].label})" if 0 <= index < len(arms) else ""
        return f"arm {index + 1} of {len(arms) or '?'}{label}"

    def _on_events(self, events: list[Event]) -> None:
        changed = False
        for ev in events:
            match ev:
                case BenchProgress(done=done, total=total, ttft_ms=ttft):
                    if isinstance(ttft, (int, float)) and self._plot_mode == "ttft":
                        self._ttfts.append(float(ttft))
                        self._ttft_count += 1
                        changed = True
                    self.progress.setMaximum(total)
                    self.progress.setValue(done)
                case PointEvent(index=n, values=values, stage="starting"):
                    self.progress.setValue(0)  # the bar counts this point's requests
                    self.status.setText(f"{self._point_text(n)} ({_values_text(values)}): starting")
                case PointEvent(index=n, values=values, result=result):
                    from quantdeck.core.bench import point_outcome

                    self._tune_points.append(TunePoint(n, dict(values), dict(result)))
                    self._show_tune(self._tune_points)
                    self.status.setText(
                        f"{self._point_text(n)} ({_values_text(values)}): " + point_outcome(result)
                    )
                case ArmEvent(point=int() as n, stage=stage, error=error):  # a tuning point's
                    self.status.setText(f"{self._point_text(n)}: {_stage_text(stage, error)}")
                case ArmEvent(index=i, stage=stage, error=error):
                    self.status.setText(f"{self._arm_text(i)}: {_stage_text(stage, error)}")
                    if stage == "starting":
                        self._reset_plot()
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
                    row = LiveTrialRow(n, dict(knobs))
                    self._live_rows.append(row)
                    self._live_row_changed(len(self._live_rows) - 1)
                    self.status.setText(f"trial {n} ({row.change}): sent to the fleet")
                case LiveTuneEvent(phase="tried", step=n, knobs=knobs) as tried:
                    self._on_tried(n, dict(knobs), tried)
                case InstanceEvent(event=TrialEvent() as trial):
                    self._on_trial(trial)
        if changed:
            n = self._ttft_count
            self.curve.setData(np.arange(n - len(self._ttfts), n), np.asarray(self._ttfts))

    # -- a live chain ------------------------------------------------------------------------------
    @property
    def live_mode(self) -> bool:
        """The Tune page is shown, set to tune live on the Fleet tab's fleet."""
        return self.modes.currentWidget() is self.tune_page and self.tune_where.currentText() == (
            TUNE_LIVE
        )

    def _on_tune_where_changed(self, *_: Any) -> None:
        """Live: the live form in place of the offline one, no load form (the fleet's traffic
        is the load), the Fleet tab's instances listed."""
        live = self.tune_where.currentText() == TUNE_LIVE
        for widget in self.offline_fields:
            self.tune_form.setRowVisible(widget, not live)
        self.live.set_visible(live)
        self.load_box.setVisible(not self.live_mode)
        if live:
            self.refresh_instances()
        if self.job is not None:
            return
        # nothing runs: the results of the mode shown (the last chain's trials, or none)
        if self.live_mode and self._plot_mode != "live":
            self._set_plot_mode("live")
            self._show_live()
        elif not self.live_mode and self._plot_mode == "live":
            self._set_plot_mode("ttft")
            self.results_model.set_rows([], (METRIC_COLUMN, series_column("value", {})))
            if self.result is not None and self.result.get("kind") != "live_tune":
                self.show_result(self.result)

    def refresh_instances(self) -> None:
        """The Fleet tab's fleet's instances in the live form (none: no fleet serves)."""
        fleet = self._fleet()
        self.live.set_instances(None if fleet is None else tunable_instances(fleet))

    def _live_job(self, on_event: Callable[[Event], None]) -> LiveTuneJob:
        """The live chain the form asks for, checked: a fleet serves, the instance serves, the
        space, the options and the budgets are good (ConfigError, one line)."""
        from quantdeck.core.bench import LiveTuner, parse_space
        from quantdeck.core.launch import detect_device

        self.refresh_instances()
        fleet = self._fleet()
        if fleet is None:
            raise ConfigError(NO_FLEET)
        settings = self.live.settings()
        items = [ln for ln in self.space.toPlainText().splitlines() if ln.strip()]
        space = parse_space(items, detect_device(), None)
        tuner = LiveTuner(
            space,
            budget=settings.budget,
            budget_s=settings.budget_s,
            until=settings.until,
            on_event=on_event,
        )
        trials = FleetTrials(fleet, settings.instance, settings.opts, on_event=on_event)
        trials.check()
        self._live_rows = []
        self._live_goal, self._live_until = settings.opts.goal, settings.until is not None
        return LiveTuneJob(tuner, trials)

    def _live_row(self, step: int) -> int:
        """The table row of trial ``step`` (-1: none yet)."""
        return next((i for i, r in enumerate(self._live_rows) if r.step == step), -1)

    def _live_row_changed(self, i: int) -> None:
        """Row ``i`` of the chain's trials is new or changed: the table (back to the trials
        if the History's comparison took it meanwhile) and the plot follow."""
        if self.results_model.column_names[1:2] != ["knob change"]:
            self._show_live()
        elif i >= self.results_model.rowCount():
            self.results_model.append(self._live_rows[i])
        else:
            self.results_model.row_changed(i)
        self._live_changed()

    def _on_tried(self, step: int, knobs: dict[str, list[Any]], ev: LiveTuneEvent) -> None:
        i = self._live_row(step)
        if i < 0:  # refused before the fleet was asked: no "trying" came
            self._live_rows.append(LiveTrialRow(step, knobs))
            i = len(self._live_rows) - 1
        row = self._live_rows[i]
        row.result = ev.result or "failed"
        row.decision = ev.decision or None
        row.reason = ev.reason or ""
        if ev.verdict:
            row.verdict = dict(ev.verdict)
        row.meets = ev.meets if isinstance(ev.meets, bool) else None
        self._live_row_changed(i)
        goal = "" if row.meets is None else "; meets the goal" if row.meets else "; misses the goal"
        self.status.setText(f"trial {step} ({row.change}): {row.result}{goal}")

    def _on_trial(self, ev: TrialEvent) -> None:
        """A step of the trial under way (the fleet's own event): its row and the status."""
        if not self._live_rows or self._live_rows[-1].result:
            return
        i = len(self._live_rows) - 1
        row = self._live_rows[i]
        row.phase, row.news = ev.phase, ev.reason or ""
        if ev.verdict:
            row.verdict = dict(ev.verdict)
        if ev.arms:
            row.arms = {arm: dict(f) for arm, f in ev.arms.items()}
        self._live_row_changed(i)
        head = f"trial {row.step} ({row.change})"
        match ev:
            case TrialEvent(phase="admitted"):  # the fit: in the detail line
                self.status.setText(f"{head}: admitted; starting the candidate…")
            case TrialEvent(phase="started"):
                self.status.setText(f"{head}: the candidate is ready; warming up, routing…")
            case TrialEvent(phase="measuring", verdict=dict() as v):
                self.status.setText(
                    f"{head}: measuring · {v.get('outcome')} · requests "
                    f"{v.get('n_incumbent')} / {v.get('n_candidate')} · {v.get('reason')}"
                )
            case TrialEvent(phase="decided", decision=decision, reason=why):
                self.status.setText(f"{head}: decided: {decision} ({why}); carrying it out…")
            case TrialEvent(phase=phase, reason=why):
                self.status.setText(f"{head}: {phase}" + (f" ({why})" if why else ""))

    def _live_changed(self) -> None:
        """The table's columns fit their contents (the reason takes the rest, on one line; the
        detail line below says it in full); the plot shows each trial's arms' goal figure."""
        for c in range(self.results_model.columnCount() - 1):
            self.table.resizeColumnToContents(c)
        self.table.resizeRowsToContents()
        self._on_live_row_changed()
        goal = self._live_goal or self.live.goal.currentText()
        inc = [(r.step, r.figure("incumbent", goal)) for r in self._live_rows]
        cand = [(r.step, r.figure("candidate", goal), r.result) for r in self._live_rows]
        inc_ = [(x, y) for x, y in inc if y is not None]
        cand_ = [(x, y, res) for x, y, res in cand if y is not None]
        self.incumbent_curve.setData([x for x, _ in inc_], [y for _, y in inc_])
        self.candidate_curve.setData(
            [x for x, _, _ in cand_],
            [y for _, y, _ in cand_],
            symbolBrush=[RESULT_COLORS.get(res, POINT) for _, _, res in cand_],
        )
        high = max([y for _, y in inc_] + [y for _, y, _ in cand_], default=0.0)
        self.plot.setXRange(0.5, max(len(self._live_rows), 1) + 0.5, padding=0)
        self.plot.setYRange(0, high * 1.2 if high > 0 else 1.0, padding=0.04)

    def _on_live_row_changed(self, *_: Any) -> None:
        """The detail line: the selected trial in full, else the latest."""
        if self._plot_mode != "live" or not self._live_rows:
            self.trial_detail.setText("")
            return
        i = self.table.selectionModel().currentIndex().row()
        row = self._live_rows[i] if 0 <= i < len(self._live_rows) else self._live_rows[-1]
        self.trial_detail.setText(row.detail)

    def _show_live(self) -> None:
        self.results_model.set_rows(self._live_rows, live_columns(self._live_until))
        self._live_changed()

    def _show_live_result(self, result: dict[str, Any]) -> None:
        """The chain's end: the instance's launch now, what the chain changed, the goal."""
        from quantdeck.core.bench.live_tune import until_text

        trials = result["trials"]
        ran = sum(1 for t in trials if t["result"] in ("promoted", "rolled back"))
        won = sum(1 for t in trials if t["result"] == "promoted")
        best = ", ".join(f"{k}={v}" for k, v in result["best"].items())
        changed = diff_text(result["changed"]) or "nothing"
        lines = [
            f"Final launch of {self.job.instance if self.job else 'the instance'}: {best} "
            f"(changed by the chain: {changed})."
        ]
        ended = f"; ended: {result['ended']}"
        if result.get("until"):
            goal = until_text(result["until"])
            if result.get("goal_met"):  # the chain ended there: its reason says how
                lines.append(f"Goal {goal}: {result['ended'].removeprefix('the goal: ')}.")
                ended = ""
            else:
                lines.append(f"Goal {goal}: not met (no promoted launch met every limit).")
        lines.append(
            f"{ran} trial{'' if ran == 1 else 's'} in {result['seconds']:.0f} s, {won} promoted, "
            f"{len(trials) - ran} not run{ended}."
        )
        self.tune_summary.setText("\n".join(lines))
        launch = "\n".join(f"{k}: {v}" for k, v in result["launch"].items())
        self.tune_summary.setToolTip(f"The instance's launch now:\n{launch}")

    def _reset_plot(self) -> None:
        self._ttfts.clear()
        self._ttft_count = 0

    def _on_done(self, result: dict[str, Any]) -> None:
        from quantdeck.core.bench import environment, save_run

        kind = self.job_kind
        if kind == "live":  # the fleet saved each promoted launch as the instance's profile
            self.result = result
            self._show_live_result(result)
            self.status.setText(f"live tune done: {result['ended']}")
            return
        result.setdefault("env", environment(result.get("server_version")))
        label = self.label.text().strip() or None
        if kind == "tune":
            self._save_tuned(result)
            label = label or f"tune-{result['strategy']}"
        elif kind == "ab":
            label = label or "ab-" + "-vs-".join(a["label"] for a in result["arms"])
        path = save_run(result, label)
        self.result = result
        self.show_result(result)
        self.status.setText(
            f"{kind} done · saved {path.name}"
            + (f" · ended early: {result['ended_early']}" if result.get("ended_early") else "")
        )
        self.refresh_history()
        self.finished.emit(result)

    def _save_tuned(self, result: dict[str, Any]) -> None:
        """Save the best point as a profile and say so (its name, in plain view)."""
        from quantdeck.core.bench import apply_point
        from quantdeck.core.launch import profiles

        best = result.get("best")
        if not best or self._tune_base is None:
            self.tune_summary.setText("No point has a goodput: no profile saved.")
            return
        name = self.save_profile.text().strip() or time.strftime("tuned-%Y%m%d-%H%M%S")
        where = ""
        try:
            profiles.save_profile(name, apply_point(self._tune_base, best["values"]))
            self.saved_profile = name
            where = f" Saved as profile '{name}'."
        except QuantdeckError as e:
            where = f" Not saved as a profile: {e}"
        index = next(
            (i for i, p in enumerate(result["points"], 1) if p["values"] == best["values"]), "?"
        )
        meets = "meets" if best.get("meets") else "misses"
        self.tune_summary.setText(
            f"Best: point {index} ({_values_text(best['values'])}), goodput "
            f"{best['goodput']:.2f} req/s, {meets} the p99 targets.{where}"
        )
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
        self.run_button.setEnabled(True)
        self.cancel_button.setEnabled(False)
        self.job = None

    # -- A/B arms ------------------------------------------------------------------------------
    def _on_arms_changed(self, *_: Any) -> None:
        """Show what each arm changes against the Launch tab's config, and refuse (in plain
        view) arms that cannot be told apart."""
        from quantdeck.core.bench import check_arms, knob_diff, parse_arm

        try:
            base = self._launch_config()
        except QuantdeckError as e:
            self.arm_diffs.setText("")
            self.arm_warning.setText(f"the Launch tab's config: {e}")
            return
        notes, arms = [], []
        for line in self.arms.toPlainText().splitlines():
            if not line.strip():
                continue
            try:
                arm = parse_arm(line, base)
            except QuantdeckError as e:
                notes.append(str(e))
                continue
            arms.append(arm)
            notes.append(
                f"{arm.label}: {diff_text(knob_diff(base, arm.config)) or 'same as the Launch tab'}"
            )
        warning = ""
        try:
            check_arms(arms)
        except QuantdeckError as e:
            warning = f"Run refuses: {e}"
        if len(arms) < 2 and not warning:
            warning = "Run refuses: an A/B comparison needs at least two arms"
        self.arm_diffs.setText("vs the Launch tab:\n" + "\n".join(notes) if notes else "")
        self.arm_warning.setText(warning)
        self.arm_warning.setVisible(bool(warning))

    def showEvent(self, event: QShowEvent) -> None:
        """The Launch tab's config may have changed meanwhile: the arms' diffs follow it."""
        super().showEvent(event)
        self._on_arms_changed()
        if self.tune_where.currentText() == TUNE_LIVE:  # the Fleet tab's fleet may have changed
            self.refresh_instances()

    # -- showing results -----------------------------------------------------------------------
    def _set_plot_mode(self, mode: str) -> None:
        """``ttft``: each request's TTFT, live; ``tune``: goodput per tuning point; ``live``:
        each live trial's goal figure, both arms."""
        if mode == "live":
            self._plot_mode = mode
            self.curve.setVisible(False)
            for item in (self.goodput_curve, self.no_goodput_curve, self.best_marker):
                item.setVisible(False)
            self.best_text.setVisible(False)
            self.incumbent_curve.setVisible(True)
            self.candidate_curve.setVisible(True)
            self.table.setWordWrap(False)  # one line a trial: the detail line says it in full
            self.trial_detail.setVisible(True)
            self.apply_button.setVisible(False)  # the fleet saves the instance's profile
            goal = GOAL_FIGURES[self._live_goal or self.live.goal.currentText()]
            self.plot.setTitle(f"{goal.title} per trial: ○ incumbent, ● candidate", color=PLOT_TEXT)
            self.plot.setLabel("bottom", "trial")
            self.plot.getAxis("bottom").setTickSpacing(1, 1)
            self.plot.setLabel("left", goal.title, units=goal.unit)
            self.plot.getAxis("left").enableAutoSIPrefix(False)  # 2500 ms, not 2.5 kms
            return
        self.plot.getAxis("left").enableAutoSIPrefix(True)
        self.table.setWordWrap(True)
        self.trial_detail.setVisible(False)
        self.apply_button.setVisible(self._apply_profile is not None)
        self.incumbent_curve.setVisible(False)
        self.candidate_curve.setVisible(False)
        if mode == self._plot_mode:
            return
        self._plot_mode = mode
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

    def _show_tune(self, points: Sequence[TunePoint], best: int | None = None) -> None:
        """The tuning points in the table and the plot, the best one marked (``best``: its
        index; None: the best so far)."""
        best = best_point(points) if best is None else best
        rows = [TunePoint(p.index, p.values, p.result, p.index == best) for p in points]
        self.results_model.set_rows(rows, tune_columns(self._tune_knobs))
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
        self.plot.setXRange(0.5, max(len(rows), self._planned, 1) + 0.5, padding=0)
        # a little room below 0: the × of a point without goodput stays clear of the axis
        self.plot.setYRange(0, high * 1.25 if high > 0 else 1.0, padding=0.04)

    def show_result(self, result: dict[str, Any]) -> None:
        if result.get("kind") == "tune":
            points = [TunePoint(i, p["values"], p) for i, p in enumerate(result["points"], start=1)]
            best = result.get("best")
            index = next((p.index for p in points if best and p.values == best["values"]), None)
            self._tune_knobs = list(result.get("space") or self._tune_knobs)
            self._set_plot_mode("tune")
            self._show_tune(points, best=index if index is not None else -1)
            return
        rows: Sequence[Metric]
        if result.get("kind") == "ab":
            rows = AB_METRICS
            series = [
                (
                    a["label"],
                    {
                        **(a.get("result") or {}),
                        "vs_launch": self._arm_diffs.get(a["label"]),
                        "error": a.get("error") or a.get("skipped"),
                    },
                )
                for a in result["arms"]
            ]
        else:
            rows, series = METRICS, [("value", result)]
        self.results_model.set_rows(
            rows, [METRIC_COLUMN, *(series_column(name, d) for name, d in series)]
        )
        self.table.resizeColumnsToContents()

    def refresh_history(self) -> None:
        from quantdeck.core.bench import list_runs

        self.runs_model.set_rows(list_runs())

    def _selected_runs(self) -> list[dict[str, Any]]:
        from quantdeck.core.bench import load_run

        rows = self.history.selectionModel().selectedRows()
        return [load_run(self.runs_model.row(i.row())) for i in rows]

    def compare_selected(self) -> None:
        from quantdeck.core.bench import compare

        try:
            runs = self._selected_runs()
        except QuantdeckError as e:
            self.status.setText(str(e))
            return
        if len(runs) != 2 or any(r.get("kind") in ("ab", "tune") for r in runs):
            self.status.setText("select two benchmark runs to compare")
            return
        self.results_model.set_rows(
            compare(*runs), compare_columns(runs[0]["label"], runs[1]["label"])
        )
        self.table.resizeColumnsToContents()

    def write_report(self, folder: str | Path) -> Path | None:
        from quantdeck.gui.report import write_report

        try:
            runs = self._selected_runs()
            if not runs:
                self.status.setText("select runs in the history first")
                return None
            index = write_report(runs, Path(folder))
        except QuantdeckError as e:  # e.g. a folder Quantdeck did not make: refused, untouched
            self.status.setText(str(e))
            return None
        self.status.setText(f"report: {index}")
        return index

    def _ask_report(self) -> None:
        from PySide6.QtWidgets import QFileDialog

        folder = QFileDialog.getExistingDirectory(self, "Report folder")
        if folder:
            self.write_report(folder)
