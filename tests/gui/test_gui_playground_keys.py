"""The Playground's keys, as in chat apps: Enter (or Ctrl+Enter) sends, Shift+Enter is a new
line (before: Enter made a new line and Ctrl+Enter did nothing). Here with no server: the send
says so in one line and the text stays for later. Sending to the real demo server by Enter:
tests/gui/test_gui_server.py."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QTextCursor

from quantdeck.core.launch import cpu_device
from quantdeck.gui.main_window import MainWindow


def test_enter_sends_and_shift_enter_is_a_new_line(qtbot) -> None:
    win = MainWindow(device=cpu_device(), probe=False)
    qtbot.addWidget(win)
    pg = win.playground
    pg.input.setPlainText("Hello")
    pg.input.moveCursor(QTextCursor.MoveOperation.End)
    qtbot.keyClick(pg.input, Qt.Key_Return, Qt.ShiftModifier)
    assert pg.input.toPlainText() == "Hello\n" and pg.stats.text() == "—"
    for mods in (Qt.NoModifier, Qt.ControlModifier):
        pg.stats.setText("—")
        qtbot.keyClick(pg.input, Qt.Key_Return, mods)
        assert pg.stats.text() == "no server: start or attach one first"
        assert pg.input.toPlainText() == "Hello\n"  # no newline added, the text kept
    qtbot.keyClick(pg.input, Qt.Key_Enter)  # the keypad's
    assert pg.input.toPlainText() == "Hello\n"
    win.close()
