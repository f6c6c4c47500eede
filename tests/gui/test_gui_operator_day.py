"""The operator's day on the real demo server, driven through the window as a person would:
start, load, stop for a while, start again with a knob changed. The curves break across the
stop and say it stopped; a recording opened meanwhile leaves the live samples alone and raises
no alert; Compare spans picks the spans either side of the knob change; the Logs tab holds no
access line of the panel's own scrapes; the alert list shows an alert raised and cleared."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
from conftest import ROOT
from PySide6.QtCore import Qt

from quantdeck.core.launch import cpu_device, engine_checks
from quantdeck.core.runtime import free_port
from quantdeck.gui.main_window import MainWindow

pytestmark = [pytest.mark.server, pytest.mark.slow]

# the stop in the middle of the day: issue 30 stopped for a minute; a quarter of it makes the
# same gap in every curve (samples come every 0.5 s) and keeps 45 s off the suite
STOPPED_S = 15.0
RECORDING = ROOT / "docs" / "gpu-validation" / "record-bf16-graphs.jsonl.gz"


@pytest.fixture
def window(qtbot, demo_server_parked, demo_model: Path):
    win = MainWindow(device=cpu_device(), probe=False)
    qtbot.addWidget(win)
    win.add_model(demo_model, select=True)
    win.resize(1400, 900)
    win.show()
    yield win
    win.controller.shutdown()


def _load(url: str, model: str, seconds: float) -> threading.Thread:
    """Two clients sending completions for ``seconds`` (the same load on both sides of the
    change), in a thread."""

    def client(k: int) -> None:
        end = time.time() + seconds
        with httpx.Client(base_url=url, timeout=60) as c:
            while time.time() < end:
                c.post(
                    "/v1/completions",
                    json={"model": model, "prompt": f"Client {k}: the import", "max_tokens": 24},
                )

    threads = [threading.Thread(target=client, args=(k,), daemon=True) for k in range(2)]
    for t in threads:
        t.start()
    joiner = threading.Thread(target=lambda: [t.join() for t in threads], daemon=True)
    joiner.start()
    return joiner


def test_the_operators_day(qtbot, window: MainWindow) -> None:
    launch, mon = window.launch, window.monitor
    launch.form.editors["kv_cache_memory_bytes"].widget.setText("64MiB")
    launch.form.editors["port"].widget.setValue(free_port())
    qtbot.mouseClick(launch.eager, Qt.LeftButton)
    mon.kv_limit.setValue(0.5)  # the smallest load fills more than this: an alert to see
    qtbot.mouseClick(launch.start_button, Qt.LeftButton)
    qtbot.waitUntil(lambda: "ready" in window.state_label.text(), timeout=420_000)
    ctl = window.controller
    url, model = ctl.url, ctl.model_name
    assert url is not None and model is not None
    # the plan beside the engine's own KV tokens and concurrency, as its log reported them
    checks = engine_checks(ctl.server.plan.to_json(), ctl.server.facts)
    assert [c.what for c in checks] == ["KV cache", "max concurrency"]
    assert checks[0].engine == ctl.server.facts["kv_cache_tokens"]
    assert abs(checks[0].error_pct) < 1.0  # the planner's blocks are the engine's on CPU
    # the controller's events reach each view as a call of its own, queued from the server's
    # thread: the status bar may say ready one pass of the event loop before the Launch tab does
    engine = launch.planner.engine
    qtbot.waitUntil(lambda: engine.text().startswith("Running server"), timeout=5_000)
    shown = engine.text()
    assert all(c.describe() in shown for c in checks), shown

    # load: the plots fill; the KV limit is crossed and the alert list has it
    load = _load(url, model, 12)  # the UI thread goes on meanwhile, as for a person
    qtbot.waitUntil(lambda: not load.is_alive(), timeout=120_000)
    qtbot.waitUntil(lambda: window.alerts_view.model.rowCount() >= 1, timeout=20_000)
    qtbot.waitUntil(lambda: "cleared" in window.alerts_view.model.text(0, "state"), timeout=30_000)
    assert window.alerts_view.model.text(0, "alert").startswith("KV-cache usage")

    # a recording opened while live: the live samples untouched, no alert from its readings
    count, alerts = len(mon.store), len(mon.alerts)
    ctl.metrics.disconnect(mon.add_event)  # hold the live feed still for the count
    try:
        assert window.open_recording(str(RECORDING)) > 0
        mon.refresh(force=True)
        assert len(mon.store) == count and len(mon.alerts) == alerts
    finally:
        ctl.metrics.connect(mon.add_event)
    window.replays[-1].close()

    # a p99 TTFT limit no request can meet: an alert active when the server stops
    mon.ttft_limit.setValue(1)
    load = _load(url, model, 2)
    qtbot.waitUntil(lambda: not load.is_alive(), timeout=120_000)
    qtbot.waitUntil(lambda: any(a.key == "ttft" for a in mon.alerts.active), timeout=20_000)
    assert mon.banner.isVisibleTo(mon) and " active" in window.alert_label.text()

    # stop for a while: the stopped cue, no samples meanwhile; the alert ends with the server
    qtbot.mouseClick(launch.stop_button, Qt.LeftButton)
    qtbot.waitUntil(lambda: "stopped" in window.state_label.text(), timeout=60_000)
    # the Monitor takes the same state event in its own queued call (see above)
    qtbot.waitUntil(lambda: "stopped at" in mon.source_state.text(), timeout=5_000)
    assert mon.alerts.active == [] and not mon.banner.isVisibleTo(mon)
    ttft = [a for a in mon.alerts.alerts if a.key == "ttft"]
    assert len(ttft) == 1 and ttft[0].ended == "server stopped"
    rows = window.alerts_view.model
    assert "ended: server stopped" in {rows.text(i, "state") for i in range(rows.rowCount())}
    assert "0 alerts active" in window.alert_label.text()
    mon.ttft_limit.setValue(0)
    stopped_at, n = time.time(), len(mon.store)
    qtbot.wait(int(STOPPED_S * 1000))
    assert len(mon.store) == n

    # start again with a knob changed: a knobs marker, and the curves break across the stop
    launch.form.editors["max_num_seqs"].set_value(8)
    qtbot.mouseClick(launch.start_button, Qt.LeftButton)
    qtbot.waitUntil(lambda: "ready" in window.state_label.text(), timeout=420_000)
    assert [m.what for m in mon.timeline.markers][:1] == ["launch"]
    change = mon.timeline.markers[-1]
    assert change.what == "knobs" and change.diff == {"max-num-seqs": [None, 8]}
    load = _load(ctl.url, model, 12)
    qtbot.waitUntil(lambda: not load.is_alive(), timeout=120_000)
    qtbot.waitUntil(lambda: not mon.source_state.isVisibleTo(mon), timeout=10_000)
    mon.window_box.setCurrentText("10 min")
    mon.refresh(force=True)
    t, _ = mon.curves["host_cpu_pct"].getData()
    y = mon.data_of("host_cpu_pct")
    gaps = np.flatnonzero(np.isnan(y))
    assert len(gaps) >= 1  # the stop is a gap, not a line
    last = mon.store.last_t
    assert any(t[g - 1] + last <= stopped_at + 1 and t[g + 1] + last >= change.t for g in gaps)

    # Compare spans: either side of the knob change, equal and of comparable load
    qtbot.mouseClick(mon.compare_button, Qt.LeftButton)
    cmp = mon.comparison()
    assert cmp is not None and cmp.before.t1 < change.t < cmp.after.t0
    assert cmp.before.seconds == pytest.approx(cmp.after.seconds)
    assert cmp.separated_by() == "knobs: max-num-seqs default → 8"

    # the Logs tab: the operator's requests and both runs, none of the panel's own scrapes
    logs = window.logs.text()
    assert "POST /v1/completions" in logs and "━━ run 2 ·" in logs
    assert "GET /metrics" not in logs and "GET /health" not in logs
    qtbot.mouseClick(launch.stop_button, Qt.LeftButton)
    qtbot.waitUntil(lambda: "stopped" in window.state_label.text(), timeout=60_000)
