"""Fault tests on real parts: kill -9 of `quantdeck serve`, of the panel, or of a conversion's
parent leaves no vLLM (API server, engine core) or worker process behind within 5 s, and the
source model untouched. Each starts at most one real server (eager, 64 MiB of KV cache); the
session server steps aside meanwhile."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from conftest import ROOT

from quantdeck.core.procs import group_pids
from quantdeck.core.runtime import free_port

pytestmark = pytest.mark.server


def wait_group_gone(pgid: int, timeout: float = 5.0) -> set[int]:
    """What is left of the group after ``timeout`` seconds (empty: all gone)."""
    deadline = time.monotonic() + timeout
    while group_pids(pgid) and time.monotonic() < deadline:
        time.sleep(0.1)
    return group_pids(pgid)


def events_until(proc: subprocess.Popen, done, timeout: float = 420) -> list[dict]:
    """JSON lines from ``proc`` until ``done(event)``; fails on an early end or the time."""
    events: list[dict] = []
    deadline = time.time() + timeout
    while time.time() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        if line.startswith("{"):
            events.append(json.loads(line))
            if done(events[-1]):
                return events
    proc.kill()
    pytest.fail(f"no end event: {events[-5:]} {proc.stderr.read()[-2000:]}")


def test_kill_9_of_serve_leaves_no_vllm_process(demo_server_parked, demo_model: Path) -> None:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "quantdeck.cli",
            "serve",
            str(demo_model),
            "--enforce-eager",
            "--kv-cache-memory-bytes",
            "64MiB",
            "--port",
            str(free_port()),
            "--json-events",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        events = events_until(proc, lambda e: e.get("state") in ("ready", "crashed"))
        assert events[-1]["state"] == "ready", events[-3:]
        pid = next(e["value"] for e in events if e.get("name") == "pid")
        assert len(group_pids(pid)) >= 2  # the API server and vLLM's engine core
        proc.kill()
        proc.wait()
        assert wait_group_gone(pid) == set(), "vLLM outlived `quantdeck serve`"
    finally:
        proc.kill()
        proc.wait()


PANEL = textwrap.dedent(
    """
    import sys
    from PySide6.QtWidgets import QApplication
    from quantdeck.core.launch import LaunchConfig, cpu_device
    from quantdeck.gui.main_window import MainWindow

    app = QApplication([])
    win = MainWindow(device=cpu_device(), probe=False)
    cfg = LaunchConfig()
    cfg.model.model, cfg.server.port = sys.argv[1], int(sys.argv[2])
    cfg.compilation.enforce_eager = True
    cfg.cache.kv_cache_memory_bytes = 64 * 2**20

    def on_event(ev):
        if ev.kind == "state":
            pid = win.controller.server.pid or 0
            print('{"state": "%s", "pid": %d}' % (ev.state, pid), flush=True)

    win.controller.event.connect(on_event)
    win.show()
    win.controller.start(cfg)  # in a worker thread: the server must outlive it, not the panel
    app.exec()
    """
)


def test_kill_9_of_the_panel_leaves_no_vllm_process(demo_server_parked, demo_model) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", PANEL, str(demo_model), str(free_port())],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ, QT_QPA_PLATFORM="offscreen"),
    )
    try:
        events = events_until(proc, lambda e: e["state"] in ("ready", "crashed"))
        assert events[-1]["state"] == "ready", proc.stderr.read()[-2000:]
        pid = events[-1]["pid"]
        assert len(group_pids(pid)) >= 2
        proc.kill()
        proc.wait()
        assert wait_group_gone(pid) == set(), "vLLM outlived the panel"
    finally:
        proc.kill()
        proc.wait()


CONVERT = textwrap.dedent(
    """
    import sys
    from quantdeck.core.convert import QuantSpec, run_job
    run_job(QuantSpec(src=sys.argv[1], method="fp8", out=sys.argv[2]), print)
    """
)


def tree_digest(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def test_kill_9_of_a_conversions_parent(demo_model: Path, tmp_path: Path) -> None:
    """The worker goes within 5 s; the source model is untouched; no output is left that
    reads as done."""
    before = tree_digest(demo_model)
    cache = tmp_path / "cache"
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [sys.executable, "-c", CONVERT, str(demo_model), str(out)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=dict(os.environ, QUANTDECK_CACHE_DIR=str(cache)),
    )
    try:
        deadline = time.monotonic() + 60
        while not list((cache / "leases").glob("*.json")) and time.monotonic() < deadline:
            time.sleep(0.05)
        lease = json.loads(next((cache / "leases").glob("*.json")).read_text())
        assert lease["kind"] == "conversion" and lease["owner_pid"] == proc.pid
        time.sleep(2)  # the worker is loading its libraries
        proc.kill()
        proc.wait()
        assert wait_group_gone(lease["pgid"]) == set(), "the conversion outlived its parent"
    finally:
        proc.kill()
        proc.wait()
    assert tree_digest(demo_model) == before
    assert not out.exists()
