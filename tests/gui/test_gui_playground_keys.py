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


def test_while_the_fleet_of_one_starts_the_playground_says_so(qtbot) -> None:
    """Before, starting behind the router, a send went to the previous server's address and
    failed; now it says what is on its way (the deployment's word)."""
    win = MainWindow(device=cpu_device(), probe=False)
    qtbot.addWidget(win)
    pg = win.playground
    win.router.pending = True  # its fleet file written, the Fleet tab reading it
    pg.input.setPlainText("Hello")
    qtbot.keyClick(pg.input, Qt.Key_Return)
    assert pg.stats.text() == "the fleet of one is starting: send once it serves"
    assert pg.input.toPlainText() == "Hello"  # kept for later
    win.close()


def test_copy_as_curl_holds_the_system_prompt_and_never_the_key(qtbot) -> None:
    import json
    import shlex

    from PySide6.QtGui import QGuiApplication

    from quantdeck.gui.playground import PlaygroundPanel

    pg = PlaygroundPanel(lambda: ("http://127.0.0.1:9", "demo", "sk-secret-123"))
    qtbot.addWidget(pg)
    assert pg.copy_as_curl() is None and pg.stats.text().startswith("nothing to copy")
    pg.system.setPlainText("You answer in French.")
    pg.input.setPlainText('It\'s "quoted" $HOME')
    command = pg.copy_as_curl()
    assert command is not None and QGuiApplication.clipboard().text() == command
    assert "sk-secret" not in command and "$VLLM_API_KEY" in command
    argv = shlex.split(command)
    body = json.loads(argv[argv.index("-d") + 1])
    assert body["messages"] == [
        {"role": "system", "content": "You answer in French."},
        {"role": "user", "content": 'It\'s "quoted" $HOME'},
    ]
    assert pg.history == [] and pg.input.toPlainText()  # copied, not sent
    pg.mode.setCurrentText("completion")
    assert not pg.system.isEnabled()
    body = json.loads(shlex.split(pg.copy_as_curl() or "")[-1])
    assert body["prompt"] == 'It\'s "quoted" $HOME' and "messages" not in body
