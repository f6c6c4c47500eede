"""The Monitor's Profile page: disabled (with the way to enable it) for a server without the
profiler, the capture's error from its worker, and a trace vLLM's profiler wrote summed up from
disk. The live capture is the core's, run on the real demo server in
tests/cli/test_trace_server.py."""

from __future__ import annotations

import socket
from pathlib import Path

from conftest import FIXTURES
from PySide6.QtCore import Qt

from quantdeck.core.events import FactEvent, StateEvent
from quantdeck.core.runtime import AttachedServer
from quantdeck.gui.monitor.profile import NO_PROFILER, NO_SERVER, ProfilePanel
from quantdeck.gui.server_control import QtServerController

TRACE = FIXTURES / "vllm_cpu_demo_4_steps.pt.trace.json.gz"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_button_says_how_to_enable_it_and_the_capture_reports_its_error(
    qtbot, tmp_path: Path
) -> None:
    c = QtServerController()
    panel = ProfilePanel(c)
    qtbot.addWidget(panel)
    assert not panel.profile_button.isEnabled() and panel.profile_button.toolTip() == NO_SERVER
    assert panel.reason.text() == NO_SERVER  # said beside the button, not only on hover
    # a server that runs without the profiler (here: one attached; no profiler_dir fact)
    url = f"http://127.0.0.1:{_free_port()}"
    c.attached = AttachedServer(url)
    c._on_core_event(StateEvent("attached", url=url))
    assert not panel.profile_button.isEnabled()
    assert panel.profile_button.toolTip() == NO_PROFILER
    assert "Profiler knob on Launch" in NO_PROFILER
    # the profiler's folder named by the server: enabled once it is ready
    c._on_core_event(FactEvent("profiler_dir", str(tmp_path)))
    assert c.profiler_dir == str(tmp_path) and not panel.profile_button.isEnabled()
    c.state = "ready"
    c.event.emit(StateEvent("ready"))
    assert panel.profile_button.isEnabled()
    assert "4 engine steps" in panel.profile_button.toolTip()
    assert panel.reason.text() == ""  # it can trace: nothing to explain
    # nothing listens there: the worker's error is the status line, the button comes back
    qtbot.mouseClick(panel.profile_button, Qt.LeftButton)
    assert not panel.profile_button.isEnabled()
    qtbot.waitUntil(lambda: panel.profile_button.isEnabled(), timeout=20_000)
    assert panel.status.text().startswith(url) and "\n" not in panel.status.text()
    assert panel.summary is None and not panel.folder_button.isEnabled()


def test_a_trace_file_is_summed_up_in_the_tables(qtbot) -> None:
    panel = ProfilePanel(QtServerController())
    qtbot.addWidget(panel)
    panel.open_trace(TRACE)
    qtbot.waitUntil(lambda: panel.summary is not None, timeout=10_000)
    assert panel.by_time.text(0, "operator") == "aten::linear"
    assert panel.by_time.text(0, "calls") == "68" and panel.by_time.text(0, "where") == "host"
    assert panel.by_count.text(0, "operator") == "aten::as_strided"
    assert panel.by_count.text(0, "calls") == "465"
    assert len(panel.by_time.rows) == len(panel.summary.by_time) == 15
    text = panel.figures.text()
    assert "Engine steps covered: 4" in text and "host time" in text
    assert "device time none (a CPU trace: no kernels)" in text
    assert panel.folder_button.isEnabled() and panel.trace_folder() == FIXTURES
    assert "ui.perfetto.dev" in panel.folder_button.toolTip()


def test_a_file_that_is_no_trace_is_one_line(qtbot, tmp_path: Path) -> None:
    panel = ProfilePanel(QtServerController())
    qtbot.addWidget(panel)
    bad = tmp_path / "x.pt.trace.json"
    bad.write_text("{not json")
    panel.open_trace(bad)
    qtbot.waitUntil(lambda: "not a Chrome trace" in panel.status.text(), timeout=10_000)
    assert "\n" not in panel.status.text() and panel.summary is None
