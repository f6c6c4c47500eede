"""The Benchmark tab's History page: the saved runs (an item model over their files), two of
them compared, an HTML report of those selected."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (
    QAbstractItemView,
    QHBoxLayout,
    QListView,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from quantdeck.core.bench.results import BenchResult, RunResult
from quantdeck.core.errors import QuantdeckError
from quantdeck.gui.bench.columns import RUN_COLUMNS, compare_columns
from quantdeck.gui.table_model import ObjectTableModel


class HistoryPage(QWidget):
    """The History page; what it has to say goes out by ``said`` (a status line), a
    comparison by ``compared`` (its rows and columns, for the results table)."""

    said = Signal(str)
    compared = Signal(object, object)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.runs_model: ObjectTableModel[Path] = ObjectTableModel(RUN_COLUMNS, self)
        self.history = QListView()
        self.history.setModel(self.runs_model)
        self.history.setSelectionMode(QAbstractItemView.SelectionMode.ExtendedSelection)
        self.compare_button = QPushButton("Compare two")
        self.report_button = QPushButton("HTML report…")
        self.refresh_button = QPushButton("Refresh")
        hl = QVBoxLayout(self)
        hl.addWidget(self.history, 1)
        hb = QHBoxLayout()
        for b in (self.refresh_button, self.compare_button, self.report_button):
            hb.addWidget(b)
        hl.addLayout(hb)
        self.refresh_button.clicked.connect(self.refresh)
        self.compare_button.clicked.connect(self.compare_selected)
        self.report_button.clicked.connect(self._ask_report)

    def refresh(self) -> None:
        from quantdeck.core.bench import list_runs

        self.runs_model.set_rows(list_runs())

    def _selected_runs(self) -> list[RunResult]:
        from quantdeck.core.bench import load_run

        rows = self.history.selectionModel().selectedRows()
        return [load_run(self.runs_model.row(i.row())) for i in rows]

    def compare_selected(self) -> None:
        from quantdeck.core.bench import compare

        try:
            runs = self._selected_runs()
        except QuantdeckError as e:
            self.said.emit(str(e))
            return
        if len(runs) != 2 or not all(isinstance(r, BenchResult) for r in runs):
            self.said.emit("select two benchmark runs to compare")
            return
        a, b = runs
        self.compared.emit(compare(a, b), compare_columns(a.name, b.name))

    def write_report(self, folder: str | Path) -> Path | None:
        from quantdeck.gui.report import write_report

        try:
            runs = self._selected_runs()
            if not runs:
                self.said.emit("select runs in the history first")
                return None
            index = write_report(runs, Path(folder))
        except QuantdeckError as e:  # e.g. a folder Quantdeck did not make: refused, untouched
            self.said.emit(str(e))
            return None
        self.said.emit(f"report: {index}")
        return index

    def _ask_report(self) -> None:
        from PySide6.QtWidgets import QFileDialog

        folder = QFileDialog.getExistingDirectory(self, "Report folder")
        if folder:
            self.write_report(folder)
