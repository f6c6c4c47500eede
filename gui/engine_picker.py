"""The engine picker of the Launch and Convert tabs: the default engine, then the registered
ones (``quantdeck engines add``); each entry's data is its interpreter ("" the default)."""

from __future__ import annotations

from PySide6.QtCore import QSignalBlocker, Qt
from PySide6.QtWidgets import QComboBox, QWidget

from quantdeck.core.procs import frozen


class EnginePicker(QComboBox):
    def __init__(self, tooltip: str, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setToolTip(tooltip)
        # a standalone bundle has no Python of its own: its default is the first engine
        self.addItem("first engine" if frozen() else "this Python", "")

    def set_engines(self, engines: list[tuple[str, str]], current: str = "") -> None:
        """The entries after the default: (name, python) of each registered engine;
        ``current`` (a python, "" the default) chosen when listed. No change signal."""
        with QSignalBlocker(self):
            while self.count() > 1:
                self.removeItem(1)
            for name, python in engines:
                self.addItem(name, python)
                self.setItemData(self.count() - 1, python, Qt.ItemDataRole.ToolTipRole)
            self.setCurrentIndex(max(self.findData(current), 0))

    def python(self) -> str | None:
        """The chosen engine's interpreter (None: the default engine)."""
        return self.currentData() or None
