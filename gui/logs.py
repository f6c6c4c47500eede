"""The Logs tab: the server's log live, with level filter, search, highlighted lifecycle facts,
a header per run, and a crashed run's tail pinned with a jump to its first error.

The view follows the tail while it is scrolled to the bottom; once the operator scrolls up it
stays where it is (as ``tail -f`` in a pager does) until they scroll back down.
"""

from __future__ import annotations

import collections
import time
from typing import Any

from PySide6.QtGui import QColor, QTextCharFormat, QTextCursor
from PySide6.QtWidgets import (
    QComboBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from quantdeck.core.events import (
    AdviceEvent,
    Event,
    FactEvent,
    InstanceEvent,
    LogEvent,
    PlanEvent,
    StateEvent,
    TrialEvent,
)
from quantdeck.core.fleet.rows import fleet_news
from quantdeck.gui.style import ALERT_TEXT, CRASH_TAIL_BACKGROUND, LOG_COLORS

LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
# What the tab keeps: the newest lines, each cut to a length (a server that prints a tensor
# on one line must not fill memory, nor make the view lay out megabytes).
MAX_LINES = 20000
MAX_LINE_CHARS = 2000
CRASH_TAIL_SHOWN = 40  # lines of a crashed run's tail pinned above the log


class LogsPanel(QWidget):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.lines: collections.deque[tuple[str, str]] = collections.deque(maxlen=MAX_LINES)
        self.crash_tail: list[str] = []
        self.runs = 0  # server starts seen: each opens a header
        self.level = QComboBox()
        self.level.addItems(["all", "INFO+", "WARNING+", "ERROR+"])
        self.search = QLineEdit()
        self.search.setPlaceholderText("search…")
        self.view = QPlainTextEdit()
        self.view.setReadOnly(True)
        self.view.setMaximumBlockCount(MAX_LINES)
        self.view.setLineWrapMode(QPlainTextEdit.LineWrapMode.NoWrap)
        self.summary = QLabel()
        self.summary.setWordWrap(True)
        self.summary.setStyleSheet(f"color:{ALERT_TEXT};")
        self.summary.hide()
        self.error_button = QPushButton("Jump to first error")
        self.error_button.setToolTip("Scroll the log to the first error line of the crashed run")
        self.error_button.clicked.connect(self.jump_to_first_error)
        self.error_button.hide()
        # the crashed run's last lines, pinned above the log (the log may be long past them)
        self.tail_view = QPlainTextEdit()
        self.tail_view.setReadOnly(True)
        self.tail_view.setLineWrapMode(QPlainTextEdit.LineWrapMode.NoWrap)
        self.tail_view.setMaximumHeight(160)
        self.tail_view.setStyleSheet(f"background:{CRASH_TAIL_BACKGROUND};")
        self.tail_view.hide()
        self.bottom_button = QPushButton("Follow tail")
        self.bottom_button.setToolTip("Scroll to the newest line and keep following it")
        self.bottom_button.clicked.connect(self.follow_tail)
        bar = QHBoxLayout()
        for w in (QLabel("Level"), self.level, self.search, self.bottom_button):
            bar.addWidget(w)
        crash = QHBoxLayout()
        crash.addWidget(self.summary, 1)
        crash.addWidget(self.error_button)
        lay = QVBoxLayout(self)
        lay.addLayout(bar)
        lay.addLayout(crash)
        lay.addWidget(self.tail_view)
        lay.addWidget(self.view, 1)
        self.level.currentIndexChanged.connect(self._on_filter_changed)
        self.search.textChanged.connect(self._on_filter_changed)
        bold = ("fact", "state", "run", "CRITICAL")
        self._fmt = {kind: _fmt(color, kind in bold) for kind, color in LOG_COLORS.items()}

    def _min_level(self) -> int:
        return {0: 0, 1: 1, 2: 2, 3: 3}[self.level.currentIndex()]

    def _visible(self, kind: str, text: str) -> bool:
        if kind in LEVELS and LEVELS.index(kind) < self._min_level():
            return False
        q = self.search.text().strip().lower()
        return kind == "run" or not q or q in text.lower()

    def at_bottom(self) -> bool:
        """True while the view shows its newest line (then new lines keep it there)."""
        bar = self.view.verticalScrollBar()
        return bar.value() >= bar.maximum() - 2

    def follow_tail(self) -> None:
        bar = self.view.verticalScrollBar()
        bar.setValue(bar.maximum())

    def _append(self, kind: str, text: str) -> None:
        bar = self.view.verticalScrollBar()
        follow, value = self.at_bottom(), bar.value()
        cur = QTextCursor(self.view.document())
        cur.movePosition(QTextCursor.MoveOperation.End)
        cur.insertText(text + "\n", self._fmt.get(kind, self._fmt["INFO"]))
        bar.setValue(bar.maximum() if follow else value)

    def follow(self, controller: Any) -> None:
        """The Launch tab's server (or the attached one): its events and its errors (a
        :class:`~quantdeck.gui.server_control.QtServerController`; the tab subscribes itself)."""
        controller.event.connect(self.add_event)
        controller.error.connect(lambda msg: self.add_event(StateEvent("error", reason=msg)))

    def add_event(self, ev: Event, source: str = "") -> None:
        """An event of the server followed; ``source``: the fleet instance it is of ("": the
        Launch tab's server), named in the headers."""
        entry: tuple[str, str]
        match ev:
            case InstanceEvent(event=inner, instance=name):
                self.add_event(inner, name)
                return
            case LogEvent(line=line, level=level):
                entry = (level or "INFO", line)
            case StateEvent(state="starting"):
                self.runs += 1
                self._clear_crash()
                who = f"{source} · " if source else ""
                self._add(("run", f"━━ run {self.runs} · {who}{_clock(ev.t)} · starting ━━"))
                return
            case FactEvent(name="fleet instance", value=name):  # the Fleet tab chose it
                self._add(("run", f"━━ fleet instance {name} · {_clock(ev.t)} ━━"))
                return
            case TrialEvent(phase=phase) if phase != "measuring":
                # a trial's arm, a promotion, an undo: each a header (the instance's log goes
                # on under it; the candidate's own log is its own)
                who = f"{source}: " if source else ""
                self._add(("run", f"━━ {who}{fleet_news(ev)} · {_clock(ev.t)} ━━"))
                return
            case StateEvent(state="crashed", reason=reason, log_tail=tail):
                self.crash_tail = list(tail or [])
                why = reason or "no reason given"
                self.summary.setText(
                    f"The server crashed at {_clock(ev.t)}: {why[:300]}. Its last "
                    f"{min(len(self.crash_tail), CRASH_TAIL_SHOWN)} lines are pinned below; "
                    "the whole run is in the log."
                )
                self.summary.show()
                self.tail_view.setPlainText("\n".join(self.crash_tail[-CRASH_TAIL_SHOWN:]))
                self.tail_view.setVisible(bool(self.crash_tail))
                self.tail_view.verticalScrollBar().setValue(
                    self.tail_view.verticalScrollBar().maximum()
                )
                self.error_button.setVisible(self._first_error_line() is not None)
                entry = ("state", ev.describe())
            case StateEvent():  # the CLI's line for it, one wording for both front ends
                entry = ("state", ev.describe())
            case FactEvent() | PlanEvent() | AdviceEvent():
                entry = ("fact", ev.describe())
            case _:
                return
        self._add(entry)

    def _add(self, entry: tuple[str, str]) -> None:
        style, text = entry
        if len(text) > MAX_LINE_CHARS:
            entry = (style, text[:MAX_LINE_CHARS] + f"… ({len(text) - MAX_LINE_CHARS} more)")
        self.lines.append(entry)
        if self._visible(*entry):
            self._append(*entry)

    def _clear_crash(self) -> None:
        self.crash_tail = []
        self.summary.clear()
        self.summary.hide()
        self.tail_view.hide()
        self.error_button.hide()

    def _first_error_line(self) -> str | None:
        """The first ERROR or CRITICAL line of the last run (None: it has none)."""
        last_run = next(
            (i for i in range(len(self.lines) - 1, -1, -1) if self.lines[i][0] == "run"), -1
        )
        for i in range(last_run + 1, len(self.lines)):
            kind, text = self.lines[i]
            if kind in ("ERROR", "CRITICAL"):
                return text
        return None

    def jump_to_first_error(self) -> bool:
        """Show the last run's first error line in the view (filters cleared if they hide it);
        False when the run has none."""
        line = self._first_error_line()
        if line is None:
            return False
        if self.search.text() or self.level.currentIndex() > 2:
            self.search.clear()
            self.level.setCurrentIndex(0)
        doc = self.view.document()
        start = doc.find(f"━━ run {self.runs} ·") if self.runs else QTextCursor(doc)
        if start.isNull():  # the header scrolled out of the kept lines
            start = QTextCursor(doc)
        block = start.block()
        while block.isValid() and block.text() != line:
            block = block.next()
        if not block.isValid():
            return False
        cur = QTextCursor(block)
        self.view.setTextCursor(cur)
        self.view.centerCursor()
        return True

    def _on_filter_changed(self, *_: Any) -> None:
        self.view.clear()
        for kind, text in self.lines:
            if self._visible(kind, text):
                self._append(kind, text)

    def text(self) -> str:
        return self.view.toPlainText()


def _clock(t: Any) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t if isinstance(t, int | float) else None))


def _fmt(color: str | None, bold: bool = False) -> QTextCharFormat:
    f = QTextCharFormat()
    if color:
        f.setForeground(QColor(color))
    if bold:
        f.setFontWeight(700)
    return f
