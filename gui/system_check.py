"""Help ▸ System check…: ``quantdeck doctor``'s report in a dialog (core/doctor.py).

The check runs in a worker (each engine imports vLLM in its own process: seconds); the dialog
stays usable meanwhile, and closing it does not wait for the check."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from PySide6.QtGui import QFontDatabase, QGuiApplication
from PySide6.QtWidgets import QDialog, QDialogButtonBox, QLabel, QPlainTextEdit, QVBoxLayout

from quantdeck.gui.workers import WorkerSet


class SystemCheckDialog(QDialog):
    """The doctor's report as text, with Run again and Copy."""

    def __init__(self, parent: Any = None, engines: Sequence[str] | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("System check")
        self.resize(900, 600)
        self.engines = engines
        self.report: Any = None
        self.status = QLabel()
        self.text = QPlainTextEdit()
        self.text.setReadOnly(True)
        self.text.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        self.again_button = buttons.addButton("Run again", QDialogButtonBox.ButtonRole.ActionRole)
        self.copy_button = buttons.addButton("Copy", QDialogButtonBox.ButtonRole.ActionRole)
        buttons.rejected.connect(self.reject)
        self.again_button.clicked.connect(self.run)
        self.copy_button.clicked.connect(
            lambda: QGuiApplication.clipboard().setText(self.text.toPlainText())
        )
        layout = QVBoxLayout(self)
        layout.addWidget(self.status)
        layout.addWidget(self.text, 1)
        layout.addWidget(buttons)
        self.workers = WorkerSet(self._on_error)
        self.run()

    def run(self) -> None:
        from quantdeck.core.doctor import run_doctor

        self.again_button.setEnabled(False)
        self.status.setText("Checking… (each engine imports vLLM in its own process: seconds)")
        engines = self.engines
        # the check cannot be cancelled (subprocesses): its worker ticks, so closing is quick
        self.workers.follow(lambda: run_doctor(engines), tick_s=0.25, returned=self._on_report)

    def _on_report(self, report: Any) -> None:
        from quantdeck.core.doctor import report_lines

        self.report = report
        self.text.setPlainText("\n".join(report_lines(report)))
        errors = sum(p.level == "error" for p in report.problems)
        verdict = "An engine can serve." if report.can_serve else "No engine can serve."
        self.status.setText(f"{verdict} {errors} error(s), {len(report.problems)} finding(s).")
        self.again_button.setEnabled(True)

    def _on_error(self, msg: str) -> None:
        self.status.setText(f"The check failed: {msg}")
        self.again_button.setEnabled(True)

    def done(self, result: int) -> None:
        self.workers.quit()
        super().done(result)
