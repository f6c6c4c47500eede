"""The panel's server actions run one at a time and Start is disabled on click (a double click
never spawns two servers); SIGTERM closes the window, stopping the server, before quitting;
leftovers of an earlier panel are offered to be stopped."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from ckpt import LLAMA3_8B, write_checkpoint
from leftover import leftover
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QApplication, QMessageBox

import quantdeck.core.runtime as runtime
from quantdeck.core.events import StateEvent
from quantdeck.core.launch import LaunchConfig
from quantdeck.core.launch.device import H200
from quantdeck.gui.main_window import MainWindow


class FakeServer:
    """Stands in for ServerProcess in the controller: records starts and stops, and how many
    starts ran at once (a start takes a moment, as a spawn does)."""

    log: list[str] = []
    active = 0
    most_active = 0
    lock = threading.Lock()

    def __init__(self, cfg: LaunchConfig, engine: Any = None, nice: int = 0) -> None:
        self.cfg, self.name, self.running = cfg, f"s{len(FakeServer.log)}", False
        self._fns: list = []
        self.pid, self.url, self.served_name = None, "http://127.0.0.1:1", "m"

    def subscribe(self, fn):
        self._fns.append(fn)
        return lambda: None

    def start(self) -> None:
        with FakeServer.lock:
            FakeServer.active += 1
            FakeServer.most_active = max(FakeServer.most_active, FakeServer.active)
            FakeServer.log.append(f"start {self.name}")
        time.sleep(0.3)
        self.running = True
        for fn in self._fns:
            fn(StateEvent("starting"))
        with FakeServer.lock:
            FakeServer.active -= 1

    def stop(self) -> None:
        FakeServer.log.append(f"stop {self.name}")
        self.running = False
        for fn in self._fns:
            fn(StateEvent("stopped"))


@pytest.fixture
def window(qtbot, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> MainWindow:
    FakeServer.log, FakeServer.active, FakeServer.most_active = [], 0, 0
    monkeypatch.setattr(runtime, "ServerProcess", FakeServer)
    win = MainWindow(device=H200, probe=False)
    qtbot.addWidget(win)
    win.add_model(write_checkpoint(tmp_path / "l8b", LLAMA3_8B), select=True)
    win.show()
    yield win
    win.controller.shutdown()


def test_double_click_on_start_starts_one_server(qtbot, window: MainWindow) -> None:
    start = window.launch.start_button
    assert start.isEnabled()
    qtbot.mouseClick(start, Qt.LeftButton)
    assert not start.isEnabled()  # at once, before the worker has run
    qtbot.mouseClick(start, Qt.LeftButton)
    qtbot.waitUntil(lambda: not window.controller._actions, timeout=5000)
    assert FakeServer.log == ["start s0"]


def test_controller_actions_run_one_at_a_time_in_order(qtbot, window: MainWindow) -> None:
    """Before: each action ran in its own worker at once; two starts both saw no server, both
    spawned, and the first was never stopped."""
    ctl, cfg = window.controller, window.launch.config()
    ctl.start(cfg)
    ctl.start(cfg)
    ctl.stop()
    with qtbot.waitSignal(ctl.idle, timeout=5000):
        pass
    assert FakeServer.log == ["start s0", "stop s0", "start s2", "stop s2"]
    assert FakeServer.most_active == 1
    assert window.launch.start_button.isEnabled()  # idle and stopped: Start again


def test_a_start_that_fails_enables_start_again(qtbot, window: MainWindow, monkeypatch) -> None:
    from quantdeck.core.errors import ServerError

    def refuse(self) -> None:
        raise ServerError("port 8000 on 127.0.0.1 is already in use")

    monkeypatch.setattr(FakeServer, "start", refuse)
    with qtbot.waitSignal(window.controller.idle, timeout=5000):
        qtbot.mouseClick(window.launch.start_button, Qt.LeftButton)
    assert window.launch.start_button.isEnabled()
    assert "already in use" in window.launch.message.text()


def test_sigterm_closes_the_window_and_stops_the_server(
    qtbot, window: MainWindow, monkeypatch: pytest.MonkeyPatch
) -> None:
    from quantdeck.gui.app import close_on_signals

    app = QApplication.instance()
    codes: list[int] = []
    monkeypatch.setattr(app, "exit", codes.append)
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    with qtbot.waitSignal(window.controller.idle, timeout=5000):
        window.controller.start(window.launch.config())
    notifier = close_on_signals(app, window)
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        qtbot.waitUntil(lambda: codes == [128 + signal.SIGTERM], timeout=5000)
    finally:
        signal.set_wakeup_fd(-1)
        notifier.setEnabled(False)
        for s, h in before.items():
            signal.signal(s, h)
    assert not window.isVisible()
    assert FakeServer.log == ["start s0", "stop s0"]


def test_leftovers_are_offered_and_stopped(
    qtbot, window: MainWindow, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from quantdeck.core.procs import lease_dir
    from quantdeck.gui.app import offer_leftovers

    monkeypatch.setenv("QUANTDECK_CACHE_DIR", str(tmp_path / "cache"))
    left = leftover(lease_dir())
    try:
        offer_leftovers(window)
        qtbot.waitUntil(lambda: getattr(window, "leftovers_box", None) is not None, timeout=5000)
        box = window.leftovers_box
        assert "vLLM server on port 8011" in box.text()
        qtbot.mouseClick(box.button(QMessageBox.Yes), Qt.LeftButton)
        qtbot.waitUntil(lambda: left.poll() is not None, timeout=15000)
        window.background().wait(5)
    finally:
        left.kill()
        left.wait()
