"""Telemetry (NVML wrapper, host, server processes), the sampler, and recordings."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from quantdeck.core.errors import ConfigError
from quantdeck.core.events import from_json
from quantdeck.core.monitor import telemetry
from quantdeck.core.monitor.recording import Recorder, read_recording, replay
from quantdeck.core.monitor.telemetry import NA, ProcessWatch, Sampler, nvml_call, read_telemetry


def test_no_driver_is_a_state_not_an_error() -> None:
    if telemetry.nvml_available():
        pytest.skip("this machine has an NVIDIA driver")
    assert nvml_call("nvmlDeviceGetCount") is NA
    assert telemetry.gpu_count() == 0
    snap = read_telemetry()
    assert snap.gpus == ()
    assert 0 <= snap.host_cpu_pct <= 100
    assert 0 < snap.host_ram_used_bytes < snap.host_ram_total_bytes


def test_failed_nvml_reading_is_na(monkeypatch: pytest.MonkeyPatch) -> None:
    """A driver that answers some calls and fails others gives NA for those, never raises."""

    class Util:
        gpu = 37

    class Fake:
        NVML_TEMPERATURE_GPU = 0
        NVML_CLOCK_SM = 1

        def nvmlDeviceGetHandleByIndex(self, i):
            return object()

        def nvmlDeviceGetName(self, h):
            return b"NVIDIA H200"

        def nvmlDeviceGetUtilizationRates(self, h):
            return Util()

        def nvmlDeviceGetPowerUsage(self, h):
            return 310868

        def nvmlDeviceGetMemoryInfo(self, h):
            raise RuntimeError("NVML_ERROR_GPU_IS_LOST")

    monkeypatch.setitem(telemetry._state, "tried", True)
    monkeypatch.setitem(telemetry._state, "ok", True)
    monkeypatch.setitem(telemetry._state, "module", Fake())
    g = telemetry.read_gpu(0)
    assert g.name == "NVIDIA H200" and g.utilization_pct == 37.0 and g.power_w == 310.868
    assert g.memory_used_bytes is NA and g.temperature_c is NA
    assert g.to_json()["memory_used_bytes"] is None


def test_process_watch_sums_the_tree() -> None:
    w = ProcessWatch(os.getpid())
    rss, cpu = w.usage()
    assert rss > 10 * 2**20 and cpu is not None
    assert ProcessWatch(2**22 + 12345).usage() == (0, 0.0)


def test_process_watch_follows_the_tree() -> None:
    """A child that appears is summed once the tree is re-read; one that exits is dropped."""
    code = (
        "import subprocess, sys, time\n"
        "time.sleep(0.5)\n"
        "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)'])\n"
        "print(c.pid, flush=True)\n"
        "c.wait()\n"  # reaped at once when killed: no zombie left in the tree
        "time.sleep(30)\n"
    )
    root = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        w, slow = ProcessWatch(root.pid, tree_s=0.2), ProcessWatch(root.pid, tree_s=60)
        assert w.pids() == slow.pids() == {root.pid}
        child = int(root.stdout.readline())
        assert slow.pids() == {root.pid}  # the tree read before the child, kept for tree_s
        time.sleep(0.25)
        assert w.pids() == {root.pid, child}
        os.kill(child, signal.SIGKILL)
        time.sleep(0.3)
        rss, _ = w.usage()
        assert child not in w.pids() and rss > 0
    finally:
        root.kill()
        root.wait()


def test_sampler_ticks_and_stops() -> None:
    s = Sampler(hz=20)
    got: list = []
    s.subscribe(got.append)
    s.start()
    time.sleep(0.6)
    s.stop()
    n = len(got)
    assert 6 <= n <= 14
    assert s.latest is got[-1]  # only the latest sample is kept
    time.sleep(0.2)
    assert len(got) == n  # really stopped
    ev = got[-1].to_event().to_json()
    assert ev["event"] == "metrics" and "host_cpu_pct" in ev and ev["gpus"] == []
    assert not [t for t in threading.enumerate() if t.name == "quantdeck-sampler"]


def test_recording_round_trip(tmp_path: Path) -> None:
    p = tmp_path / "r.jsonl"
    rec = Recorder(p, {"source": "test", "config": {"max-num-seqs": 8}})
    events = [
        {"event": "state", "state": "starting", "t": 1.0},
        {"event": "metrics", "t": 2.0, "kv_usage_pct": 5.0, "gpus": []},
        {"event": "metrics", "t": 2.5, "kv_usage_pct": 7.5, "gpus": []},
    ]
    for e in events:
        rec.write(from_json(e))
    rec.close()
    r = read_recording(p)
    assert r.header.info.get("config") == {"max-num-seqs": 8}
    assert [e.to_json() for e in r.events] == events
    assert r.duration_s == 1.5
    got: list = []
    t0 = time.monotonic()
    for _ in replay(r, got.append, speed=10.0):
        pass
    assert got == r.events and time.monotonic() - t0 >= 0.13


def test_recording_damage(tmp_path: Path) -> None:
    p = tmp_path / "r.jsonl"
    rec = Recorder(p)
    rec.write(from_json({"event": "metrics", "t": 1}))
    rec.close()
    with open(p, "a") as f:
        f.write('{"event": "metr')  # a crash mid-write
    assert len(read_recording(p).events) == 1
    p.write_text('{"event": "recording", "version": 1}\nnot json\n{"event": "x"}\n')
    with pytest.raises(ConfigError, match="line 2 is not JSON"):
        read_recording(p)
    p.write_text(json.dumps({"event": "metrics"}) + "\n")
    with pytest.raises(ConfigError, match="no recording header"):
        read_recording(p)
    with pytest.raises(ConfigError, match="no such recording"):
        read_recording(tmp_path / "missing.jsonl")
