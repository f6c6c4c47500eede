"""Recordings opened from the Monitor (Open recording…): each replayed read-only in a window of
its own, the live Monitor, its samples, markers, overlay and alerts untouched (cut out of the
main window, issue 44). A fleet's recording too: its instances, each a source, overlaid in its
window, with a Fleet page of its rows as they ended and its news."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QObject, Qt
from PySide6.QtWidgets import QSplitter, QWidget

from quantdeck.core.errors import QuantdeckError
from quantdeck.core.events import InstanceEvent

if TYPE_CHECKING:
    from quantdeck.core.fleet.rows import FleetRow, FleetRows
    from quantdeck.core.monitor import Recording


class FleetPage(QSplitter):
    """A fleet recording's rows as they ended (``model``) over its news with their times
    (``news``), as the Fleet tab's replay shows them."""

    def __init__(self, rec: Recording, rows: FleetRows) -> None:
        from quantdeck.gui.fleet import FLEET_COLUMNS
        from quantdeck.gui.fleet.news import FleetNews
        from quantdeck.gui.table_model import ObjectTableModel, row_table

        super().__init__(Qt.Orientation.Vertical)
        self.news = FleetNews()
        for ev in rec.events:
            if isinstance(ev, InstanceEvent) and ev.instance in rows:
                rows.apply(ev)
                self.news.add(ev, recorded=True)
        self.model: ObjectTableModel[FleetRow] = ObjectTableModel(FLEET_COLUMNS, self)
        self.model.set_rows(rows.rows)
        self.addWidget(row_table(self.model, "KV %"))
        self.addWidget(self.news)


def fleet_page(rec: Recording) -> FleetPage | None:
    """The Fleet page of a fleet's recording (None: it names no fleet)."""
    from quantdeck.core.fleet.rows import recorded_rows

    try:
        return FleetPage(rec, recorded_rows(rec))
    except QuantdeckError:
        return None


class Recordings(QObject):
    """The replay windows open. ``said(line)`` tells a recording that could not be read."""

    def __init__(self, window: QWidget, said: Callable[[str], None]) -> None:
        super().__init__(window)
        self.window, self._said = window, said
        self.windows: list[Any] = []

    def ask(self) -> None:
        from PySide6.QtWidgets import QFileDialog

        path, _ = QFileDialog.getOpenFileName(
            self.window, "Open a recording", "", "Recordings (*.jsonl *.jsonl.gz);;All files (*)"
        )
        if path:
            self.open(path)

    def open(self, path: str) -> int:
        """Replay the recording at ``path`` in a window of its own. Returns its number of
        events (0: it could not be read, and ``said`` tells why)."""
        from quantdeck.core.monitor import read_recording
        from quantdeck.gui.monitor import ReplayWindow

        try:
            rec = read_recording(path)
        except QuantdeckError as e:
            self._said(str(e))
            return 0
        head = rec.header
        fleet = head.source == "fleet"
        title = head.title or head.model
        if not title and fleet and head.file:
            title = f"fleet {Path(head.file).name}"
        window = ReplayWindow(rec, Path(str(title)).name if title else Path(path).name, self.window)
        page = fleet_page(rec) if fleet else None
        if page is not None:
            window.pages.insertTab(1, page, "Fleet")
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
