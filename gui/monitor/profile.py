"""The Monitor tab's Trace page: capture N engine steps of the running server with vLLM's
torch profiler, or open a trace file, and read its summary.

The capture is :func:`quantdeck.core.monitor.trace_capture.profile_server`, the one
``quantdeck trace`` runs, in a worker (:mod:`quantdeck.gui.workers`); the worker returns plain
data and the panel shows it on the GUI thread. It needs a server started with the Profiler knob
(``server.profiler``), whose ``profiler_dir`` fact names the folder vLLM writes its traces in;
for any other server the button is disabled and says so. The tables are the summary's top
operators by time and by launch count (:func:`quantdeck.core.monitor.profile.summarize_trace`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from PySide6.QtCore import QUrl
from PySide6.QtGui import QDesktopServices
from PySide6.QtWidgets import (
    QFileDialog,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QSpinBox,
    QSplitter,
    QVBoxLayout,
    QWidget,
)

from quantdeck.core.events import Event, FactEvent, StateEvent
from quantdeck.core.monitor.profile import OpRow, TraceSummary
from quantdeck.gui.labels import plain_label
from quantdeck.gui.style import CAVEAT_SHEET, HINT_SHEET
from quantdeck.gui.table_model import Column, ObjectTableModel, row_table

NO_PROFILER = (
    "This server runs without vLLM's profiler: turn on the Profiler knob on Launch "
    "(server.profiler) and start it again"
)
NO_SERVER = "Start a server with the Profiler knob on Launch (server.profiler) to trace it"
PERFETTO_HINT = "open a .pt.trace.json.gz in https://ui.perfetto.dev or chrome://tracing"

OP_COLUMNS: tuple[Column[OpRow], ...] = (
    Column("operator", lambda r: r.name, tooltip=lambda r: r.name),
    Column("where", lambda r: r.where),
    Column("calls", lambda r: f"{r.count:,}", align_right=True),
    Column("total ms", lambda r: f"{r.total_us / 1000:.3f}", align_right=True),
    Column("mean µs", lambda r: f"{r.mean_us:.1f}", align_right=True),
)


def _ms(us: float) -> str:
    return f"{us / 1000:.2f} ms"


class ProfilePanel(QWidget):
    """Steps, Trace…, Open trace…; the figures and the two rankings; the trace's folder."""

    def __init__(self, controller: Any, parent: QWidget | None = None) -> None:
        """``controller``: the window's :class:`~quantdeck.gui.server_control.
        QtServerController` (its URL, model, key, ``profiler_dir`` and ``event`` signal)."""
        super().__init__(parent)
        self.controller = controller
        self.summary: TraceSummary | None = None
        self.files: list[Path] = []
        self._workers: Any = None
        self.steps = QSpinBox()
        self.steps.setRange(1, 256)
        self.steps.setValue(4)
        self.steps.setPrefix("steps: ")
        self.steps.setToolTip("Engine steps to record (vLLM stops recording after them)")
        self.profile_button = QPushButton("Trace…")
        self.open_button = QPushButton("Open trace…")
        self.open_button.setToolTip("Sum up a .pt.trace.json(.gz) file vLLM's profiler wrote")
        self.folder_button = QPushButton("Open trace folder")
        self.folder_button.setEnabled(False)
        self.folder_button.setToolTip(PERFETTO_HINT)
        self.status = plain_label("")
        self.status.setWordWrap(True)
        self.figures = plain_label("No trace yet.")
        self.figures.setWordWrap(True)
        self.hint = plain_label(f"Traces: {PERFETTO_HINT}.")
        self.hint.setStyleSheet(HINT_SHEET)
        self.by_time: ObjectTableModel[OpRow] = ObjectTableModel(OP_COLUMNS, self)
        self.by_count: ObjectTableModel[OpRow] = ObjectTableModel(OP_COLUMNS, self)
        tables = QSplitter()
        for title, model in (("Top by time", self.by_time), ("Top by launch count", self.by_count)):
            box = QWidget()
            lay = QVBoxLayout(box)
            lay.setContentsMargins(0, 0, 0, 0)
            head = QLabel(f"<b>{title}</b>")
            lay.addWidget(head)
            view = row_table(model)
            view.setObjectName(title)
            lay.addWidget(view, 1)
            tables.addWidget(box)
        self.reason = plain_label("")
        self.reason.setWordWrap(True)
        self.reason.setStyleSheet(CAVEAT_SHEET)
        bar = QHBoxLayout()
        for w in (self.steps, self.profile_button, self.open_button, self.folder_button):
            bar.addWidget(w)
        bar.addWidget(self.reason, 1)
        lay = QVBoxLayout(self)
        lay.addLayout(bar)
        lay.addWidget(self.status)
        lay.addWidget(self.figures)
        lay.addWidget(tables, 1)
        lay.addWidget(self.hint)
        self.profile_button.clicked.connect(self.profile)
        self.open_button.clicked.connect(self._ask_open)
        self.folder_button.clicked.connect(self.open_folder)
        controller.event.connect(self._on_server_event)
        self._busy = False
        self._update_button()

    # -- the server --------------------------------------------------------------------------
    def _on_server_event(self, ev: Event) -> None:
        if isinstance(ev, StateEvent | FactEvent):
            self._update_button()

    def _update_button(self) -> None:
        c = self.controller
        ready = c.state == "ready" and c.url is not None
        folder = getattr(c, "profiler_dir", None)
        ok = ready and folder is not None and not self._busy
        self.profile_button.setEnabled(ok)
        if self._busy:
            tip = "Tracing…"
        elif folder is None:
            tip = NO_PROFILER if c.state in ("ready", "attached") else NO_SERVER
        elif not ready:
            tip = "The server is not ready yet"
        else:
            tip = f"Record {self.steps.value()} engine steps with vLLM's torch profiler"
        self.profile_button.setToolTip(tip)
        # why it cannot trace, said beside the button (not only in its tooltip)
        self.reason.setText("" if ok or self._busy else tip)

    def _workers_set(self) -> Any:
        if self._workers is None:
            from quantdeck.gui.workers import WorkerSet

            self._workers = WorkerSet(self._on_error)
        return self._workers

    def profile(self) -> None:
        """Capture the steps in a worker (the same capture as ``quantdeck trace``)."""
        c = self.controller
        folder = getattr(c, "profiler_dir", None)
        if c.url is None or folder is None:
            self.status.setText(NO_PROFILER)
            return
        from quantdeck.core.monitor.trace_capture import profile_server

        steps = self.steps.value()
        self._busy = True
        self._update_button()
        self.status.setText(f"Tracing {steps} engine steps…")
        self._workers_set().start(
            profile_server,
            c.url,
            folder,
            steps=steps,
            model=c.model_name,
            api_key=c.api_key,
            returned=self._on_captured,
            finished=self._on_finished,
        )

    def _on_captured(self, cap: Any) -> None:
        self.files = list(cap.files)
        if not cap.summaries:
            self.status.setText("The capture wrote no engine trace")
            return
        self.status.setText(
            f"Captured {len(cap.files)} trace file(s) in {Path(cap.files[0]).parent}"
        )
        self.show_summary(cap.summaries[0])

    def _on_finished(self) -> None:
        self._busy = False
        self._update_button()

    def _on_error(self, msg: str) -> None:
        self.status.setText(msg)

    # -- a trace file ------------------------------------------------------------------------
    def _ask_open(self) -> None:
        path, _ = QFileDialog.getOpenFileName(
            self,
            "Open a trace",
            str(getattr(self.controller, "profiler_dir", None) or ""),
            "Chrome traces (*.pt.trace.json *.pt.trace.json.gz *.json *.json.gz);;All files (*)",
        )
        if path:
            self.open_trace(path)

    def open_trace(self, path: str | Path) -> Any:
        """Sum up a trace file in a worker; returns the worker."""
        from quantdeck.core.monitor.profile import summarize_trace

        self.status.setText(f"Reading {Path(path).name}…")
        self.files = [Path(path)]
        return self._workers_set().start(summarize_trace, str(path), returned=self._on_read)

    def _on_read(self, s: TraceSummary) -> None:
        self.status.setText("")
        self.show_summary(s)

    def show_summary(self, s: TraceSummary) -> None:
        """The figures and the two rankings of ``s``."""
        self.summary = s
        device = _ms(s.device_us) if s.device_us else "none (a CPU trace: no kernels)"
        self.figures.setText(
            f"{Path(s.path).name}\n"
            f"Engine steps covered: {s.steps} ({_ms(s.step_us)}) · span {_ms(s.span_us)} · "
            f"host time {_ms(s.host_us)} · device time {device} · {s.events:,} events"
        )
        self.by_time.set_rows(s.by_time)
        self.by_count.set_rows(s.by_count)
        self.folder_button.setEnabled(True)
        self.folder_button.setToolTip(f"{Path(s.path).parent}: {PERFETTO_HINT}")

    def trace_folder(self) -> Path | None:
        return Path(self.summary.path).parent if self.summary is not None else None

    def open_folder(self) -> bool:
        folder = self.trace_folder()
        if folder is None:
            return False
        return bool(QDesktopServices.openUrl(QUrl.fromLocalFile(str(folder))))

    def shutdown(self, timeout: float = 30.0) -> None:
        if self._workers is not None:
            self._workers.quit()
            self._workers.wait(timeout)
