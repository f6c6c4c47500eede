"""Recordings opened from the Monitor (Open recording…): each replayed read-only in a window of
its own, the live Monitor, its samples, markers and alerts untouched; a fleet's recording goes
to the Fleet tab (cut out of the main window, issue 44)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from PySide6.QtCore import QObject, Qt
from PySide6.QtWidgets import QWidget

from quantdeck.core.errors import QuantdeckError


class Recordings(QObject):
    """The replay windows open. ``said(line)`` tells a recording that could not be read;
    ``fleet(path, rec)`` takes a fleet's recording."""

    def __init__(
        self,
        window: QWidget,
        said: Callable[[str], None],
        fleet: Callable[[str, Any], None],
    ) -> None:
        super().__init__(window)
        self.window, self._said, self._fleet = window, said, fleet
        self.windows: list[Any] = []

    def ask(self) -> None:
        from PySide6.QtWidgets import QFileDialog

        path, _ = QFileDialog.getOpenFileName(
            self.window, "Open a recording", "", "Recordings (*.jsonl *.jsonl.gz);;All files (*)"
        )
        if path:
            self.open(path)

    def open(self, path: str) -> int:
        """Replay the recording at ``path``. Returns its number of events (0: it could not be
        read, and ``said`` tells why)."""
        from quantdeck.core.monitor import read_recording
        from quantdeck.gui.monitor import ReplayWindow

        try:
            rec = read_recording(path)
        except QuantdeckError as e:
            self._said(str(e))
            return 0
        if rec.header.info.get("source") == "fleet":  # a fleet's: the Fleet tab replays it
            self._fleet(path, rec)
            return len(rec.events)
        title = rec.header.info.get("title") or rec.header.info.get("model") or Path(path).name
        window = ReplayWindow(rec, Path(str(title)).name if title else Path(path).name, self.window)
        window.setWindowTitle(f"Quantdeck replay: {Path(path).name}")
        window.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        window.destroyed.connect(lambda *_: self._forget(window))
        self.windows.append(window)
        window.resize(self.window.size())
        if self.window.isVisible():
            window.show()
        window.refresh()
        return len(rec.events)

    def _forget(self, window: Any) -> None:
        if window in self.windows:
            self.windows.remove(window)

    def close_all(self) -> None:
        for window in list(self.windows):
            window.close()
