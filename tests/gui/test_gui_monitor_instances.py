"""The Monitor per fleet instance (issue 44), without a server.

The Launch tab's fleet of one serves (its fleet file read by the Fleet tab, a real
:class:`Fleet` watched, as tests/gui/test_gui_launch_router.py plays it); the server
controller's attach is the one part stood in for: it says what the real one says (``stopped``
for the instance left, ``attached`` for the new URL) and its samples come through its
``metrics`` signal. A live trial (a real :class:`LiveTrial`, not started) is promoted, then
undone: the Monitor keeps one source for the instance across both URL changes, its samples
from before the promotion kept, the trial's start, the promotion and the undo marked on it.

A fleet recording written by the core's recorder, opened while the Monitor follows a server,
replays in a window of its own (each instance a source, the fleet's instances overlaid there,
a Fleet page of its rows and news); the live Monitor's plots and samples stay as they were.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from ckpt import TINY_LLAMA, write_checkpoint
from conftest import metrics_event
from live_trials import trial_of
from PySide6.QtCore import Qt

from quantdeck.core.events import InstanceEvent, MarkerEvent, StateEvent
from quantdeck.core.fleet import Fleet, load_fleet
from quantdeck.core.fleet.live import LiveTrial
from quantdeck.core.launch import cpu_device
from quantdeck.core.runtime import free_port
from quantdeck.gui.main_window import MainWindow
from quantdeck.gui.monitor import MonitorPanel, ReplayWindow


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QUANTDECK_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture
def win(qtbot: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[MainWindow]:
    """The window with the tiny model chosen; the fleet's start recorded (it would start
    vLLM); the controller's attach saying what the real one says, with nothing to attach to."""
    w = MainWindow(device=cpu_device(), probe=False)
    qtbot.addWidget(w)
    w.add_model(write_checkpoint(tmp_path / "model", TINY_LLAMA), select=True)
    ed = w.launch.form.editors
    ed["max_num_seqs"].set_value(3)
    ed["enforce_eager"].set_value(True)
    ed["port"].set_value(free_port())
    w.launch._on_form_changed()
    w.launch.engine_box.set_engines([("alt", sys.executable)], sys.executable)
    w.attached: list[str] = []  # type: ignore[misc]

    def attach(url: str, key: str | None = None) -> None:
        if w.attached:  # the instance left: as the controller's _shutdown says it
            w.controller.event.emit(StateEvent("stopped"))
        w.attached.append(url)
        w.controller.event.emit(StateEvent("attached", url=url, models=["m"]))

    monkeypatch.setattr(w.controller, "attach", attach)
    w.fleet_starts: list[str | None] = []  # type: ignore[misc]
    monkeypatch.setattr(w.fleet, "start_fleet", lambda: w.fleet_starts.append(w.fleet.path))
    yield w
    w.fleet.shutdown()
    w.recordings.close_all()


def serve_behind_router(qtbot: Any, w: MainWindow) -> Fleet:
    """Start behind the router; its fleet of one serving through a real Fleet's events."""
    w.launch.behind_router.setChecked(True)
    qtbot.mouseClick(w.launch.start_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: len(w.fleet_starts) == 1, timeout=10_000)
    assert w.fleet.spec is not None
    fleet = Fleet(w.fleet.spec)
    w.fleet.watch(fleet)
    fleet._events.emit(InstanceEvent("serve", StateEvent("ready")))
    fleet._events.emit(InstanceEvent("router", StateEvent("ready", url=w.fleet.spec.router.url)))
    return fleet


def samples(w: MainWindow, t0: float, n: int, running: int) -> None:
    """``n`` samples of the URL attached, one a second from ``t0``, as the sampler sends them."""
    for i in range(n):
        w.controller.metrics.emit(metrics_event(t0 + i, running=running))


def promote(fleet: Fleet, t: LiveTrial) -> None:
    """``t`` admitted, its candidate serving, promoted (as Fleet._promote leaves the spec)."""
    t._event("admitted", reason="fits")
    fleet._events.emit(InstanceEvent("serve+try", StateEvent("ready")))
    fleet.spec.instances[0].cfg = t.cfg.copy()
    t._event("promoted", reason="saved")


def test_one_source_per_instance_across_a_promotion_and_its_undo(
    qtbot: Any, win: MainWindow
) -> None:
    fleet = serve_behind_router(qtbot, win)
    first = fleet.spec.instances[0].url
    assert win.attached == [first]
    panel = win.monitor
    key = panel.source_box.currentData()
    assert panel.source_box.currentText() == "serve (behind the router)"
    now = time.time()
    samples(win, now - 60, 10, running=2)
    store = panel.sources[key].store
    assert len(store) == 10
    # a trial promoted: the instance serves at the candidate's URL, the same source goes on
    tried = trial_of(fleet, 8)
    promote(fleet, tried)
    assert win.attached == [first, tried.url] and tried.url != first
    assert panel.source_box.currentData() == key and panel.store is store
    samples(win, now - 40, 5, running=4)
    # undone: back to max-num-seqs 3, at the undo's URL, still the same source
    undo = trial_of(fleet, 3, undo="undo of the promotion (max-num-seqs 3 → 8)")
    promote(fleet, undo)
    assert win.attached == [first, tried.url, undo.url]
    samples(win, now - 30, 5, running=3)
    assert set(panel.sources) == {"server", key}  # no source per URL
    assert not any(k.startswith("url ") for k in panel.sources)
    assert panel.store is store and len(store) == 20  # the first samples kept
    _, cols = store.window(600.0, ["running"])
    assert list(cols["running"]) == [2.0] * 10 + [4.0] * 5 + [3.0] * 5
    labels = [(m.what, m.label) for m in panel.timeline.markers]
    assert labels == [
        ("trial", "trial admitted: max-num-seqs 3 → 8 (fits)"),
        ("promoted", "promoted max-num-seqs 8 (saved)"),
        ("trial", "undo admitted: back to max-num-seqs 3 (fits)"),
        ("undone", "undone: back to max-num-seqs 3 (saved)"),
    ]
    promoted = panel.timeline.markers[1]
    assert promoted.diff == {"max_num_seqs": [3, 8]}
    # the plots draw them, on the instance's samples (the first ones included)
    panel.refresh(force=True)
    assert {m.what for m, _, _ in panel.marker_lines.items} == {"trial", "promoted", "undone"}
    assert list(panel.data_of("running"))[:10] == [2.0] * 10
    # the fleet's instances overlaid on its instance's source, not on the server's: the
    # fleet stopped, a start on the Launch tab shows its server without them
    assert set(panel.instances) == {"serve"} and not panel.instances_box.isHidden()
    fleet._events.emit(InstanceEvent("serve", metrics_event(now - 29, kv_usage_pct=7.0)))
    panel.refresh(force=True)
    assert len(panel.instances["serve"]) == 1 and "KV-cache % by instance" in panel.plots
    fleet._events.emit(InstanceEvent("router", StateEvent("stopped")))
    win.controller.event.emit(StateEvent("stopped"))
    panel.add_server_event(MarkerEvent("launch", "launch", config={"model": "/m"}))
    assert panel.source_box.currentData() == "server"
    assert panel.instances == {} and panel.instances_box.isHidden()
    panel.refresh(force=True)
    assert not any("by instance" in title for title in panel.plots)


def test_a_plain_url_is_a_source_of_its_own(qtbot: Any, win: MainWindow) -> None:
    """The Launch tab's attach row: a source named by its URL, as before."""
    url = "http://127.0.0.1:18999"
    win.launch.attach_requested.emit(url, "")
    panel = win.monitor
    assert panel.source_box.currentText() == f"attached {url}"
    assert panel.instances == {}


def fleet_recording(tmp_path: Path) -> Path:
    """A recording of a fleet of two (tests/fleet_recording.py, the core's Recorder)."""
    from fleet_recording import write_fleet_recording

    model = write_checkpoint(tmp_path / "fleet-model", TINY_LLAMA)
    profile = {"model": str(model), "max-num-seqs": 2}
    doc = {
        "router": {"port": 18080},
        "instances": [
            {"name": "a", "port": 18001, "profile": profile},
            {"name": "b", "port": 18002, "role": "backup", "profile": profile},
        ],
    }
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump(doc))
    return write_fleet_recording(tmp_path / "fleet.jsonl", load_fleet(path))


def test_a_fleet_recording_opens_in_its_own_window(
    qtbot: Any, win: MainWindow, tmp_path: Path
) -> None:
    from fleet_recording import SECONDS

    panel: MonitorPanel = win.monitor
    now = time.time()
    panel.add_server_event(MarkerEvent("launch", "launch", config={"model": "/m"}, t=now - 20))
    panel.add_server_event(StateEvent("ready", t=now - 19))
    samples(win, now - 18, 12, running=5)
    panel.refresh(force=True)
    before = (
        dict(panel.sources),
        {k: len(s.store) for k, s in panel.sources.items()},
        list(panel.data_of("running")),
        list(panel.plots),
    )
    shown = win.tabs.currentWidget()
    path = fleet_recording(tmp_path)
    assert win.open_recording(str(path)) > 60
    # a window of its own: each instance a source, the first shown, both overlaid
    (replay,) = win.replays
    assert isinstance(replay, ReplayWindow)
    rp = replay.panel
    assert [rp.source_box.itemText(i) for i in range(rp.source_box.count())] == [
        "instance a of fleet fleet.yaml",
        "instance b of fleet fleet.yaml",
    ]
    assert len(rp.store) == SECONDS and set(rp.instances) == {"a", "b"}
    rp.refresh(force=True)
    kv = {c.label: c for c in rp._plot_curves["KV-cache % by instance"]}
    assert set(kv) == {"a", "b"}
    assert list(kv["a"].getData()[1]) == [10.0 + i for i in range(SECONDS)]
    fleet_markers = [m.what for m in rp.timeline.markers]
    assert fleet_markers == ["fleet"]  # the fallback switch, on each instance's source
    # its Fleet page: the rows as they ended, the news with their times
    pages = [replay.pages.tabText(i) for i in range(replay.pages.count())]
    assert pages == ["Plots", "Fleet", "Events"]
    page = replay.pages.widget(1)
    assert page.model.text(1, "state") == "crashed: exit code -9 (restart 1 in 1 s)"
    assert "a: crashed exit code -9" in page.news.toPlainText()
    assert "[state] crashed exit code -9" in replay.events.text()
    # the live Monitor as it was: its sources, samples, plots; no overlay; the Fleet tab too
    panel.refresh(force=True)
    after = (
        dict(panel.sources),
        {k: len(s.store) for k, s in panel.sources.items()},
        list(panel.data_of("running")),
        list(panel.plots),
    )
    assert after == before and panel.instances == {} and panel.instances_box.isHidden()
    assert win.tabs.currentWidget() is shown
    assert win.fleet.phase == "no fleet" and win.fleet.replayed is None


def test_the_fleet_tabs_replay_leaves_the_monitor_alone(
    qtbot: Any, win: MainWindow, tmp_path: Path
) -> None:
    """The Fleet tab's own Open recording…: its rows and news, the Monitor's plots untouched."""
    panel = win.monitor
    samples(win, time.time() - 10, 5, running=1)
    view = win.fleet
    view.replay(str(fleet_recording(tmp_path)))
    qtbot.waitUntil(lambda: view.phase == "replay", timeout=10_000)
    assert view.model.text(1, "state") == "crashed: exit code -9 (restart 1 in 1 s)"
    assert panel.instances == {} and list(panel.sources) == ["server"]
    assert len(panel.store) == 5


def test_a_crashed_instance_ends_its_alerts_and_its_cue_says_so(
    qtbot: Any, win: MainWindow
) -> None:
    """The instance's fleet says it crashed (its URL only stops answering): its source's cue
    says crashed and its active alerts end with it, as a server's do when it stops; serving
    again, the cue goes."""
    fleet = serve_behind_router(qtbot, win)
    panel = win.monitor
    assert panel.source_box.currentText() == "serve (behind the router)"
    panel.ttft_limit.setValue(100)
    now = time.time()
    for i in range(10):
        win.controller.metrics.emit(metrics_event(now - 10 + i, ttft_p99_ms=500.0))
    panel.refresh(force=True)
    qtbot.waitUntil(lambda: any(a.key == "ttft" for a in panel.alerts.active), timeout=5_000)
    fleet._events.emit(InstanceEvent("serve", StateEvent("crashed", reason="killed")))
    assert panel.alerts.active == []
    (ttft,) = [a for a in panel.alerts.alerts if a.key == "ttft"]
    assert ttft.ended == "server crashed"
    assert "crashed at" in panel.source_state.text()
    fleet._events.emit(InstanceEvent("serve", StateEvent("ready")))
    assert "crashed" not in panel.source_state.text()
