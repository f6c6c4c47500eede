"""The Convert tab: pick a target format, Convert, watch the job, then Launch the result.

Jobs are :class:`quantdeck.core.convert.JobQueue` jobs (one subprocess each, hard cancel). The
queue runs them in its own thread; its observer only emits the tab's ``job_event`` signal, which
Qt queues to the GUI thread. The quality check runs in a superqt worker. The job table is an
item model over the jobs (:data:`JOB_COLUMNS`)."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QComboBox,
    QFileDialog,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QProgressBar,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from quantdeck.core.convert import METHODS, JobQueue, QuantSpec
from quantdeck.core.errors import QuantdeckError
from quantdeck.core.events import Event, ProgressEvent, StateEvent
from quantdeck.core.launch import DeviceFacts
from quantdeck.gui.engine_picker import EnginePicker
from quantdeck.gui.labels import plain_label
from quantdeck.gui.table_model import Column, ObjectTableModel, row_table

if TYPE_CHECKING:
    from quantdeck.gui.workers import WorkerSet

# Lines the job log keeps: the oldest go first.
MAX_LOG_LINES = 2000


@dataclass
class JobRow:
    """A conversion job as the table shows it: the core job and what its events said so far
    (written on the GUI thread only; the job itself changes in the queue's thread)."""

    job: Any  # quantdeck.core.convert.jobs.Job
    state: str = "queued"
    stage: str = ""
    pct: float = 0.0
    started: float | None = None  # when it began running
    eta: str = "-"
    result: str = ""


JOB_COLUMNS: tuple[Column[JobRow], ...] = (
    Column("job", lambda r: str(r.job.id), align_right=True),
    Column("model", lambda r: Path(r.job.spec.src).name, tooltip=lambda r: str(r.job.spec.src)),
    Column("format", lambda r: r.job.spec.method),
    Column("state", lambda r: r.state),
    Column("stage", lambda r: r.stage),
    Column("%", lambda r: f"{r.pct:.0f}", value=lambda r: r.pct),
    Column("ETA", lambda r: r.eta, align_right=True),
    Column("result", lambda r: r.result, tooltip=lambda r: r.result),
)


def eta_text(started: float | None, pct: float, now: float | None = None) -> str:
    """Remaining time from the elapsed time and the share done (linear)."""
    if started is None or pct < 3 or pct >= 100:
        return "-"
    elapsed = (now or time.time()) - started
    left = elapsed * (100 - pct) / pct
    return f"{left:.0f} s" if left < 120 else f"{left / 60:.1f} min"


class ConvertTab(QWidget):
    launch_requested = Signal(str)  # the converted model's folder
    job_finished = Signal(object)  # quantdeck.core.convert.jobs.Job
    quality_checked = Signal(object, dict)  # job, compare result
    job_event = Signal(object, object)  # job, its Event: emitted on the JobQueue's thread

    def __init__(
        self,
        source: Callable[[], str | None],
        device: DeviceFacts,
        parent: QWidget | None = None,
        *,
        jobs: JobQueue | None = None,
    ) -> None:
        """``source()`` gives the model selected in the library."""
        super().__init__(parent)
        self._source = source
        self.device = device
        self.jobs = jobs or JobQueue()
        # queued: the slot runs on the GUI thread, in the order the queue emitted
        self.job_event.connect(self._on_job_event, Qt.ConnectionType.QueuedConnection)
        self._unsubscribe = self.jobs.subscribe(self.job_event.emit)
        self._workers: WorkerSet | None = None

        self.source_label = QLabel()
        self.method = QComboBox()
        for m in METHODS.values():
            self.method.addItem(f"{m.name} — {m.note}", m.name)
        self.method_note = plain_label()
        self.method_note.setWordWrap(True)
        self.out = QLineEdit()
        self.calib = QLineEdit()
        self.calib.setPlaceholderText("shipped calibration text")
        self.calib_button = QPushButton("…")
        self.samples = QSpinBox()
        self.samples.setRange(1, 100000)
        self.samples.setValue(64)
        self.seq_len = QSpinBox()
        self.seq_len.setRange(16, 1 << 16)
        self.seq_len.setValue(256)
        # the engine that converts: it needs torch and the format's library (the Launch tab's
        # picker lists the same engines; each remembers its own choice)
        self.engine_box = EnginePicker(
            "The Python that converts and checks quality (torch and the format's library): "
            "register others with `quantdeck engines add PATH`"
        )
        calib_row = QHBoxLayout()
        calib_row.addWidget(self.calib, 1)
        calib_row.addWidget(self.calib_button)
        form = QFormLayout()
        form.addRow("Model", self.source_label)
        form.addRow("Engine", self.engine_box)
        form.addRow("Format", self.method)
        form.addRow("", self.method_note)
        form.addRow("Output folder", self.out)
        form.addRow("Calibration file", calib_row)
        form.addRow("Samples", self.samples)
        form.addRow("Sequence length", self.seq_len)
        self.convert_button = QPushButton("Convert")
        self.cancel_button = QPushButton("Cancel job")
        self.cancel_button.setEnabled(False)  # a queued or running job selected
        self.launch_button = QPushButton("Launch converted model")
        self.launch_button.setEnabled(False)
        self.quality_button = QPushButton("Check quality")
        self.quality_button.setToolTip(
            "KL divergence, top-1 agreement and perplexity against "
            "the source on held-out text (quantdeck compare)"
        )
        self.quality_button.setEnabled(False)
        self.quality_worker: Any = None
        self.log = QPlainTextEdit()
        self.log.setReadOnly(True)
        self.log.setMaximumBlockCount(MAX_LOG_LINES)
        self.message = plain_label()
        self.message.setWordWrap(True)
        self.progress = QProgressBar()
        self.jobs_model: ObjectTableModel[JobRow] = ObjectTableModel(JOB_COLUMNS, self)
        self.table = row_table(self.jobs_model, "%")
        buttons = QHBoxLayout()
        for b in (self.convert_button, self.cancel_button, self.launch_button, self.quality_button):
            buttons.addWidget(b)
        buttons.addStretch(1)
        lay = QVBoxLayout(self)
        lay.addLayout(form)
        lay.addLayout(buttons)
        lay.addWidget(self.progress)
        lay.addWidget(self.message)
        lay.addWidget(self.table, 2)
        lay.addWidget(self.log, 1)

        self.method.currentIndexChanged.connect(self._on_method_changed)
        self.calib_button.clicked.connect(self._pick_calib)
        self.convert_button.clicked.connect(self.convert)
        self.cancel_button.clicked.connect(self.cancel_selected)
        self.launch_button.clicked.connect(self._launch_selected)
        self.quality_button.clicked.connect(self.check_quality)
        self.table.selectionModel().selectionChanged.connect(self._on_selection)
        self.source_changed()

    # -- form --------------------------------------------------------------------------------
    def source_changed(self) -> None:
        src = self._source()
        self.source_label.setText(src or "— select a model in the library —")
        self._on_method_changed()

    def _on_method_changed(self, *_: Any) -> None:
        from quantdeck.core.convert import serving_note
        from quantdeck.core.models import inspect_model

        m = METHODS[self.method.currentData()]
        src = self._source()
        if src:
            self.out.setText(str(Path(src).parent / f"{Path(src).name}-{m.name}"))
        # what the Launch tab's advisor will say about the result, on this device
        try:
            note = serving_note(m.name, inspect_model(src), self.device) if src else None
        except QuantdeckError:
            note = None
        if note is None:
            where = "select a model to see whether the result serves here"
        elif note.problem:
            where = f"cannot serve here: {note.problem}"
        else:
            where = "serves on this machine's vLLM" + "".join(f"; {n}" for n in note.notes)
        self.method_note.setText(f"{m.bits}-bit, {m.quant_method}; {where}.")

    def _pick_calib(self) -> None:
        path, _ = QFileDialog.getOpenFileName(
            self, "Calibration text", "", "Text (*.txt *.jsonl);;All files (*)"
        )
        if path:
            self.calib.setText(path)

    def spec(self) -> QuantSpec:
        src = self._source()
        if not src:
            raise QuantdeckError("select a model in the library first")
        return QuantSpec(
            src=src,
            method=self.method.currentData(),
            out=self.out.text().strip(),
            calib=self.calib.text().strip() or None,
            samples=self.samples.value(),
            seq_len=self.seq_len.value(),
        )

    # -- jobs --------------------------------------------------------------------------------
    def convert(self) -> Any:
        try:
            job = self.jobs.submit(self.spec(), python=self.engine_box.python())
        except QuantdeckError as e:
            self.message.setText(str(e))
            return None
        row = self._row_of(job)
        self.table.selectRow(row)
        self.message.setText(f"job {job.id} queued: {job.spec.method} -> {job.spec.out}")
        return job

    def _row_of(self, job: Any) -> int:
        """The job's row (added on first sight: by convert(), or by an event that came first)."""
        i = self.jobs_model.find(lambda r: r.job.id == job.id)
        return i if i >= 0 else self.jobs_model.append(JobRow(job))

    def selected_job(self) -> Any:
        rows = self.table.selectionModel().selectedRows()
        return self.jobs_model.row(rows[0].row()).job if rows else None

    def cancel_selected(self) -> None:
        job = self.selected_job()
        if job is not None and job.state in ("queued", "running"):
            self.jobs.cancel(job.id)
            self.message.setText(f"job {job.id}: cancelling…")

    def _on_selection(self, *_: Any) -> None:
        job = self.selected_job()
        done = job is not None and job.state == "done"
        self.cancel_button.setEnabled(job is not None and job.state in ("queued", "running"))
        self.launch_button.setEnabled(done)
        self.quality_button.setEnabled(done and self.quality_worker is None)

    def check_quality(self) -> None:
        """Run the quality check of the selected finished job in a worker."""
        from quantdeck.core.convert import compare_quality

        job = self.selected_job()
        if job is None or job.state != "done" or not job.result:
            return
        if self._workers is None:  # superqt is imported on first use: after the first paint
            from quantdeck.gui.workers import WorkerSet

            self._workers = WorkerSet(lambda msg: self._log(f"quality check: {msg}"))
        self.quality_button.setEnabled(False)
        self._log(f"job {job.id}: quality check against {job.spec.src} …")
        src, out, python = job.spec.src, job.result.out, job.python
        # compare_quality has no cancel (a subprocess): the worker ticks, so that quit() ends it
        self.quality_worker = self._workers.follow(
            lambda: compare_quality(src, out, max_tokens=1024, python=python),
            tick_s=0.25,
            returned=functools.partial(self._on_quality, job),
            finished=self._on_quality_finished,
        )

    def _on_quality(self, job: Any, res: dict[str, Any]) -> None:
        text = (
            f"KL {res['kl_mean']:.4f} · top-1 {res['top1_agreement']:.1%} · ppl "
            f"{res['ppl_orig']:.1f} -> {res['ppl_quant']:.1f}"
        )
        i = self._row_of(job)
        self.jobs_model.row(i).result += " · " + text
        self.jobs_model.row_changed(i)
        self._log(f"job {job.id}: {text} ({res['tokens']} tokens)")
        self.quality_checked.emit(job, res)

    def _on_quality_finished(self) -> None:
        self.quality_worker = None
        self._on_selection()

    def _log(self, line: str) -> None:
        self.log.appendPlainText(time.strftime("%H:%M:%S ") + line)

    def _launch_selected(self) -> None:
        job = self.selected_job()
        if job is not None and job.state == "done" and job.result:
            self.launch_requested.emit(job.result.out)

    def _on_job_event(self, job: Any, ev: Event) -> None:
        i = self._row_of(job)
        row = self.jobs_model.row(i)
        ended = False
        match ev:
            case StateEvent(state=state, error=error):
                row.state = state
                self._log(
                    f"job {job.id}: {state}" + (f": {error}" if isinstance(error, str) else "")
                )
                if state == "running":
                    row.started = ev.t
                ended = state in ("done", "failed", "cancelled")
                if ended:
                    self._finish(row)
            case ProgressEvent(stage=stage, pct=pct, layer=layer, layers=layers, rss_bytes=rss):
                row.pct = float(pct)
                if layers and stage == "quantize":
                    stage += f" layer {layer}/{layers}"
                if row.stage != stage:
                    self._log(
                        f"job {job.id}: {stage} ({row.pct:.0f}%"
                        + (f", RSS {rss / 2**20:.0f} MiB" if rss else "")
                        + ")"
                    )
                row.stage = stage
                row.eta = eta_text(row.started, row.pct)
                self.progress.setValue(int(row.pct))
        self.jobs_model.row_changed(i)
        if isinstance(ev, StateEvent):
            self._on_selection()  # what the selected job allows (Cancel, Launch, Check)
        if ended:
            self.job_finished.emit(job)

    def _finish(self, row: JobRow) -> None:
        job = row.job
        row.eta = "-"
        if job.state == "done" and job.result:
            r = job.result
            row.pct = 100.0
            row.result = f"{r.scheme} · {r.ratio:.0%} of the source · {r.seconds:.0f} s"
            self.message.setText(f"job {job.id} done: {r.out}")
            self.progress.setValue(100)
        elif job.state == "failed":
            row.result = job.error or "failed"
            self.message.setText(f"job {job.id} failed: {job.error}")
        else:
            row.result = "cancelled: nothing written"
            self.message.setText(f"job {job.id} cancelled")

    def shutdown(self, timeout: float = 10.0) -> None:
        """Cancel the jobs and the quality check, and wait for them (the window is closing)."""
        if self._workers is not None:
            self._workers.quit()
        self.jobs.close()
        self._unsubscribe()
        if self._workers is not None:
            self._workers.wait(timeout)
