"""Start the desktop panel: the window first, then the demo model (built in a worker if needed)."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from PySide6.QtWidgets import QApplication

from quantdeck.core.events import Event
from quantdeck.core.models import default_demo_dir, ensure_demo_model, is_complete
from quantdeck.gui.main_window import MainWindow


def build_window() -> MainWindow:
    win = MainWindow()
    demo = default_demo_dir()
    if is_complete(demo):
        win.add_model(demo, select=win.selected_model() is None)
    else:
        _build_demo(win, demo)
    return win


def _build_demo(win: MainWindow, demo: Path) -> None:
    """Build the demo model in a worker; its progress events come back as the worker's
    ``yielded`` batches, on the GUI thread, while the window stays responsive."""
    import queue

    def on_events(events: list[Event]) -> None:
        for ev in events:
            if ev.kind == "progress":
                win.progress.setRange(0, 100)
                win.progress.setValue(int(ev.get("pct", 0)))
                win.progress.setFormat(f"{ev.get('stage', '')} %p%")

    def done(path: Path) -> None:
        win.status_label.setText(win.device.label)
        win.add_model(Path(path), select=win.selected_model() is None)

    win.progress.show()
    win.progress.setRange(0, 0)
    win.status_label.setText("Building the demo model (first start, about a minute)…")
    events: queue.SimpleQueue[Event] = queue.SimpleQueue()
    win.background().follow(  # a failure shows in the status bar and Logs
        lambda: ensure_demo_model(demo, on_progress=events.put),
        events,
        yielded=on_events,
        returned=done,
        finished=win.progress.hide,
    )


def main(argv: Sequence[str] | None = None) -> int:
    app = QApplication.instance() or QApplication(list(argv or sys.argv[:1]))
    app.setApplicationName("Quantdeck")
    win = build_window()
    win.show()
    return app.exec()


if __name__ == "__main__":
    sys.exit(main())
