"""The Benchmark tab: a load against the running server, A/B runs, auto-tuning, run history.

The jobs are core objects (:class:`quantdeck.core.bench.client.Bench`,
:class:`quantdeck.core.bench.ab.ABRun`, :class:`quantdeck.core.bench.tune.Tuner`), each run by a
generator worker (:meth:`quantdeck.gui.workers.WorkerSet.follow`): the job's callbacks put its
events in a queue that the worker's generator drains and yields in batches, which the ``yielded``
slot shows on the GUI thread (progress bar, live latency plot); nothing polls while it measures.
Cancel calls the job's thread-safe ``cancel()``: the run ends early and its partial result is
kept. ``shutdown()`` quits the worker: the job is cancelled and nothing is returned.

The results table and the run history are item models (:class:`ObjectTableModel`): the results
over :data:`METRICS` (a column per run, arm or tuning point), the history over the run files."""

from __future__ import annotations

import collections
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Signal
from PySide6.QtWidgets import (
    QAbstractItemView,
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListView,
    QPlainTextEdit,
    QProgressBar,
    QPushButton,
    QSpinBox,
    QSplitter,
    QTableView,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from quantdeck.core.errors import QuantdeckError
from quantdeck.core.events import (
    ArmServerEvent,
    BenchProgress,
    Event,
    ProgressEvent,
    StateEvent,
)
from quantdeck.core.launch import LaunchConfig
from quantdeck.gui.labels import plain_label
from quantdeck.gui.report import fmt as _fmt
from quantdeck.gui.table_model import Column, ObjectTableModel
from quantdeck.gui.workers import EventQueue, WorkerSet


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

# Requests the live TTFT plot shows: the newest (a 100 000-prompt run stays light to draw).
MAX_LIVE_POINTS = 10000


class BenchTab(QWidget):
    finished = Signal(dict)  # the result of the last job (bench, ab or tune)
    failed = Signal(str)

    def __init__(
        self,
        target: Callable[[], tuple[str | None, str | None, str | None]],
        launch_config: Callable[[], LaunchConfig],
        server_running: Callable[[], bool],
        parent: QWidget | None = None,
    ) -> None:
        """``target()`` gives (url, model, api_key) of the current server; ``launch_config()``
        the Launch tab's config (the base of A/B arms and tuning)."""
        super().__init__(parent)
        self._target, self._launch_config, self._server_running = (
            target,
            launch_config,
            server_running,
        )
        self.job: Any = None
        self.job_kind = "bench"
        self.worker: Any = None
        self.result: dict[str, Any] | None = None
        self._workers = WorkerSet(self._on_error)
        self._ttfts: collections.deque[float] = collections.deque(maxlen=MAX_LIVE_POINTS)
        self._ttft_count = 0  # requests plotted since the run (or arm, point) began

        # -- load ------------------------------------------------------------------------------
        self.concurrency = QSpinBox()
        self.concurrency.setRange(0, 4096)
        self.concurrency.setValue(8)
        self.concurrency.setSpecialValueText("unbounded")
        self.rate = QDoubleSpinBox()
        self.rate.setRange(0, 1e5)
        self.rate.setSpecialValueText("all at once")
        self.rate.setSuffix(" req/s")
        self.num_prompts = QSpinBox()
        self.num_prompts.setRange(1, 100000)
        self.num_prompts.setValue(32)
        self.input_len = QSpinBox()
        self.input_len.setRange(1, 1 << 20)
        self.input_len.setValue(128)
        self.output_len = QSpinBox()
        self.output_len.setRange(1, 1 << 20)
        self.output_len.setValue(64)
        self.dataset = QComboBox()
        self.dataset.addItem("English text", "corpus")
        self.dataset.addItem("random token ids (as vllm bench)", "random")
        self.dataset.setToolTip(
            "Synthetic prompts: windows of English text, or runs of token "
            "ids from random offsets as vllm bench serve's random dataset "
            "(read from the model's tokenizer.json)"
        )
        self.slo_ttft = QDoubleSpinBox()
        self.slo_tpot = QDoubleSpinBox()
        for w in (self.slo_ttft, self.slo_tpot):
            w.setRange(0, 1e7)
            w.setSuffix(" ms")
            w.setSpecialValueText("off")
        load = QFormLayout()
        load.addRow("Concurrency", self.concurrency)
        load.addRow("Request rate", self.rate)
        load.addRow("Prompts", self.num_prompts)
        load.addRow("Input tokens", self.input_len)
        load.addRow("Output tokens", self.output_len)
        load.addRow("Prompt text", self.dataset)
        load.addRow("SLO TTFT (goodput)", self.slo_ttft)
        load.addRow("SLO TPOT (goodput)", self.slo_tpot)

        # -- modes -----------------------------------------------------------------------------
        self.modes = QTabWidget()
        run_page = QWidget()
        self.label = QLineEdit()
        self.label.setPlaceholderText("run label (optional)")
        rl = QVBoxLayout(run_page)
        rl.addWidget(QLabel("Measures the server that runs now (Launch tab or attached)."))
        rl.addWidget(self.label)
        rl.addStretch(1)
        ab_page = QWidget()
        self.arms = QPlainTextEdit()
        self.arms.setPlaceholderText(
            "one arm per line: LABEL = OPTIONS\neager = --enforce-eager\ngraphs ="
        )
        self.arms.setPlainText("eager = --enforce-eager\ndefault =")
        al = QVBoxLayout(ab_page)
        al.addWidget(
            QLabel(
                "Each arm: the Launch tab's config with these options on top "
                "(a model path, --profile NAME, knobs); started, warmed, measured, "
                "stopped in turn."
            )
        )
        al.addWidget(self.arms)
        tune_page = QWidget()
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
        self.save_profile.setPlaceholderText("save best as profile (name, optional)")
        tl = QFormLayout(tune_page)
        tl.addRow("Space (KNOB = V1,V2)", self.space)
        tl.addRow("p99 TTFT target", self.tune_ttft)
        tl.addRow("p99 TPOT target", self.tune_tpot)
        tl.addRow("Max points", self.max_points)
        tl.addRow("", self.grid)
        tl.addRow("", self.save_profile)
        hist_page = QWidget()
        self.runs_model: ObjectTableModel[Path] = ObjectTableModel(RUN_COLUMNS, self)
        self.history = QListView()
        self.history.setModel(self.runs_model)
        self.history.setSelectionMode(QAbstractItemView.ExtendedSelection)
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
        self.plot = pg.PlotWidget(background="w")
        self.plot.setTitle("TTFT per request (live)", color="#333")
        self.plot.setLabel("bottom", "request (completion order)")
        self.plot.setLabel("left", "ms")
        self.curve = self.plot.plot(
            [], [], pen=None, symbol="o", symbolSize=5, symbolBrush="#4e79a7", symbolPen=None
        )
        self.results_model: ObjectTableModel[Any] = ObjectTableModel(
            (METRIC_COLUMN, series_column("value", {})), self
        )
        self.table = QTableView()
        self.table.setModel(self.results_model)
        self.table.verticalHeader().setVisible(False)
        self.table.horizontalHeader().setStretchLastSection(True)

        left = QWidget()
        ll = QVBoxLayout(left)
        ll.addLayout(load)
        ll.addWidget(self.modes, 1)
        bb = QHBoxLayout()
        bb.addWidget(self.run_button)
        bb.addWidget(self.cancel_button)
        ll.addLayout(bb)
        ll.addWidget(self.progress)
        ll.addWidget(self.status)
        right = QSplitter()
        right.setOrientation(pg.QtCore.Qt.Vertical)
        right.addWidget(self.plot)
        right.addWidget(self.table)
        split = QSplitter()
        split.addWidget(left)
        split.addWidget(right)
        split.setStretchFactor(1, 1)
        QVBoxLayout(self).addWidget(split)

        self.run_button.clicked.connect(self.run)
        self.cancel_button.clicked.connect(self.cancel)
        self.refresh_button.clicked.connect(self.refresh_history)
        self.compare_button.clicked.connect(self.compare_selected)
        self.report_button.clicked.connect(self._ask_report)
        self.refresh_history()

    # -- building the job ----------------------------------------------------------------------
    def load_spec(self) -> Any:
        from quantdeck.core.bench import LoadSpec

        return LoadSpec(
            num_prompts=self.num_prompts.value(),
            input_len=self.input_len.value(),
            output_len=self.output_len.value(),
            dataset=self.dataset.currentData(),
            concurrency=self.concurrency.value() or None,
            request_rate=self.rate.value() or math.inf,
        )

    def slo(self) -> dict[str, float]:
        return {
            k: w.value()
            for k, w in (("ttft", self.slo_ttft), ("tpot", self.slo_tpot))
            if w.value() > 0
        }

    def _make_job(self, on_event: Callable[[Event], None]) -> tuple[str, Any]:
        """The job the chosen mode runs, and its kind (bench, ab, tune); ``on_event`` gets its
        events (from the job's thread)."""
        mode = self.modes.tabText(self.modes.currentIndex())
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
        if self._server_running():
            raise QuantdeckError(
                "stop the running server first: A/B and tuning start their "
                "own servers, one at a time"
            )
        base = self._launch_config()
        if mode == "A/B":
            from quantdeck.core.bench import ABRun, parse_arm

            lines = [ln for ln in self.arms.toPlainText().splitlines() if ln.strip()]
            arms = [parse_arm(ln, base) for ln in lines]
            job = ABRun(arms, self.load_spec(), slo=self.slo(), on_event=on_event)
            return "ab", job
        from quantdeck.core.bench import Tuner, parse_space
        from quantdeck.core.launch import detect_device

        items = [ln for ln in self.space.toPlainText().splitlines() if ln.strip()]
        spec = self.load_spec()
        job = Tuner(
            base,
            spec,
            ttft_ms=self.tune_ttft.value(),
            tpot_ms=self.tune_tpot.value(),
            space=parse_space(items, detect_device(), spec.concurrency),
            strategy="grid" if self.grid.isChecked() else "coordinate",
            max_points=self.max_points.value(),
            on_event=on_event,
        )
        return "tune", job

    # -- running -----------------------------------------------------------------------------
    def run(self) -> None:
        events: EventQueue = EventQueue()
        try:
            kind, job = self._make_job(events.put)
        except QuantdeckError as e:
            self.status.setText(str(e))
            self.failed.emit(str(e))
            return
        self.job, self.job_kind = job, kind
        self._reset_plot()
        self.curve.setData([], [])
        self.progress.setValue(0)
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
        """End the run early; what it measured so far is its result."""
        if self.job is not None:
            self.job.cancel()
            self.status.setText("cancelling…")

    def shutdown(self, timeout: float = 30.0) -> None:
        """Quit the run (cancelled, no result) and wait for its worker (the window is closing)."""
        self._workers.quit()
        self._workers.wait(timeout)

    def _on_events(self, events: list[Event]) -> None:
        changed = False
        for ev in events:
            kind = ev.kind
            if kind == "progress":
                if ev.get("ttft_ms") is not None:
                    self._ttfts.append(ev.get("ttft_ms"))
                    self._ttft_count += 1
                    changed = True
                self.progress.setMaximum(ev.get("total"))
                self.progress.setValue(ev.get("done"))
            elif kind == "arm":
                self.status.setText(
                    f"arm {ev.get('index') + 1}/{ev.get('total')} "
                    f"{ev.get('label')}: {ev.get('stage')}"
                )
                if ev.get("stage") == "starting":
                    self._reset_plot()
                    changed = True
            elif kind == "point":
                vals = ", ".join(f"{k}={v}" for k, v in ev.get("values").items())
                self.status.setText(
                    f"point {ev.get('index')} ({vals}): {ev.get('stage')}"
                    + (
                        f" · goodput {ev.get('goodput'):.2f}"
                        if ev.get("goodput") is not None
                        else ""
                    )
                )
                if ev.get("stage") == "starting":
                    self._reset_plot()
                    changed = True
            elif isinstance(ev, ArmServerEvent):
                server = ev.server
                if isinstance(server, ProgressEvent):
                    self.status.setText(
                        f"arm {ev.index + 1}: server {server.stage} {server.pct:.0f}%"
                    )
                elif isinstance(server, StateEvent):
                    why = f": {server.get('reason')}" if server.get("reason") else ""
                    self.status.setText(f"arm {ev.index + 1}: server {server.state}{why}")
        if changed:
            n = self._ttft_count
            self.curve.setData(np.arange(n - len(self._ttfts), n), np.asarray(self._ttfts))

    def _reset_plot(self) -> None:
        self._ttfts.clear()
        self._ttft_count = 0

    def _on_done(self, result: dict[str, Any]) -> None:
        from quantdeck.core.bench import environment, save_run

        kind = self.job_kind
        result.setdefault("env", environment(result.get("server_version")))
        label = self.label.text().strip() or None
        if kind == "tune":
            best = result.get("best")
            name = self.save_profile.text().strip()
            if best and name:
                from quantdeck.core.bench import apply_point
                from quantdeck.core.launch import profiles

                profiles.save_profile(name, apply_point(self.job.base, best["values"]))
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

    def _on_error(self, msg: str) -> None:
        self.status.setText(msg)
        self.failed.emit(msg)

    def _on_finished(self) -> None:
        self.worker = None
        self.run_button.setEnabled(True)
        self.cancel_button.setEnabled(False)
        self.job = None

    # -- showing results -----------------------------------------------------------------------
    def show_result(self, result: dict[str, Any]) -> None:
        if result.get("kind") == "ab":
            series = [(a["label"], a.get("result") or {}) for a in result["arms"]]
        elif result.get("kind") == "tune":
            series = [
                (
                    ", ".join(f"{k}={v}" for k, v in p["values"].items()),
                    {**p, "request_goodput": p.get("goodput")},
                )
                for p in result["points"]
            ]
        else:
            series = [("value", result)]
        self.results_model.set_rows(
            METRICS, [METRIC_COLUMN, *(series_column(name, d) for name, d in series)]
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
