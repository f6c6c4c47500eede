"""The alert list: raised and cleared with their times, acknowledged by the operator, and
badges on the Monitor tab and the status bar while any is not acknowledged."""

from __future__ import annotations

import time

from conftest import metrics_event
from PySide6.QtCore import Qt

from quantdeck.core.launch import cpu_device
from quantdeck.core.monitor.alerts import AlertLog
from quantdeck.gui.main_window import MainWindow


def test_an_alert_is_raised_cleared_and_acknowledged(qtbot) -> None:
    win = MainWindow(device=cpu_device(), probe=False)
    qtbot.addWidget(win)
    mon, view = win.monitor, win.alerts_view
    assert "No alert yet" in view.summary.text() and not win.alert_label.isVisibleTo(win)
    t0 = time.time() - 30
    for i in range(4):  # the KV cache fills, stays full for a second, then drains
        mon.add_event(metrics_event(t0 + i / 2, kv_usage_pct=99.2))
        mon.refresh(force=True)
    monitor_tab = win.tabs.indexOf(win._monitor_box)
    assert win.tabs.tabText(monitor_tab) == "Monitor ⚠ 1"
    assert "1 alert active" in win.alert_label.text()
    model = view.model
    assert len(model.rows) == 1 and model.text(0, "cleared") == "active"
    assert model.text(0, "alert") == "KV cache 99.2% full (≥ 98%)"
    assert model.text(0, "raised") == time.strftime("%H:%M:%S", time.localtime(t0))
    mon.add_event(metrics_event(t0 + 5, kv_usage_pct=40.0))
    mon.refresh(force=True)
    assert model.text(0, "cleared") == "active"  # not yet: it may come back (no flapping)
    mon.add_event(metrics_event(t0 + 6, kv_usage_pct=99.0))  # back over: the same alert
    mon.refresh(force=True)
    mon.add_event(metrics_event(t0 + 7, kv_usage_pct=40.0))
    mon.refresh(force=True)
    mon.add_event(metrics_event(t0 + 17.5, kv_usage_pct=40.0))  # 10 s under: cleared
    mon.refresh(force=True)
    assert len(model.rows) == 1
    assert model.text(0, "cleared") == time.strftime("%H:%M:%S", time.localtime(t0 + 7))
    assert model.text(0, "state") == "cleared"
    assert win.tabs.tabText(monitor_tab) == "Monitor ⚠ 1"  # cleared, not yet seen
    assert "0 alerts active, 1 not acknowledged" in win.alert_label.text()
    # the Logs tab has both lines, stamped with the sample's time
    logs = win.logs.text()
    assert "KV cache 99.2% full" in logs and "(cleared " in logs
    qtbot.mouseClick(view.ack_button, Qt.LeftButton)
    assert win.tabs.tabText(monitor_tab) == "Monitor" and not win.alert_label.isVisibleTo(win)
    assert model.text(0, "state") == "cleared, acknowledged" and not view.ack_button.isEnabled()
    # the same condition again is a new alert
    mon.add_event(metrics_event(t0 + 18, kv_usage_pct=99.9))
    mon.refresh(force=True)
    assert len(model.rows) == 2 and model.text(0, "cleared") == "active"
    win.close()


def test_the_log_is_bounded_and_keeps_active_alerts() -> None:
    log = AlertLog(limit=3, clear_after_s=0)
    assert log.update("a", True, "a over", 1.0) is not None
    assert log.update("a", True, "a still over", 2.0) is None  # one alert per episode
    for i, key in enumerate(("b", "c", "d")):
        log.update(key, True, f"{key} over", 3.0 + i)
        log.update(key, False, "", 3.5 + i)
    assert len(log) == 3 and [a.key for a in log.active] == ["a"]  # cleared ones went first
    assert log.unacknowledged == 3 and log.acknowledge_all() == 3 and log.unacknowledged == 0


def test_alerts_are_judged_while_another_tab_is_shown(qtbot) -> None:
    win = MainWindow(device=cpu_device(), probe=False)
    qtbot.addWidget(win)
    win.show()
    win.tabs.setCurrentWidget(win.logs)  # the plots are not in view
    mon = win.monitor
    assert not mon.isVisible()
    mon.add_event(metrics_event(time.time(), kv_usage_pct=99.0))
    qtbot.waitUntil(lambda: "1 alert active" in win.alert_label.text(), timeout=2_000)
    assert "Monitor ⚠ 1" in win.tabs.tabText(win.tabs.indexOf(win._monitor_box))
    win.close()


def test_alerts_end_with_their_server(qtbot) -> None:
    """An alert of a server that stops (or crashes) ends with it: listed "ended: server
    stopped" with the time, the banner gone, the status bar no longer counting it active; a
    limit changed after the stop raises nothing from the last readings."""
    win = MainWindow(device=cpu_device(), probe=False)
    qtbot.addWidget(win)
    mon, model = win.monitor, win.alerts_view.model
    t0 = time.time() - 5
    mon.set_source_state("ready", t0)
    mon.add_event(metrics_event(t0, kv_usage_pct=99.5, ttft_p99_ms=214.0))
    mon.ttft_limit.setValue(100)
    mon.refresh(force=True)
    assert len(mon.alerts.active) == 2 and mon.banner.isVisibleTo(mon)
    stopped = time.time()
    mon.set_source_state("stopped", stopped)
    assert mon.alerts.active == [] and not mon.banner.isVisibleTo(mon)
    assert {model.text(i, "state") for i in range(2)} == {"ended: server stopped"}
    assert model.text(0, "cleared") == time.strftime("%H:%M:%S", time.localtime(stopped))
    assert "0 alerts active, 2 not acknowledged" in win.alert_label.text()
    assert "(ended " in win.logs.text() and ": server stopped)" in win.logs.text()
    mon.ttft_limit.setValue(50)  # the last readings are not of now
    mon.refresh(force=True)
    assert mon.alerts.active == [] and len(mon.alerts) == 2
    # the server again: a reading over the limit is a new alert
    mon.set_source_state("ready")
    mon.add_event(metrics_event(time.time(), kv_usage_pct=99.5))
    mon.refresh(force=True)
    assert [a.key for a in mon.alerts.active] == ["kv_full"] and len(mon.alerts) == 3
    win.close()


def test_an_alert_ended_reads_as_such() -> None:
    log = AlertLog()
    log.update("kv_full", True, "KV cache 99.0% full (≥ 98%)", 100.0)
    log.update("ttft", True, "p99 TTFT 214 ms > 100 ms", 101.0)
    log.update("ttft", False, "", 102.0)  # on its way to clearing: it ends all the same
    assert [a.key for a in log.end_all("server crashed", 103.0)] == ["kv_full", "ttft"]
    assert log.active == [] and log.end_all("server crashed", 104.0) == []
    a = log.alerts[0]
    assert a.cleared_t == 103.0 and a.state == "ended: server crashed"
    assert a.text().endswith(
        f"(ended {time.strftime('%H:%M:%S', time.localtime(103.0))}: server crashed)"
    )
    assert log.update("ttft", True, "p99 TTFT 300 ms > 100 ms", 105.0) is not None  # anew
