"""The Launch tab serving behind the router (a fleet of one), without a server.

Start with "Behind the router" checked writes the fleet file of one that ``quantdeck serve
--behind-router`` writes (the form's knobs, the chosen engine) and the Fleet tab reads it; the
fleet's start is the only part stood in for (it would start vLLM): the test then plays the
fleet's own events through a real :class:`Fleet`, as tests/gui/test_gui_trial.py does. The
Launch tab's state line, Stop, Monitor's attach and "Try live…" follow them; the Try live
dialog opens with the Launch form's knobs as the candidate and the diff shown.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from ckpt import TINY_LLAMA, write_checkpoint
from live_trials import trial_of
from PySide6.QtCore import Qt

from quantdeck.core.events import InstanceEvent, StateEvent
from quantdeck.core.fleet import Fleet
from quantdeck.core.launch import cpu_device
from quantdeck.core.runtime import free_port
from quantdeck.gui.fleet import TryLiveDialog
from quantdeck.gui.main_window import MainWindow


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QUANTDECK_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture
def model(tmp_path: Path) -> Path:
    return write_checkpoint(tmp_path / "model", TINY_LLAMA)


@pytest.fixture
def win(qtbot: Any, model: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[MainWindow]:
    """The window with the tiny model chosen, the form at max-num-seqs 3 and eager, another
    engine chosen (this Python, by path), Monitor's attach recorded (nothing to attach to)
    and the fleet's start recorded (it would start vLLM)."""
    w = MainWindow(device=cpu_device(), probe=False)
    qtbot.addWidget(w)
    w.add_model(model, select=True)
    ed = w.launch.form.editors
    ed["max_num_seqs"].set_value(3)
    ed["enforce_eager"].set_value(True)
    ed["kv_cache_memory_bytes"].set_value(64 * 2**20)
    ed["port"].set_value(free_port())
    w.launch._on_form_changed()
    w.launch.engine_box.set_engines([("alt", sys.executable)], sys.executable)
    w.attached: list[str] = []  # type: ignore[misc]
    monkeypatch.setattr(w.controller, "attach", lambda url, key=None: w.attached.append(url))
    w.fleet_starts: list[str | None] = []  # type: ignore[misc]
    monkeypatch.setattr(w.fleet, "start_fleet", lambda: w.fleet_starts.append(w.fleet.path))
    yield w
    w.fleet.shutdown()


def start_behind_router(qtbot: Any, w: MainWindow) -> Path:
    """Check Behind the router, press Start; the fleet file once the Fleet tab has read it."""
    launch = w.launch
    launch.behind_router.setChecked(True)
    assert launch.start_button.isEnabled(), launch.start_button.toolTip()
    qtbot.mouseClick(launch.start_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: len(w.fleet_starts) == 1, timeout=10_000)
    assert w.fleet.path is not None
    return Path(w.fleet.path)


def serve(w: MainWindow) -> Fleet:
    """The fleet of one as it serves: a real Fleet of the file the Fleet tab read, its
    instance and router ready through its own events."""
    assert w.fleet.spec is not None
    fleet = Fleet(w.fleet.spec)
    w.fleet.watch(fleet)
    fleet._events.emit(InstanceEvent("serve", StateEvent("ready")))
    fleet._events.emit(InstanceEvent("router", StateEvent("ready", url=w.fleet.spec.router.url)))
    return fleet


def test_start_behind_the_router_writes_a_fleet_of_one_the_fleet_tab_reads(
    qtbot: Any, win: MainWindow, model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    port = win.launch.config().server.port
    path = start_behind_router(qtbot, win)
    assert path == tmp_path / "cache" / "fleet" / f"serve-{port}.yaml"
    doc = yaml.safe_load(path.read_text())
    assert doc["router"] == {"host": "127.0.0.1", "port": port}
    (inst,) = doc["instances"]
    assert inst["name"] == "serve" and inst["port"] != port
    assert inst["engine"] == sys.executable  # the Launch tab's chosen engine
    profile = inst["profile"]
    assert profile["model"] == str(model)
    assert profile["max-num-seqs"] == 3 and profile["enforce-eager"] is True
    assert profile["kv-cache-memory-bytes"] == 64 * 2**20 and "port" not in profile
    # the Fleet tab has it, and was asked to start it; no plain server was started
    assert win.fleet_starts == [str(path)]
    names = [win.fleet.model.text(i, "instance") for i in range(win.fleet.model.rowCount())]
    assert names == ["router", "serve"]
    assert "max-num-seqs=3" in win.fleet.model.text(1, "knobs")
    assert win.controller.server is None
    launch = win.launch
    assert launch.stage.text().startswith("starting behind the router")
    assert not launch.start_button.isEnabled() and not launch.behind_router.isEnabled()
    assert launch.stop_button.isEnabled() and not launch.restart_button.isEnabled()
    # Stop on the Launch tab stops the fleet, not a plain server
    stops: list[str] = []
    monkeypatch.setattr(win.fleet, "stop_fleet", lambda: stops.append("fleet"))
    monkeypatch.setattr(win.controller, "stop", lambda: stops.append("server"))
    qtbot.mouseClick(launch.stop_button, Qt.MouseButton.LeftButton)
    assert stops == ["fleet"]


def test_the_launch_tab_and_the_monitor_follow_the_fleet_of_one(
    qtbot: Any, win: MainWindow
) -> None:
    start_behind_router(qtbot, win)
    assert win.fleet.spec is not None
    router = win.fleet.spec.router.url
    fleet = serve(win)
    launch = win.launch
    assert launch.stage.text() == (
        f"serving behind the router at {router}\nits fleet of one: Fleet tab"
    )
    assert "serving behind the router" in win.state_label.text()
    # Monitor, Logs and Playground follow the instance, the Launch tab staying in front
    serve_url = win.fleet.spec.instances[0].url
    assert win.attached == [serve_url] and win.fleet.chosen == "serve"
    assert win.tabs.currentWidget() is launch
    # a promotion moves the instance to the candidate's port: the Monitor follows it there
    trial = trial_of(fleet, 8)
    trial._event("admitted", reason="fits")
    fleet._events.emit(InstanceEvent("serve+try", StateEvent("ready")))
    fleet.spec.instances[0].cfg = trial.cfg.copy()  # as Fleet._promote does
    trial._event("promoted", reason="saved")
    assert trial.url != serve_url and win.attached == [serve_url, trial.url]
    # the fleet stops: so does the Launch tab's state line
    fleet._events.emit(InstanceEvent("router", StateEvent("stopped")))
    assert launch.stage.text() == "stopped" and launch.behind_router.isEnabled()


def test_the_monitor_shows_the_instance_starting_not_the_last_server(
    qtbot: Any, win: MainWindow
) -> None:
    """While the fleet of one starts, the Monitor shows its instance's source starting (not
    the last server's "stopped"), and attaches to it, once, when it serves."""
    start_behind_router(qtbot, win)
    assert win.fleet.spec is not None
    fleet = Fleet(win.fleet.spec)
    win.fleet.watch(fleet)
    win.fleet.phase = "starting"  # as start_fleet does (stood in for: it would start vLLM)
    win.fleet.changed.emit()
    assert win.fleet.chosen is None  # not yet begun: it is not told as "stopped"
    fleet._events.emit(InstanceEvent("serve", StateEvent("starting")))
    panel = win.monitor
    assert win.fleet.chosen == "serve"
    assert win.fleet.message.text().startswith("serve is starting: its log is in the Logs tab")
    assert panel.source_box.currentText() == "serve (behind the router)"
    assert panel.source_state.text().startswith("… starting since")
    assert win.attached == []  # nothing serves yet
    fleet._events.emit(InstanceEvent("serve", StateEvent("ready")))
    fleet._events.emit(InstanceEvent("router", StateEvent("ready", url=win.fleet.spec.router.url)))
    assert win.attached == [win.fleet.spec.instances[0].url]
    assert win.fleet.message.text() == ""  # it serves: "… once it serves" is said no more
    assert win.tabs.currentWidget() is win.launch  # the Launch tab stays in front
    fleet._events.emit(InstanceEvent("serve", StateEvent("ready")))  # (a scrape's repeat)
    assert len(win.attached) == 1


def test_try_live_is_on_only_while_it_serves_with_a_diff_and_no_trial(
    qtbot: Any, win: MainWindow
) -> None:
    launch, ed = win.launch, win.launch.form.editors
    button = launch.try_live_button
    assert not button.isEnabled() and "Behind the router" in button.toolTip()
    start_behind_router(qtbot, win)
    assert not button.isEnabled() and "the fleet of one is starting" in button.toolTip()
    fleet = serve(win)
    assert not button.isEnabled()
    assert button.toolTip().startswith("the form's knobs are the running launch's")
    ed["max_num_seqs"].set_value(8)
    launch._on_form_changed()
    assert button.isEnabled() and "quantdeck fleet try" in button.toolTip()
    ed["max_num_seqs"].set_value(3)
    launch._on_form_changed()
    assert not button.isEnabled()
    ed["max_num_seqs"].set_value(8)
    launch._on_form_changed()
    assert button.isEnabled()
    # a trial under way: one at a time
    trial = trial_of(fleet, 8)
    trial._event("admitted", reason="fits")
    win.fleet.show_trial(trial)
    assert not button.isEnabled() and "a trial is under way" in button.toolTip()
    # promoted: the running launch is the candidate's, which the form holds
    fleet._events.emit(InstanceEvent("serve+try", StateEvent("ready")))
    fleet.spec.instances[0].cfg = trial.cfg.copy()
    trial._event("decided", decision="promote", reason="better")
    trial._event("promoted", reason="saved")
    trial.done.set()
    fleet._events.emit(InstanceEvent("serve", StateEvent("ready")))
    assert not button.isEnabled()
    assert button.toolTip().startswith("the form's knobs are the running launch's")
    ed["max_num_seqs"].set_value(4)
    launch._on_form_changed()
    assert button.isEnabled()


def test_the_form_follows_a_promotion_and_its_undo(qtbot: Any, win: MainWindow) -> None:
    """After Promote the Launch form holds the running knobs and says so in the operator's
    words; after Undo it holds the launch from before ("Undone: back to …"), so Try live…
    never offers again the change just undone."""
    start_behind_router(qtbot, win)
    fleet = serve(win)
    launch = win.launch
    inst = fleet.spec.instances[0]
    assert inst.cfg is not None
    trial = trial_of(fleet, 8)
    trial._event("admitted", reason="fits")
    inst.cfg = trial.cfg.copy()  # as Fleet._promote does
    trial._event("promoted", reason="saved")
    assert launch.config().scheduler.max_num_seqs == 8
    assert launch.message.text() == "Promoted max-num-seqs 8 (Undo: the Fleet tab)"
    # a size reads as it was typed and as every view says it, not 67108864
    assert launch.form.editors["kv_cache_memory_bytes"].widget.text() == "64MiB"
    assert launch.config().server.port == int(win.fleet.spec.router.url.rsplit(":", 1)[1])
    assert not launch.try_live_button.isEnabled()  # the form is what serves
    undo = trial_of(fleet, 3, undo="undo of the promotion (max-num-seqs 3 → 8)", saved="")
    fleet.trial = undo
    undo._event("admitted", reason="a start")
    inst.cfg = undo.cfg.copy()
    undo._event("promoted")
    assert launch.config().scheduler.max_num_seqs == 3
    assert launch.message.text() == "Undone: back to max-num-seqs 3"
    assert not launch.try_live_button.isEnabled()


def test_try_live_opens_the_dialog_with_the_forms_knobs_and_the_diff(
    qtbot: Any, win: MainWindow, model: Path
) -> None:
    start_behind_router(qtbot, win)
    serve(win)
    launch = win.launch
    launch.form.editors["max_num_seqs"].set_value(8)
    launch._on_form_changed()
    qtbot.mouseClick(launch.try_live_button, Qt.MouseButton.LeftButton)
    dialog = win.fleet.trial_dialog
    assert isinstance(dialog, TryLiveDialog) and dialog.isVisible()
    assert win.tabs.currentWidget() is win.fleet
    selected = win.fleet.selected()
    assert selected is not None and selected.name == "serve"
    assert dialog.diff.text() == "changed: max-num-seqs 3 → 8"
    cfg = dialog.form.config()
    assert cfg.scheduler.max_num_seqs == 8 and cfg.compilation.enforce_eager
    running = win.fleet.running_launch("serve")
    assert running is not None
    assert cfg.model.model == str(model) and cfg.server.port == running.server.port
    # Start trial reaches the fleet: it refuses (its instance never started here), in red
    qtbot.mouseClick(dialog.ok_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: dialog.error.text() != "", timeout=10_000)
    assert dialog.error.text() == "instance 'serve' does not serve now: try it once it does"
    dialog.reject()


def test_a_fleet_of_the_users_that_runs_is_not_replaced(
    qtbot: Any, win: MainWindow, model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    own = tmp_path / "mine.yaml"
    profile = {"model": str(model)}
    own.write_text(
        yaml.safe_dump({"instances": [{"name": "a", "port": free_port(), "profile": profile}]})
    )
    win.fleet.load(str(own))
    qtbot.waitUntil(lambda: win.fleet.path == str(own), timeout=10_000)
    monkeypatch.setattr(win.fleet, "job", object())  # it runs (its worker)
    win.fleet.phase = "serving"
    launch = win.launch
    launch.behind_router.setChecked(True)
    qtbot.mouseClick(launch.start_button, Qt.MouseButton.LeftButton)
    line = launch.router_error.text()
    assert line.startswith("Not started: the Fleet tab runs mine.yaml; stop it there first")
    assert "\n" not in line and not launch.router_error.isHidden()
    assert win.fleet.path == str(own) and win.fleet_starts == []
    assert not (tmp_path / "cache" / "fleet").exists()
    assert launch.start_button.isEnabled() and launch.stage.text() == "stopped"


def test_a_fleet_file_refused_is_one_red_line(qtbot: Any, win: MainWindow, tmp_path: Path) -> None:
    launch = win.launch
    gone = str(tmp_path / "gone" / "python")  # an engine removed since it was chosen
    launch.engine_box.set_engines([("gone", gone)], gone)
    launch.behind_router.setChecked(True)
    qtbot.mouseClick(launch.start_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not launch.router_error.isHidden(), timeout=10_000)
    line = launch.router_error.text()
    assert line.startswith("Not started behind the router: ") and "\n" not in line
    assert f"'engine': engine {gone!r}: no engine of that name" in line
    assert win.fleet_starts == [] and launch.start_button.isEnabled()
    assert launch.stage.text() == "stopped"


def test_a_crashed_fleet_of_one_reads_down_in_every_view_with_restart_offered(
    qtbot: Any, win: MainWindow, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: the instance crashed, its Fleet row red, yet "fleet: serving", "● serving
    behind the router" and "serving … " on the Launch tab while clients got nothing. The
    word now comes from the instances (core/fleet/health.py), the same in every view, and the
    Launch tab's Restart starts the instance again."""
    start_behind_router(qtbot, win)
    fleet = serve(win)
    launch = win.launch
    assert "serving behind the router" in win.state_label.text()
    why = "engine process 1234 exited with code -9"
    fleet._events.emit(InstanceEvent("serve", StateEvent("crashed", reason=why)))
    said = f"no instance serves (serve crashed: {why})"
    assert win.fleet.phase_label.text() == f"fleet: down: {said}"
    assert f"down behind the router: {said}" in win.state_label.text()
    assert launch.stage.text().startswith(f"down behind the router at {fleet.spec.router.url}")
    assert said in launch.stage.text()
    assert launch.stop_button.isEnabled() and launch.restart_button.isEnabled()
    assert not launch.start_button.isEnabled() and not launch.try_live_button.isEnabled()
    restarts: list[tuple[str, str]] = []
    monkeypatch.setattr(win.fleet, "act_on", lambda name, action: restarts.append((name, action)))
    qtbot.mouseClick(launch.restart_button, Qt.MouseButton.LeftButton)
    assert restarts == [("serve", "restart_instance")]
    # it serves again: every view says so
    fleet._events.emit(InstanceEvent("serve", StateEvent("ready")))
    assert win.fleet.phase_label.text() == "fleet: serving"
    assert "serving behind the router" in win.state_label.text()
    assert launch.stage.text().startswith("serving behind the router")
    assert not launch.restart_button.isEnabled()
    # the router down is down too, whatever the instance
    fleet._events.emit(InstanceEvent("router", StateEvent("crashed", reason="killed by signal 9")))
    assert win.fleet.phase_label.text() == "fleet: down: the router crashed: killed by signal 9"
    assert "down behind the router" in win.state_label.text()
