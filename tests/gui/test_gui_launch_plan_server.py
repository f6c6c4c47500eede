"""One launch plan (issue 44): the Launch tab's Copy is the command the real vLLM server runs.

The demo model started from the Launch tab as the panel starts it (KV events, the profiler and
an API key on: the plan's every part), the copied line is read back word for word against
``/proc/PID/cmdline`` of the server's API server process (the one that runs vLLM through
Quantdeck's launcher) and its environment against ``/proc/PID/environ``: equal, except the
values the plan marks as chosen at start (the KV-event ports, the run folder), which must fill
the placeholders' places. The key is in neither the line nor the argv; the CPU's default KV
size is in both."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import psutil
import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QApplication

from quantdeck.core.launch import CPU_DEFAULT_KV_BYTES, cpu_device
from quantdeck.core.launch.command import (
    KV_EVENTS_FLAG,
    PORT_AT_START,
    PROFILER_FLAG,
    RUN_DIR_AT_START,
    TMP_AT_START,
)
from quantdeck.core.launch.knobs import MASK
from quantdeck.core.runtime import EngineEnv, free_port
from quantdeck.gui.main_window import MainWindow

pytestmark = pytest.mark.server

KEY = "s3cret-KEY-42"
LAUNCHER = "quantdeck.core.workers.engine"  # the engine worker, as python -m or by its file
_ENV_WORD = re.compile(r"^([A-Z_][A-Z0-9_]*)=(.*)$", re.S)


def _shape(planned: str) -> re.Pattern[str]:
    """What a copied word with placeholders matches: each value chosen at start in its place."""
    rx = re.escape(planned)
    rx = rx.replace(re.escape(PORT_AT_START), r"\d+")
    rx = rx.replace(re.escape(RUN_DIR_AT_START), r"/[^\"]+")
    return re.compile(rx, re.S)


def _api_server(pid: int) -> psutil.Process:
    """The process of the server's tree that runs vLLM's API server through our launcher."""
    root = psutil.Process(pid)
    tree = [root, *root.children(recursive=True)]
    (api,) = [
        p
        for p in tree
        if any(LAUNCHER in w or w.endswith("/workers/engine.py") for w in p.cmdline())
    ]
    return api


def test_the_copied_command_is_the_running_servers(
    qtbot, demo_server_parked, demo_model, capsys, monkeypatch
) -> None:
    win = MainWindow(device=cpu_device(), probe=False)
    qtbot.addWidget(win)
    win.add_model(demo_model, select=True)
    win.show()
    launch = win.launch
    launch.set_engine(EngineEnv().capabilities())  # the default engine, as the probe gives it
    try:
        form = launch.form.editors
        port = free_port()
        form["port"].widget.setValue(port)
        form["kv_events"].widget.setChecked(True)
        form["profiler"].widget.setChecked(True)
        form["api_key"].widget.setText(KEY)
        qtbot.mouseClick(launch.eager, Qt.LeftButton)
        qtbot.mouseClick(launch.copy_button, Qt.LeftButton)
        copied = QApplication.clipboard().text()
        assert copied and KEY not in copied, launch.message.text()

        qtbot.mouseClick(launch.start_button, Qt.LeftButton)
        qtbot.waitUntil(lambda: "ready" in win.state_label.text(), timeout=420_000)
        api = _api_server(win.controller.server.pid)
        raw = Path(f"/proc/{api.pid}/cmdline").read_bytes()
        running = [w.decode() for w in raw.split(b"\0")[:-1]]
        environ = dict(
            w.decode().split("=", 1)
            for w in Path(f"/proc/{api.pid}/environ").read_bytes().split(b"\0")
            if b"=" in w
        )
    finally:
        win.controller.shutdown()

    words = shlex.split(copied)
    env = [w for w in words[: next(i for i, w in enumerate(words) if not _ENV_WORD.match(w))]]
    argv = words[len(env) :]
    print(f"argv compared: {len(argv)} copied words, {len(running)} running")
    assert len(argv) == len(running), (argv, running)
    chosen_at_start = 0
    for planned, real in zip(argv, running, strict=True):
        if PORT_AT_START in planned or RUN_DIR_AT_START in planned:
            chosen_at_start += 1
            assert planned.split("=", 1)[0] in (KV_EVENTS_FLAG, PROFILER_FLAG)
            assert _shape(planned).fullmatch(real), (planned, real)
        else:
            assert planned == real
    assert chosen_at_start == 2  # the KV-event endpoints and the profiler's folder
    assert not any(KEY in w for w in running)
    # no KV size given on a CPU: the plan's default, in the copy as in the server
    assert f"--kv-cache-memory-bytes={CPU_DEFAULT_KV_BYTES}" in running
    # the environment the line sets is the server's: the key by name, TMPDIR chosen at start
    for word in env:
        m = _ENV_WORD.match(word)
        assert m is not None
        name, value = m.groups()
        if value == MASK:
            assert environ[name] == KEY
        elif value != TMP_AT_START:
            assert environ[name] == value, name
    assert f"VLLM_API_KEY={MASK}" in env
    # the CLI's `quantdeck command --as-run` prints the same line for the same launch (the key
    # from VLLM_API_KEY, never on argv)
    from quantdeck.cli.main import main

    monkeypatch.setenv("VLLM_API_KEY", KEY)
    capsys.readouterr()
    argv = ["command", str(demo_model), "--port", str(port), "--kv-events", "--profiler"]
    assert main([*argv, "--enforce-eager", "--as-run"]) == 0
    assert capsys.readouterr().out.strip() == copied
