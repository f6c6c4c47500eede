"""Start the desktop panel: the window first, then the demo model (built in a worker if needed).

SIGINT, SIGTERM and SIGHUP close the window as its close button does (the server and the jobs
are stopped), then the app exits with 128 + the signal's number. Processes an earlier panel left
running are offered to be stopped."""

from __future__ import annotations

import os
import signal
import socket
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from PySide6.QtCore import QEvent, QObject, QSize, QSocketNotifier, QTimer
from PySide6.QtGui import QIcon
from PySide6.QtWidgets import QApplication, QMessageBox, QWidget

from quantdeck.core.desktop import APP_ID, ICON_SIZES, ICONS
from quantdeck.core.events import Event, ProgressEvent
from quantdeck.core.models import default_demo_dir, ensure_demo_model, is_complete
from quantdeck.core.procs import STOP_SIGNALS
from quantdeck.gui.main_window import MainWindow


def app_icon() -> QIcon:
    """Quantdeck's icon, from the PNG renderings of each size (assets/icons/hicolor): Qt picks
    the nearest size for the title bar, the task switcher and the dock; loaded when drawn."""
    icon = QIcon()
    for size in ICON_SIZES:
        icon.addFile(str(ICONS / f"{size}x{size}" / "apps" / f"{APP_ID}.png"), QSize(size, size))
    return icon


# Set (to anything), the panel prints ``first-paint SECONDS`` (the epoch time at which the
# window's first paint pass ended) and quits: how benchmarks/startup.py times a cold start of
# the installed command, the light install's and the standalone bundle's alike.
FIRST_PAINT_ENV = "QUANTDECK_EXIT_AFTER_FIRST_PAINT"


class FirstPaint(QObject):
    """On the first paint event of ``win`` or a widget in it, the time is taken on the next
    turn of the event loop (when Qt has painted the whole window), printed, and the app quits."""

    def __init__(self, win: QWidget) -> None:
        super().__init__(win)
        self.win, self.seen = win, False

    def eventFilter(self, obj: QObject, ev: QEvent) -> bool:
        if (
            not self.seen
            and ev.type() == QEvent.Type.Paint
            and isinstance(obj, QWidget)
            and obj.window() is self.win
        ):
            self.seen = True
            QTimer.singleShot(0, self._shown)
        return False

    def _shown(self) -> None:
        print(f"first-paint {time.time():.6f}", flush=True)
        QApplication.quit()


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
            if isinstance(ev, ProgressEvent):
                win.progress.setRange(0, 100)
                win.progress.setValue(int(ev.pct))
                win.progress.setFormat(f"{ev.stage} %p%")

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


def close_on_signals(app: QApplication, win: MainWindow) -> QSocketNotifier:
    """Close ``win`` and quit on a stop signal. Python runs signal handlers only when the main
    thread runs Python, and it sits in Qt's event loop: the signal's number goes to a socket
    (``signal.set_wakeup_fd``) that a socket notifier watches, which wakes the loop."""
    reader, writer = socket.socketpair()
    reader.setblocking(False)
    writer.setblocking(False)
    signal.set_wakeup_fd(writer.fileno())
    for sig in STOP_SIGNALS:
        signal.signal(sig, lambda *_: None)  # the number reaches the socket; Qt acts on it
    notifier = QSocketNotifier(reader.fileno(), QSocketNotifier.Type.Read, app)

    def on_wakeup() -> None:
        try:
            received = [s for s in reader.recv(64) if s in STOP_SIGNALS]
        except BlockingIOError:
            return
        if received:
            win.close()  # closeEvent stops the server and the jobs
            app.exit(128 + received[0])

    notifier.activated.connect(on_wakeup)
    notifier.sockets = (reader, writer)  # type: ignore[attr-defined]  # kept open with it
    return notifier


def offer_leftovers(win: MainWindow) -> Any:
    """Look (in a worker) for processes an earlier Quantdeck left running; when there are,
    a message offers to stop them. Returns the worker."""
    from quantdeck.core.procs import Lease, leftovers, stop_leftover

    def found(leases: list[Lease]) -> None:
        if not leases:
            return
        box = QMessageBox(
            QMessageBox.Icon.Warning,
            "Processes left running",
            "An earlier Quantdeck left these running:\n"
            + "\n".join(x.describe() for x in leases)
            + "\n\nStop them?",
            QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.No,
            win,
        )
        stop = box.button(QMessageBox.StandardButton.Yes)
        stop.setText("Stop them")
        box.button(QMessageBox.StandardButton.No).setText("Leave them")
        stop.clicked.connect(
            lambda: win.background().start(lambda: [stop_leftover(x) for x in leases])
        )
        win.leftovers_box = box
        box.open()  # not modal to the app: the window stays usable

    return win.background().start(leftovers, returned=found)


def main(argv: Sequence[str] | None = None) -> int:
    running = QApplication.instance()
    app = running if isinstance(running, QApplication) else QApplication(list(argv or sys.argv[:1]))
    app.setApplicationName("Quantdeck")
    # the launcher entry's name (core/desktop.py): Wayland's app id, the dock's grouping
    app.setDesktopFileName(APP_ID)
    app.setWindowIcon(app_icon())
    win = build_window()
    notifier = close_on_signals(app, win)
    if os.environ.get(FIRST_PAINT_ENV):
        app.installEventFilter(FirstPaint(win))
    win.show()
    offer_leftovers(win)
    code = app.exec()
    signal.set_wakeup_fd(-1)
    notifier.setEnabled(False)
    return code


if __name__ == "__main__":
    sys.exit(main())
