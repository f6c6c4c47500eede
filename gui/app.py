"""Start the desktop panel: the window first, then the demo model (built in a worker if needed)."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from PySide6.QtCore import QObject, Signal
from PySide6.QtWidgets import QApplication

from quantdeck.core.events import Event
from quantdeck.core.models import default_demo_dir, ensure_demo_model, is_complete
from quantdeck.gui.main_window import MainWindow


def build_window() -> MainWindow:
    win = MainWindow()
    demo = default_demo_dir()
    if is_complete(demo):
        win.add_model(demo, select=win.library.currentItem() is None)
    else:
        _build_demo(win, demo)
    return win


class _Progress(QObject):
    """Carries the build's progress events from the worker thread to the window."""

    event = Signal(dict)


def _build_demo(win: MainWindow, demo: Path) -> None:
    """Build the demo model in a worker thread; the window stays responsive."""
    from superqt.utils import thread_worker

    progress = _Progress(win)

    @thread_worker
    def build() -> Any:
        return ensure_demo_model(demo, on_progress=progress.event.emit)

    def on_event(ev: Event) -> None:
        if ev.kind == "progress":
            win.progress.setRange(0, 100)
            win.progress.setValue(int(ev.get("pct", 0)))
            win.progress.setFormat(f"{ev.get('stage', '')} %p%")

    progress.event.connect(on_event)
    win.progress.show()
    win.progress.setRange(0, 0)
    win.status_label.setText("Building the demo model (first start, about a minute)…")
    worker = build()

    def done(path: Path) -> None:
        win.progress.hide()
        win.status_label.setText(win.device.label)
        win.add_model(Path(path), select=win.library.currentItem() is None)

    def failed(e: Exception) -> None:
        win.progress.hide()
        win.status_label.setText(f"demo model: {e}")

    worker.returned.connect(done)
    worker.errored.connect(failed)
    worker.start()
    win._demo_worker = worker  # keep a reference while it runs


def main(argv: Sequence[str] | None = None) -> int:
    app = QApplication.instance() or QApplication(list(argv or sys.argv[:1]))
    app.setApplicationName("Quantdeck")
    win = build_window()
    win.show()
    return app.exec()


if __name__ == "__main__":
    sys.exit(main())
