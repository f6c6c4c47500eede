"""The Convert tab: pick a target format, Convert, watch the job, then Launch the result.

Jobs are :class:`quantdeck.core.convert.JobQueue` jobs (one subprocess each, hard cancel); its
observer runs on the queue's worker thread and only puts events in a queue, which a QTimer
drains."""

from __future__ import annotations

import queue
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from PySide6.QtCore import QTimer, Signal
from PySide6.QtWidgets import (
    QAbstractItemView,
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
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from quantdeck.core.convert import METHODS, JobQueue, QuantSpec
from quantdeck.core.errors import QuantdeckError
from quantdeck.core.launch import DeviceFacts

COLUMNS = ("job", "model", "format", "state", "stage", "%", "ETA", "result")


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
        self._events: queue.Queue[tuple[Any, dict[str, Any]]] = queue.Queue()
        self.jobs.subscribe(lambda job, ev: self._events.put((job, ev)))
        self._rows: dict[int, int] = {}
        self._started: dict[int, float] = {}

        self.source_label = QLabel()
        self.method = QComboBox()
        for m in METHODS.values():
            self.method.addItem(f"{m.name} — {m.note}", m.name)
        self.method_note = QLabel()
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
        calib_row = QHBoxLayout()
        calib_row.addWidget(self.calib, 1)
        calib_row.addWidget(self.calib_button)
        form = QFormLayout()
        form.addRow("Model", self.source_label)
        form.addRow("Format", self.method)
        form.addRow("", self.method_note)
        form.addRow("Output folder", self.out)
        form.addRow("Calibration file", calib_row)
        form.addRow("Samples", self.samples)
        form.addRow("Sequence length", self.seq_len)
        self.convert_button = QPushButton("Convert")
        self.cancel_button = QPushButton("Cancel job")
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
        self.log.setMaximumBlockCount(2000)
        self._last_stage: dict[int, str] = {}
        self.message = QLabel()
        self.message.setWordWrap(True)
        self.progress = QProgressBar()
        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setHorizontalHeaderLabels(list(COLUMNS))
        self.table.setSelectionBehavior(QAbstractItemView.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SingleSelection)
        self.table.verticalHeader().setVisible(False)
        self.table.horizontalHeader().setStretchLastSection(True)
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
        self.table.itemSelectionChanged.connect(self._on_selection)
        self.timer = QTimer(self)
        self.timer.setInterval(100)
        self.timer.timeout.connect(self._drain)
        self.timer.start()
        self.source_changed()

    # -- form --------------------------------------------------------------------------------
    def source_changed(self) -> None:
        src = self._source()
        self.source_label.setText(src or "— select a model in the library —")
        self._on_method_changed()

    def _on_method_changed(self, *_: Any) -> None:
        m = METHODS[self.method.currentData()]
        src = self._source()
        if src:
            self.out.setText(str(Path(src).parent / f"{Path(src).name}-{m.name}"))
        where = (
            "serves on this machine's vLLM"
            if (m.serves_on_cpu or self.device.is_cuda)
            else "cannot serve on this CPU (no kernel): convert here, serve it on a GPU"
        )
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
            job = self.jobs.submit(self.spec())
        except QuantdeckError as e:
            self.message.setText(str(e))
            return None
        row = self.table.rowCount()
        self.table.insertRow(row)
        self._rows[job.id] = row
        for col, text in enumerate(
            (str(job.id), Path(job.spec.src).name, job.spec.method, "queued", "", "0", "-", "")
        ):
            self.table.setItem(row, col, QTableWidgetItem(text))
        bar = QProgressBar()
        bar.setRange(0, 100)
        self.table.setCellWidget(row, 5, bar)
        self.table.selectRow(row)
        self.message.setText(f"job {job.id} queued: {job.spec.method} -> {job.spec.out}")
        return job

    def selected_job(self) -> Any:
        rows = {i.row() for i in self.table.selectedItems()}
        for job_id, row in self._rows.items():
            if row in rows:
                return self.jobs.jobs[job_id]
        return None

    def cancel_selected(self) -> None:
        job = self.selected_job()
        if job is not None and job.state in ("queued", "running"):
            self.jobs.cancel(job.id)
            self.message.setText(f"job {job.id}: cancelling…")

    def _on_selection(self) -> None:
        job = self.selected_job()
        done = job is not None and job.state == "done"
        self.launch_button.setEnabled(done)
        self.quality_button.setEnabled(done and self.quality_worker is None)

    def check_quality(self) -> None:
        """Run the quality check of the selected finished job in a worker."""
        from superqt.utils import create_worker

        from quantdeck.core.convert import compare_quality

        job = self.selected_job()
        if job is None or job.state != "done" or not job.result:
            return
        self.quality_button.setEnabled(False)
        self._log(f"job {job.id}: quality check against {job.spec.src} …")
        worker = create_worker(compare_quality, job.spec.src, job.result["out"], max_tokens=1024)
        worker.returned.connect(lambda res, j=job: self._on_quality(j, res))
        worker.errored.connect(lambda e, j=job: self._log(f"job {j.id}: {e}"))
        worker.finished.connect(self._on_quality_finished)
        self.quality_worker = worker
        worker.start()

    def _on_quality(self, job: Any, res: dict[str, Any]) -> None:
        text = (
            f"KL {res['kl_mean']:.4f} · top-1 {res['top1_agreement']:.1%} · ppl "
            f"{res['ppl_orig']:.1f} -> {res['ppl_quant']:.1f}"
        )
        row = self._rows.get(job.id)
        if row is not None:
            self.table.item(row, 7).setText(self.table.item(row, 7).text() + " · " + text)
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
            self.launch_requested.emit(job.result["out"])

    def _set(self, job: Any, col: int, text: str) -> None:
        row = self._rows.get(job.id)
        if row is not None:
            self.table.item(row, col).setText(text)

    def _drain(self) -> None:
        while True:
            try:
                job, ev = self._events.get_nowait()
            except queue.Empty:
                break
            kind = ev.kind
            if kind == "state":
                self._set(job, 3, ev.get("state"))
                self._log(
                    f"job {job.id}: {ev.get('state')}"
                    + (f": {ev.get('error')}" if ev.get("error") else "")
                )
                if ev.get("state") == "running":
                    self._started[job.id] = ev.get("t", time.time())
                if ev.get("state") in ("done", "failed", "cancelled"):
                    self._finish(job, ev)
            elif kind == "progress":
                pct = float(ev.get("pct", 0.0))
                stage = str(ev.get("stage", ""))
                if ev.get("layers") and stage == "quantize":
                    stage += f" layer {ev.get('layer')}/{ev.get('layers')}"
                self._set(job, 4, stage)
                self._set(job, 5, f"{pct:.0f}")
                bar = self.table.cellWidget(self._rows.get(job.id, -1), 5)
                if bar is not None:
                    bar.setValue(int(pct))
                if self._last_stage.get(job.id) != stage:
                    self._last_stage[job.id] = stage
                    rss = ev.get("rss_bytes")
                    self._log(
                        f"job {job.id}: {stage} ({pct:.0f}%"
                        + (f", RSS {rss / 2**20:.0f} MiB" if rss else "")
                        + ")"
                    )
                self._set(job, 6, eta_text(self._started.get(job.id), pct))
                self.progress.setValue(int(pct))

    def _finish(self, job: Any, ev: dict[str, Any]) -> None:
        self._set(job, 6, "-")
        if job.state == "done" and job.result:
            r = job.result
            ratio = r["bytes"] / r["source_bytes"] if r.get("source_bytes") else 0
            self._set(job, 5, "100")
            bar = self.table.cellWidget(self._rows[job.id], 5)
            if bar is not None:
                bar.setValue(100)
            self._set(job, 7, f"{r['scheme']} · {ratio:.0%} of the source · {r['seconds']:.0f} s")
            self.message.setText(f"job {job.id} done: {r['out']}")
            self.progress.setValue(100)
        elif job.state == "failed":
            self._set(job, 7, job.error or "failed")
            self.message.setText(f"job {job.id} failed: {job.error}")
        else:
            self._set(job, 7, "cancelled: nothing written")
            self.message.setText(f"job {job.id} cancelled")
        self.table.resizeColumnsToContents()
        self._on_selection()
        self.job_finished.emit(job)

    def shutdown(self) -> None:
        self.timer.stop()
        if self.quality_worker is not None:
            self.quality_worker.quit()
        self.jobs.close()
