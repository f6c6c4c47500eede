"""The Fleet tab without servers: the table fills from a fleet file, rows follow a real Fleet's
own events, the buttons follow the states, a fleet that fails its checks starts nothing, the
edit form round-trips the file, and choosing an instance points Monitor, Logs and Playground
at it through the window's attach path."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from ckpt import TINY_LLAMA, write_checkpoint
from PySide6.QtCore import Qt

from quantdeck.core.events import (
    AdviceEvent,
    FactEvent,
    InstanceEvent,
    LogEvent,
    RestartEvent,
    StateEvent,
)
from quantdeck.core.fleet import Fleet, load_fleet, running_fleet
from quantdeck.core.fleet.document import read_document
from quantdeck.core.launch import cpu_device
from quantdeck.gui.fleet import FleetEditDialog, FleetView
from quantdeck.gui.main_window import MainWindow

A = "http://127.0.0.1:18001"


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QUANTDECK_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture
def fleet_file(tmp_path: Path) -> Path:
    model = write_checkpoint(tmp_path / "model", TINY_LLAMA)
    profile = {"model": str(model), "max-num-seqs": 2}
    doc = {
        "router": {"port": 18080, "policy": "round_robin", "retries": 2},
        "instances": [
            {"name": "a", "port": 18001, "profile": profile, "restart": "on-failure"},
            {"name": "b", "port": 18002, "cpus": "0-1", "role": "backup", "profile": profile},
        ],
    }
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.fixture
def view(qtbot, fleet_file: Path) -> FleetView:
    v = FleetView()
    qtbot.addWidget(v)
    v.load(str(fleet_file))
    qtbot.waitUntil(lambda: v.model.rowCount() == 3, timeout=10_000)
    yield v
    v.shutdown()


def texts(view: FleetView, column: str) -> list[str]:
    return [view.model.text(i, column) for i in range(view.model.rowCount())]


def test_the_table_fills_from_the_file_stopped(view: FleetView, fleet_file: Path) -> None:
    assert texts(view, "instance") == ["router", "a", "b"]
    assert texts(view, "state") == ["stopped"] * 3
    assert texts(view, "role") == ["router", "primary", "backup"]
    assert texts(view, "GPUs/CPUs") == ["", "all", "CPU 0-1"]
    assert texts(view, "format") == ["", "BF16", "BF16"]
    assert str(fleet_file) in view.path_label.text()
    assert view.start_button.isEnabled() and not view.stop_button.isEnabled()
    view.select("a")
    for b in (view.inst_start, view.inst_stop, view.inst_restart, view.open_monitor):
        assert not b.isEnabled()  # no fleet runs


def test_a_bad_file_is_one_line(qtbot, tmp_path: Path) -> None:
    v = FleetView()
    qtbot.addWidget(v)
    bad = tmp_path / "bad.yaml"
    bad.write_text("instances: []\n")
    v.load(str(bad))
    qtbot.waitUntil(lambda: v.message.text() != "", timeout=10_000)
    assert "'instances' is empty" in v.message.text() and "\n" not in v.message.text()
    assert v.model.rowCount() == 0 and not v.start_button.isEnabled()


def test_rows_and_buttons_follow_a_real_fleets_events(qtbot, view: FleetView) -> None:
    assert view.spec is not None
    fleet = Fleet(view.spec)
    view.watch(fleet)
    emit = fleet._events.emit  # the fleet's own event path, as its threads use it

    # the check's warning (two CPU instances on the same cores): shown, before anything starts
    warning = "instances 'a', 'b' run on the CPU without 'cpus': ...; e.g. a 0, b 1"
    emit(InstanceEvent("router", AdviceEvent({"level": "warning", "message": warning})))
    assert view.message.text() == f"router: warning: {warning}"
    assert view.events.toPlainText().endswith(f"router: warning: {warning}")
    emit(InstanceEvent("a", StateEvent("ready")))
    view.select("a")
    assert view.model.text(1, "state") == "ready"
    assert view.open_monitor.isEnabled()  # it serves: Monitor can follow it
    assert not view.inst_stop.isEnabled()  # the router is not up: the fleet is still starting
    emit(InstanceEvent("router", StateEvent("ready", url="http://127.0.0.1:18080")))
    emit(InstanceEvent("router", FactEvent("workers", [A])))
    assert view.phase_label.text() == "fleet: serving"
    assert (view.inst_stop.isEnabled(), view.inst_restart.isEnabled()) == (True, True)
    assert not view.inst_start.isEnabled()
    assert texts(view, "router")[1:] == ["routed", "not routed"]

    emit(InstanceEvent("a", StateEvent("crashed", reason="killed")))
    assert view.message.text() == "a crashed: killed"  # said, not an empty line
    emit(InstanceEvent("a", RestartEvent(1, 2.0)))
    assert view.model.text(1, "state") == "crashed: killed (restart 1 in 2 s)"
    assert (
        view.model.data(view.model.index(1, view.model.column("state")), Qt.ForegroundRole).name()
        == "#c62828"
    )
    assert view.message.text() == "a: restart 1 in 2 s"
    news = view.events.toPlainText()
    assert "router: ready http://127.0.0.1:18080" in news and "a: crashed killed" in news
    assert (view.inst_start.isEnabled(), view.inst_restart.isEnabled()) == (True, True)
    assert not view.inst_stop.isEnabled()
    assert view.open_monitor.isEnabled()  # a crashed instance's log is worth following
    with qtbot.assertNotEmitted(view.instance_chosen):  # but there is nothing to attach to
        qtbot.mouseClick(view.open_monitor, Qt.LeftButton)
    assert view.message.text().startswith("a is crashed: its log is in the Logs tab")
    # as the line promises: restarted and serving again, Monitor and Playground follow it
    with qtbot.waitSignal(view.instance_chosen) as chosen:
        emit(InstanceEvent("a", StateEvent("ready")))
    assert chosen.args == [A, "", True]  # (Open in Monitor: the Monitor comes to the front)
    with qtbot.assertNotEmitted(view.instance_chosen):  # once, not on every event
        emit(InstanceEvent("a", StateEvent("ready")))
    emit(InstanceEvent("a", StateEvent("crashed", reason="killed")))

    facts = {"requests": 7, "retries": 1, "errors": 0, "workers": [{"url": A, "healthy": False}]}
    emit(InstanceEvent("router", FactEvent("router", facts)))
    assert view.model.text(0, "router") == "7 requests · 1 retries · 0 errors"
    assert view.model.text(1, "router") == "routed · unhealthy"
    view.select("router")
    for b in (view.inst_start, view.inst_stop, view.inst_restart, view.open_monitor):
        assert not b.isEnabled()  # the router is the fleet's: Start/Stop fleet act on it


def test_events_from_the_fleets_threads_reach_the_table_queued(qtbot, view: FleetView) -> None:
    import threading

    fleet = Fleet(view.spec)
    view.watch(fleet)
    t = threading.Thread(target=fleet._events.emit, args=(InstanceEvent("b", StateEvent("ready")),))
    t.start()
    t.join()
    assert view.model.text(2, "state") == "stopped"  # not touched from the other thread
    qtbot.waitUntil(lambda: view.model.text(2, "state") == "ready", timeout=5_000)


def test_a_fleet_that_fails_its_checks_starts_nothing(qtbot, tmp_path: Path) -> None:
    model = write_checkpoint(tmp_path / "model", TINY_LLAMA)
    profile = {"model": str(model)}
    path = tmp_path / "clash.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "router": {"port": 18080},
                "instances": [
                    {"name": "a", "port": 18001, "profile": profile},
                    {"name": "b", "port": 18001, "profile": profile},
                ],
            }
        )
    )
    v = FleetView()
    qtbot.addWidget(v)
    v.load(str(path))
    qtbot.waitUntil(lambda: v.start_button.isEnabled(), timeout=10_000)
    qtbot.mouseClick(v.start_button, Qt.LeftButton)
    qtbot.waitUntil(lambda: v.job is None, timeout=20_000)
    assert "both use port 18001" in v.message.text() and "\n" not in v.message.text()
    assert v.start_button.isEnabled() and v.phase_label.text() == "fleet: stopped"
    assert all(s.pid is None for s in v.fleet.servers.values())  # nothing was started
    assert running_fleet() is None
    v.shutdown()


def test_the_edit_form_round_trips_the_file(qtbot, fleet_file: Path) -> None:
    dialog = FleetEditDialog(str(fleet_file), read_document(fleet_file))
    qtbot.addWidget(dialog)
    assert dialog.port.value() == 18080 and dialog.policy.currentText() == "round_robin"
    assert dialog.table.rowCount() == 2
    assert dialog.table.item(1, 6).text() == "0-1"
    assert dialog.table.cellWidget(0, 4).currentText() == "on-failure"
    assert dialog.save()  # unchanged: the same fleet
    assert yaml.safe_load(fleet_file.read_text())["router"]["retries"] == 2

    dialog = FleetEditDialog(str(fleet_file), read_document(fleet_file))
    qtbot.addWidget(dialog)
    dialog.port.setValue(18090)
    dialog.table.item(1, 2).setText("18012")
    dialog.table.cellWidget(1, 3).setCurrentText("primary")
    qtbot.mouseClick(dialog.add_button, Qt.LeftButton)
    dialog.table.item(2, 0).setText("far")
    from PySide6.QtWidgets import QTableWidgetItem

    dialog.table.setItem(2, 1, QTableWidgetItem("http://127.0.0.1:9"))
    assert dialog.save()
    spec = load_fleet(fleet_file)
    assert spec.router.port == 18090 and spec.router.flags == ["--retry-max-retries=2"]
    a, b, far = spec.instances
    assert (a.restart, b.url, b.role, b.cpus) == (
        "on-failure",
        "http://127.0.0.1:18012",
        "primary",
        "0-1",
    )
    assert (far.name, far.url) == ("far", "http://127.0.0.1:9")


def test_edit_fleet_without_a_file_asks_for_its_name_at_save(
    qtbot, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: Edit fleet… with no file asked for a file name first, and a new instance read
    restart "no". Now the form opens at once; a new instance is restarted on failure; the
    name is asked for at Save (cancelled: nothing written, the form stays)."""
    from PySide6.QtWidgets import QFileDialog, QTableWidgetItem

    dialog = FleetEditDialog(None, {})
    qtbot.addWidget(dialog)
    assert dialog.windowTitle() == "Fleet: a new fleet file" and dialog.table.rowCount() == 0
    qtbot.mouseClick(dialog.add_button, Qt.LeftButton)
    assert dialog.table.cellWidget(0, 4).currentText() == "on-failure"
    profile = tmp_path / "a.yaml"
    profile.write_text(yaml.safe_dump({"model": str(tmp_path / "m")}))
    dialog.table.setItem(0, 1, QTableWidgetItem(str(profile)))
    answers = iter([("", ""), (str(tmp_path / "new.yaml"), "")])
    monkeypatch.setattr(QFileDialog, "getSaveFileName", lambda *a, **k: next(answers))
    assert not dialog.save() and not (tmp_path / "new.yaml").exists()  # cancelled
    saved = dialog.save()
    assert saved, dialog.error.text()
    assert dialog.path == str(tmp_path / "new.yaml")
    written = yaml.safe_load((tmp_path / "new.yaml").read_text())
    assert written["instances"][0]["restart"] == "on-failure"


def test_the_edit_form_shows_the_files_error_in_one_line(qtbot, fleet_file: Path) -> None:
    dialog = FleetEditDialog(str(fleet_file), read_document(fleet_file))
    qtbot.addWidget(dialog)
    before = fleet_file.read_text()
    dialog.table.item(0, 2).setText("eighty")
    assert not dialog.save()
    assert dialog.error.text() == "instance 'a': 'port' must be a number, got 'eighty'"
    assert fleet_file.read_text() == before  # refused before writing
    dialog.table.item(0, 2).setText("18001")
    dialog.table.item(1, 0).setText("a")
    assert not dialog.save()
    assert "two instances are named 'a'" in dialog.error.text()
    assert "\n" not in dialog.error.text() and dialog.result() == 0  # still open


@pytest.fixture
def window(qtbot) -> Any:
    win = MainWindow(device=cpu_device(), probe=False)
    qtbot.addWidget(win)
    yield win
    win.controller.shutdown()
    win.fleet.shutdown()


def test_open_in_monitor_attaches_and_logs_follow_the_instance(
    qtbot, window: MainWindow, fleet_file: Path
) -> None:
    view = window.fleet
    view.load(str(fleet_file))
    qtbot.waitUntil(lambda: view.model.rowCount() == 3, timeout=10_000)
    fleet = Fleet(view.spec)
    view.watch(fleet)
    fleet.servers["a"].log_tail.extend(["INFO earlier line 1", "INFO earlier line 2"])
    fleet._events.emit(InstanceEvent("a", StateEvent("ready")))
    view.select("a")
    qtbot.mouseClick(view.open_monitor, Qt.LeftButton)
    assert window.tabs.currentWidget() is window._monitor_box
    fleet._events.emit(InstanceEvent("a", LogEvent("INFO a new line")))
    fleet._events.emit(InstanceEvent("b", LogEvent("INFO not this instance")))
    logs = window.logs.text()
    assert "earlier line 2" in logs and "a new line" in logs
    assert "not this instance" not in logs
    # the window's attach path took the instance's URL (no server answers there: its error)
    qtbot.waitUntil(lambda: "127.0.0.1:18001" in window.launch.message.text(), timeout=20_000)


# -- a recording, replayed; the Monitor's overlay of the instances -----------------------------
def test_a_fleet_recording_replays_rows_news_and_the_instances_overlay(
    qtbot, view: FleetView, tmp_path: Path
) -> None:
    from fleet_recording import SECONDS, T0, write_fleet_recording

    from quantdeck.gui.monitor import MonitorPanel

    assert view.spec is not None
    path = write_fleet_recording(tmp_path / "fleet.jsonl", view.spec)
    view.replay(str(path))
    qtbot.waitUntil(lambda: view.phase == "replay", timeout=10_000)
    assert texts(view, "instance") == ["router", "a", "b"]
    assert texts(view, "state") == ["ready", "crashed: exit code -9 (restart 1 in 1 s)", "ready"]
    # a crashed shows no stale figures; b's are its last sample's
    assert texts(view, "KV %")[1:] == ["", "5"]
    assert texts(view, "run/wait")[2] == "1/0" and texts(view, "tok/s")[2] == "20.0"
    assert texts(view, "router")[0].endswith("fallback on")
    assert texts(view, "router")[2] == "routed"
    news = view.events.toPlainText().splitlines()
    crash = time.strftime("%H:%M:%S", time.localtime(T0 + 40))
    assert f"{crash}  a: crashed exit code -9" in news  # stamped with the recorded time
    assert any("router: fallback on: the primaries' ttft_p99_ms 812 ms" in n for n in news)
    assert "replay: fleet.jsonl · 2 instances" in view.path_label.text()
    assert not view.start_button.isEnabled()  # a replay, not a fleet: nothing to start

    # the Monitor overlays the instances, one curve each, on one time axis
    monitor = MonitorPanel()
    qtbot.addWidget(monitor)
    monitor.set_instances(view.series)
    monitor.refresh(force=True)
    assert not monitor.instances_box.isHidden()
    kv = {c.label: c for c in monitor._plot_curves["KV-cache % by instance"]}
    assert set(kv) == {"a", "b"}
    xa, ya = kv["a"].getData()
    xb, yb = kv["b"].getData()
    assert list(ya) == [10.0 + i for i in range(SECONDS)] and set(yb) == {5.0}
    assert xb[-1] == 0.0 and xa[-1] == -0.5  # b sampled half a second after a
    monitor.instances_box.setChecked(False)  # unticked: the row of instance plots goes
    monitor.refresh(force=True)  # (a hidden panel redraws when shown)
    assert "KV-cache % by instance" not in monitor.plots
    monitor.instances_box.setChecked(True)
    monitor.refresh(force=True)
    assert "KV-cache % by instance" in monitor.plots


def test_a_recording_that_is_not_a_fleets_is_one_line(
    qtbot, view: FleetView, tmp_path: Path
) -> None:
    from quantdeck.core.events import MetricsEvent
    from quantdeck.core.monitor import Recorder

    rec = Recorder(tmp_path / "serve.jsonl", {"source": "serve"})
    rec.write(MetricsEvent.from_values(1.0, {"running": 1}))
    rec.close()
    view.replay(str(tmp_path / "serve.jsonl"))
    qtbot.waitUntil(lambda: view.message.text() != "", timeout=10_000)
    assert view.message.text().startswith("not a fleet recording (no 'fleet' fact)")
    assert texts(view, "state") == ["stopped"] * 3  # the file's rows stay


def test_the_window_replays_a_fleet_recording_in_a_window_of_its_own(
    qtbot, fleet_file: Path, tmp_path: Path
) -> None:
    """Before issue 44 it went to the Fleet tab, which overlaid its instances on the live
    Monitor's plots; tests/gui/test_gui_monitor_instances.py has the window's details."""
    from fleet_recording import write_fleet_recording

    win = MainWindow()
    qtbot.addWidget(win)
    path = write_fleet_recording(tmp_path / "fleet.jsonl", load_fleet(fleet_file))
    assert win.open_recording(str(path)) > 60
    (replay,) = win.replays
    assert set(replay.panel.instances) == {"a", "b"}  # the overlay is the replay's
    assert len(replay.panel.instances["a"]) == 30
    assert win.monitor.instances == {} and win.fleet.phase == "no fleet"
    win.close()


def test_the_overlay_waits_for_the_first_point(qtbot, view: FleetView) -> None:
    """A fleet file only opened gives the Monitor its instances but no empty row of plots."""
    from quantdeck.core.events import MetricsEvent
    from quantdeck.gui.monitor import MonitorPanel

    monitor = MonitorPanel()
    qtbot.addWidget(monitor)
    monitor.set_instances(view.series)
    monitor.refresh(force=True)
    assert set(monitor.instances) == {"a", "b"}
    assert "Running by instance" not in monitor.plots
    view.series["b"].append(MetricsEvent.from_values(1.0, {"running": 3}))
    monitor.refresh(force=True)
    assert "Running by instance" in monitor.plots
    running = {c.label: c.getData()[1] for c in monitor._plot_curves["Running by instance"]}
    assert list(running["b"]) == [3.0] and len(running["a"]) == 0


@pytest.mark.server
def test_stop_fleet_detaches_the_views_and_the_status_bar_says_what_serves(
    qtbot, window: MainWindow, demo_server, tmp_path: Path
) -> None:
    """Before: after Stop fleet the Monitor stayed green "attached" to a dead instance, and
    the status bar said "stopped" while a fleet served."""
    from quantdeck.core.runtime import free_port

    path = tmp_path / "remote.yaml"
    doc = {"router": {"port": free_port()}, "instances": [{"name": "r", "url": demo_server.url}]}
    path.write_text(yaml.safe_dump(doc))
    view = window.fleet
    view.load(str(path))
    qtbot.waitUntil(lambda: view.model.rowCount() == 2, timeout=10_000)
    fleet = Fleet(view.spec)
    view.watch(fleet)
    fleet._events.emit(InstanceEvent("r", StateEvent("ready")))
    fleet._events.emit(InstanceEvent("router", StateEvent("ready")))
    qtbot.waitUntil(lambda: view.phase == "serving", timeout=5_000)
    assert "fleet serving" in window.state_label.text()
    assert "stopped" in window.state_label.text()  # the Launch tab's own server: none
    view.select("r")
    qtbot.mouseClick(view.open_monitor, Qt.LeftButton)
    qtbot.waitUntil(lambda: window.controller.attached is not None, timeout=20_000)
    qtbot.waitUntil(lambda: "attached" in window.state_label.text(), timeout=5_000)
    # the fleet stops: the views attached to its instance are detached
    view.phase = "stopped"
    view._update_buttons()
    qtbot.waitUntil(lambda: window.controller.attached is None, timeout=10_000)
    qtbot.waitUntil(lambda: "stopped" in window.state_label.text(), timeout=5_000)
    assert "fleet" not in window.state_label.text()
    cue = window.monitor.source_state  # (the controller's "stopped" comes queued)
    qtbot.waitUntil(lambda: "stopped at" in cue.text(), timeout=5_000)
    assert demo_server.state == "ready"  # detached from, not stopped: it is not ours
