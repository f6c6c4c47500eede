"""The Logs tab: the server's log live, with level filter, search, highlighted lifecycle facts
and the crash tail kept."""

from __future__ import annotations

import collections
from typing import Any

from PySide6.QtGui import QColor, QTextCharFormat, QTextCursor
from PySide6.QtWidgets import (
    QComboBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QVBoxLayout,
    QWidget,
)

from quantdeck.core.events import Event

LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
# What the tab keeps: the newest lines, each cut to a length (a server that prints a tensor
# on one line must not fill memory, nor make the view lay out megabytes).
MAX_LINES = 20000
MAX_LINE_CHARS = 2000


class LogsPanel(QWidget):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.lines: collections.deque[tuple[str, str]] = collections.deque(maxlen=MAX_LINES)
        self.crash_tail: list[str] = []
        self.level = QComboBox()
        self.level.addItems(["all", "INFO+", "WARNING+", "ERROR+"])
        self.search = QLineEdit()
        self.search.setPlaceholderText("search…")
        self.view = QPlainTextEdit()
        self.view.setReadOnly(True)
        self.view.setMaximumBlockCount(MAX_LINES)
        self.view.setLineWrapMode(QPlainTextEdit.NoWrap)
        self.summary = QLabel()
        bar = QHBoxLayout()
        for w in (QLabel("Level"), self.level, self.search):
            bar.addWidget(w)
        lay = QVBoxLayout(self)
        lay.addLayout(bar)
        lay.addWidget(self.summary)
        lay.addWidget(self.view, 1)
        self.level.currentIndexChanged.connect(self._on_filter_changed)
        self.search.textChanged.connect(self._on_filter_changed)
        self._fmt = {
            "fact": _fmt("#1b5e20", bold=True),
            "state": _fmt("#0d47a1", bold=True),
            "WARNING": _fmt("#a65e00"),
            "ERROR": _fmt("#b71c1c"),
            "CRITICAL": _fmt("#b71c1c", bold=True),
            "INFO": _fmt(None),
            "DEBUG": _fmt("#777777"),
        }

    def _min_level(self) -> int:
        return {0: 0, 1: 1, 2: 2, 3: 3}[self.level.currentIndex()]

    def _visible(self, kind: str, text: str) -> bool:
        if kind in LEVELS and LEVELS.index(kind) < self._min_level():
            return False
        q = self.search.text().strip().lower()
        return not q or q in text.lower()

    def _append(self, kind: str, text: str) -> None:
        cur = self.view.textCursor()
        cur.movePosition(QTextCursor.End)
        cur.insertText(text + "\n", self._fmt.get(kind, self._fmt["INFO"]))

    def add_event(self, ev: Event) -> None:
        kind = ev.kind
        if kind == "log":
            entry = (ev.get("level", "INFO"), ev.get("line"))
        elif kind == "state":
            extra = ev.get("reason") or ev.get("url") or ""
            entry = ("state", f"── {ev.get('state')} {extra}".rstrip())
            if ev.get("state") == "crashed":
                self.crash_tail = list(ev.get("log_tail") or [])
                self.summary.setText(
                    f"crashed: {ev.get('reason', '')} — last "
                    f"{len(self.crash_tail)} lines kept below"
                )
            elif ev.get("state") == "starting":
                self.summary.setText("")
        elif kind == "fact":
            entry = ("fact", f"★ {ev.get('name')} = {ev.get('value')}")
        else:
            return
        style, text = entry
        if len(text) > MAX_LINE_CHARS:
            entry = (style, text[:MAX_LINE_CHARS] + f"… ({len(text) - MAX_LINE_CHARS} more)")
        self.lines.append(entry)
        if self._visible(*entry):
            self._append(*entry)

    def _on_filter_changed(self, *_: Any) -> None:
        self.view.clear()
        for kind, text in self.lines:
            if self._visible(kind, text):
                self._append(kind, text)

    def text(self) -> str:
        return self.view.toPlainText()


def _fmt(color: str | None, bold: bool = False) -> QTextCharFormat:
    f = QTextCharFormat()
    if color:
        f.setForeground(QColor(color))
    if bold:
        f.setFontWeight(700)
    return f
