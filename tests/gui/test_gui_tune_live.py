"""The Tune page's live mode (gui/live_tune.py in gui/bench/): the chain of live trials of
an instance of the Fleet tab's fleet.

Without a server: a real :class:`Fleet` of one instance (never started). The form's fields map
to the chain's settings; a Run the page cannot start (no fleet, an instance that does not serve,
a bad goal) is refused in one red line; and with ``start_trial`` standing in for the fleet's
(each trial a real :class:`LiveTrial`, never started, that a thread takes through its phases on
the fleet's own event path), the real chain (:class:`LiveTuner`, the worker) fills the table
from its events, trial by trial, the plot with both arms' goal figures, and says the final
launch; Cancel rolls back the trial under way.

With a server (marked ``server``): a fleet of one demo instance (max-num-seqs 1) in the Fleet
tab under 6 clients through the router; the Tune page's live chain over max_num_seqs=1,8
promotes 8, shown in the table, with no failed client request.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fleet_load import Load, fleet_file_of_one, tiny_fleet_file
from PySide6.QtCore import Qt

from quantdeck.core.bench.results import LiveTuneResult
from quantdeck.core.fleet import Fleet, load_fleet
from quantdeck.core.fleet.live import LiveTrial
from quantdeck.core.fleet.trial import TrialOptions
from quantdeck.core.launch import LaunchConfig
from quantdeck.core.payloads import TrialArms, Verdict
from quantdeck.gui.bench import TUNE_LIVE, TUNE_OFFLINE, BenchTab
from quantdeck.gui.live_tune import NO_FLEET, LiveTuneSettings
from quantdeck.gui.style import FORM_ERROR


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QUANTDECK_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture
def fleet(tmp_path: Path) -> Fleet:
    """A fleet of one instance 'a' (max-num-seqs 2) that runs nothing."""
    return Fleet(load_fleet(str(tiny_fleet_file(tmp_path))))


def _tab(qtbot: Any, fleet: Callable[[], Fleet | None]) -> BenchTab:
    tab = BenchTab(lambda: (None, None, None), LaunchConfig, lambda: False, fleet=fleet)
    qtbot.addWidget(tab)
    tab.resize(1400, 900)
    tab.show()
    qtbot.waitExposed(tab)
    tab.modes.setCurrentWidget(tab.tune_page)
    tab.tune_where.setCurrentText(TUNE_LIVE)
    return tab


def test_the_live_form_maps_to_the_chains_settings_and_hides_the_offline_fields(
    qtbot: Any, fleet: Fleet
) -> None:
    tab = _tab(qtbot, lambda: fleet)
    assert tab.live_mode and tab.live.is_visible()
    assert not tab.tune_ttft.isVisible() and not tab.load_box.isVisible()  # the fleet's load
    assert tab.results_model.column_names[:2] == ["trial", "knob change"]  # the live table
    assert [tab.live.instance.itemText(i) for i in range(tab.live.instance.count())] == ["a"]
    assert tab.live.settings() == LiveTuneSettings("a", TrialOptions())  # the CLI's defaults
    tab.live.goal.setCurrentText("itl_p99")
    tab.live.slo.setText("ttft_p99<=0.5s, itl_p99<=50ms")
    tab.live.min_requests.setValue(20)
    tab.live.max_duration.setValue(240)
    tab.live.budget.setValue(3)
    tab.live.budget_s.setValue(900)
    tab.live.until.setText("ttft_p99<=200ms")
    assert tab.live.settings() == LiveTuneSettings(
        "a",
        TrialOptions(
            goal="itl_p99",
            slo={"ttft_p99": 500.0, "itl_p99": 50.0},
            min_requests=20,
            max_duration_s=240.0,
        ),
        budget=3,
        budget_s=900.0,
        until={"ttft_p99": 200.0},
    )
    # back to the offline tuner: its fields and the load again
    tab.tune_where.setCurrentText(TUNE_OFFLINE)
    assert tab.tune_ttft.isVisible() and tab.load_box.isVisible()
    assert not tab.live.is_visible() and not tab.live_mode
    assert tab.results_model.column_names == ["metric", "value"]
    tab.tune_where.setCurrentText(TUNE_LIVE)
    tab.modes.setCurrentIndex(0)  # the Run page: the load form is back
    assert tab.load_box.isVisible() and not tab.live_mode


def _refused(qtbot: Any, tab: BenchTab, *words: str) -> str:
    with qtbot.waitSignal(tab.failed, timeout=5000):
        qtbot.mouseClick(tab.run_button, Qt.MouseButton.LeftButton)
    line = tab.live.error.text()
    assert line and "\n" not in line and FORM_ERROR in tab.live.error.styleSheet()
    assert tab.live.error.isVisible()
    for w in words:
        assert w in line, line
    assert tab.worker is None and tab.run_button.isEnabled() and tab.results_model.rowCount() == 0
    return line


def test_a_run_the_page_cannot_start_is_refused_in_one_red_line(qtbot: Any, fleet: Fleet) -> None:
    shown: dict[str, Fleet | None] = {"fleet": None}
    tab = _tab(qtbot, lambda: shown["fleet"])
    assert tab.live.instance.count() == 0 and not tab.live.instance.isEnabled()
    assert "No fleet serves in the Fleet tab" in tab.live.note.text()
    # Run is off, saying why (the page says it too)
    assert not tab.run_button.isEnabled() and tab.run_button.toolTip() == NO_FLEET
    shown["fleet"] = fleet
    tab.hide()
    tab.show()  # back on the page: the Fleet tab's fleet is listed
    assert tab.live.instance.currentText() == "a" and tab.live.instance.isEnabled()
    tab.live.until.setText("ttft_p90<=100ms")
    _refused(qtbot, tab, "--until ttft_p90: the trials report", "ttft_p99")
    tab.live.until.setText("ttft<=5")
    _refused(qtbot, tab, "--until 'ttft<=5'")
    tab.live.until.setText("")
    tab.space.setPlainText("seed = 1,2")
    _refused(qtbot, tab, "--space 'seed = 1,2'")
    tab.space.setPlainText("max_num_seqs = 2,8")
    # the fleet's servers never started: its instance does not serve
    assert _refused(qtbot, tab) == "instance 'a' does not serve now (stopped)"
    tab.live.error.setText("")
    tab.tune_where.setCurrentText(TUNE_OFFLINE)  # offline refusals stay in the status line
    with qtbot.waitSignal(tab.failed, timeout=5000):
        tab.space.setPlainText("seed = 1,2")
        qtbot.mouseClick(tab.run_button, Qt.MouseButton.LeftButton)
    assert tab.live.error.text() == "" and "--space" in tab.status.text()


class DrivenFleet:
    """``fleet.start_trial`` stood in for: each trial a real :class:`LiveTrial` (never started)
    that a thread takes through admitted, started, measuring and decided on the fleet's own
    event path, promoted (the instance's launch becomes the candidate's, as the fleet's
    promotion does) or rolled back as ``outcomes`` says per max_num_seqs value, with the
    candidate's TTFT p99 given there; ``gate``, once cleared, holds each trial in measuring
    until set (or until the operator decides)."""

    def __init__(self, fleet: Fleet, outcomes: dict[int, tuple[str, float]]) -> None:
        self.fleet, self.outcomes = fleet, outcomes
        self.inst = fleet.spec.instances[0]
        self.gate = threading.Event()
        self.gate.set()
        self.tried: list[LaunchConfig] = []
        fleet.servers["a"].state = "ready"  # as a serving fleet's (nothing runs)

    def start_trial(self, name: str, cfg: LaunchConfig, opts: TrialOptions) -> LiveTrial:
        assert name == "a" and opts.min_requests == 20
        self.tried.append(cfg)
        trial = LiveTrial(
            self.inst,
            cfg,
            opts,
            emit=self.fleet._events.emit,
            promote=lambda t: "profile saved",
            routed_now=lambda url: False,
        )
        threading.Thread(target=self._run, args=(trial,), daemon=True).start()
        return trial

    def _run(self, trial: LiveTrial) -> None:
        seqs = trial.cfg.scheduler.max_num_seqs or 0
        what, ttft = self.outcomes[seqs]
        trial._event("admitted", reason="fits: 0.1 GiB of 12 GiB")
        trial._event("started", reason=f"ready in 20 s on {trial.url}")
        running = Verdict(
            "inconclusive", "ttft_p99", "TTFT p99", n_incumbent=12, n_candidate=11,
            reason="12 and 11 requests measured",
        )  # fmt: skip
        trial._event("measuring", verdict=running, arms=TrialArms())
        while not self.gate.wait(0.05) and trial._operator() is None:
            pass
        operator = trial._operator()
        if operator is not None:
            decision, reason = operator
        else:
            decision = "promote" if what == "promote" else "rollback"
            reason = f"ttft_p99: candidate {ttft:g} vs incumbent 300 (×{ttft / 300:.3g})"
        outcome = "better" if decision == "promote" else "worse"
        r = round(ttft / 300, 3)
        verdict = {"outcome": outcome, "goal": "ttft_p99", "figure": "TTFT p99", "effect": r}
        verdict |= {"lo": round(0.8 * r, 3), "hi": round(1.2 * r, 3), "margin": 0.1}
        verdict |= {"incumbent": 300.0, "candidate": ttft, "n_incumbent": 120, "n_candidate": 110}
        arms = {"incumbent": {"ttft_p99_ms": 300.0}, "candidate": {"ttft_p99_ms": ttft}}
        trial._event(
            "decided",
            decision=decision,
            reason=reason,
            verdict=Verdict.from_json(verdict),
            arms=TrialArms.from_json(arms),
        )
        if decision == "promote":
            self.inst.cfg = trial.cfg.copy()
            trial.result = "promoted"
            trial._event("promoted", reason="profile saved")
        else:
            trial.result = "rolled back"
            trial._event("rolled back", reason=reason)
        trial.done.set()


def _driven(fleet: Fleet, monkeypatch: pytest.MonkeyPatch, **outcomes: Any) -> DrivenFleet:
    driven = DrivenFleet(fleet, {int(k[1:]): v for k, v in outcomes.items()})
    monkeypatch.setattr(fleet, "start_trial", driven.start_trial)
    return driven


def _cells(tab: BenchTab, column: str) -> list[str]:
    return [tab.results_model.text(i, column) for i in range(tab.results_model.rowCount())]


def test_the_table_fills_from_the_chains_events_and_the_final_launch_is_said(
    qtbot: Any, fleet: Fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    driven = _driven(fleet, monkeypatch, s8=("promote", 100.0), s16=("rollback", 450.0))
    driven.gate.clear()
    tab = _tab(qtbot, lambda: fleet)
    tab.space.setPlainText("max_num_seqs = 2,8,16")
    tab.live.min_requests.setValue(20)
    qtbot.mouseClick(tab.run_button, Qt.MouseButton.LeftButton)
    assert tab.live.error.text() == "" and tab.worker is not None
    # trial 1 under way: its row follows the trial's own events
    qtbot.waitUntil(lambda: _cells(tab, "result") == ["measuring"], timeout=10_000)
    assert _cells(tab, "knob change") == ["max-num-seqs 2 → 8"]
    assert _cells(tab, "verdict (goal figure)") == [
        "TTFT p99: inconclusive (12 and 11 requests measured) · 12 / 11 requests"
    ]
    assert tab.status.text().startswith(
        "trial 1 (max-num-seqs 2 → 8): measuring · TTFT p99: inconclusive"
    )
    assert tab.trial_detail.text() == (
        "Trial 1 (max-num-seqs 2 → 8), under way (measuring): 12 and 11 requests measured"
    )
    assert not tab.run_button.isEnabled() and tab.cancel_button.isEnabled()
    assert "goal" not in tab.results_model.column_names  # no goal of the chain's own
    driven.gate.set()
    qtbot.waitUntil(lambda: tab.worker is None, timeout=20_000)
    assert _cells(tab, "trial") == ["1", "2"]
    assert _cells(tab, "knob change") == ["max-num-seqs 2 → 8", "max-num-seqs 8 → 16"]
    assert _cells(tab, "result") == ["promoted", "rolled back"]
    assert _cells(tab, "decision") == ["promote", "rollback"]
    assert _cells(tab, "verdict (goal figure)") == [  # as every view says a verdict
        "TTFT p99 300 → 100 ms, ×0.333 [0.266–0.4]: better (beyond the 10 % margin) · "
        "120 / 110 requests",
        "TTFT p99 300 → 450 ms, ×1.5 [1.2–1.8]: worse (beyond the 10 % margin) · "
        "120 / 110 requests",
    ]
    assert _cells(tab, "reason")[0] == "ttft_p99: candidate 100 vs incumbent 300 (×0.333)"
    # the detail line: the latest trial in full, or the one selected
    assert tab.trial_detail.text() == (
        "Trial 2 (max-num-seqs 8 → 16), rolled back: ttft_p99: candidate 450 vs incumbent 300 "
        "(×1.5)"
    )
    tab.table.selectRow(0)
    assert tab.trial_detail.text().startswith("Trial 1 (max-num-seqs 2 → 8), promoted: ")
    color = tab.results_model.data(tab.results_model.index(0, 2), Qt.ItemDataRole.ForegroundRole)
    assert color.name() == "#2e7d32"  # promoted: green
    # the second candidate changed the promoted launch (8), not the one the chain began from
    assert [c.scheduler.max_num_seqs for c in driven.tried] == [8, 16]
    # both arms' goal figures per trial in the plot
    assert list(tab.incumbent_curve.getData()[1]) == [300.0, 300.0]
    assert list(tab.candidate_curve.getData()[1]) == [100.0, 450.0]
    summary = tab.tune_summary.text().splitlines()
    assert summary[0] == (
        "Final launch of a: max-num-seqs=8 (changed by the chain: max-num-seqs 2 → 8)."
    )
    assert summary[1].startswith("2 trials in ") and summary[1].endswith(
        ", 1 promoted, 0 not run; ended: the space is exhausted: no candidate left to try."
    )
    assert "max-num-seqs: 8" in tab.tune_summary.toolTip()
    assert tab.status.text() == ("live tune done: the space is exhausted: no candidate left to try")
    assert tab.run_button.isEnabled() and not tab.apply_button.isVisible()


def test_until_the_goal_the_chain_stops_at_the_first_launch_that_meets_it(
    qtbot: Any, fleet: Fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    driven = _driven(fleet, monkeypatch, s4=("promote", 250.0), s8=("promote", 150.0))
    tab = _tab(qtbot, lambda: fleet)
    tab.space.setPlainText("max_num_seqs = 2,4,8,16")
    tab.live.min_requests.setValue(20)
    tab.live.until.setText("ttft_p99<=200ms")
    qtbot.mouseClick(tab.run_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: tab.worker is None, timeout=20_000)
    assert [c.scheduler.max_num_seqs for c in driven.tried] == [4, 8]  # 16 never tried
    assert _cells(tab, "goal") == ["misses", "meets"]
    assert _cells(tab, "result") == ["promoted", "promoted"]
    summary = tab.tune_summary.text().splitlines()
    assert summary[0].startswith("Final launch of a: max-num-seqs=8 ")
    assert summary[1] == (
        "Goal ttft_p99<=200ms: trial 2's launch meets it (ttft_p99 150 ms <= 200 ms)."
    )
    assert summary[2].startswith("2 trials in ") and summary[2].endswith("0 not run.")


def test_cancel_rolls_back_the_trial_under_way_and_ends_the_chain(
    qtbot: Any, fleet: Fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    driven = _driven(fleet, monkeypatch, s8=("promote", 100.0), s16=("promote", 90.0))
    driven.gate.clear()  # held in measuring: only the operator decides
    tab = _tab(qtbot, lambda: fleet)
    tab.space.setPlainText("max_num_seqs = 2,8,16")
    tab.live.min_requests.setValue(20)
    qtbot.mouseClick(tab.run_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: _cells(tab, "result") == ["measuring"], timeout=10_000)
    qtbot.mouseClick(tab.cancel_button, Qt.MouseButton.LeftButton)
    assert tab.status.text() == "stopping: the trial under way is rolled back…"
    qtbot.waitUntil(lambda: tab.worker is None, timeout=20_000)
    assert _cells(tab, "result") == ["rolled back"]
    assert _cells(tab, "reason") == ["stopped by the operator"]
    assert len(driven.tried) == 1 and fleet.spec.instances[0].cfg is not None
    assert fleet.spec.instances[0].cfg.scheduler.max_num_seqs == 2  # the incumbent stays
    assert tab.status.text() == "live tune done: stopped"


def test_the_window_hands_the_tune_page_the_fleet_tabs_fleet_while_it_serves(
    qtbot: Any, fleet: Fleet
) -> None:
    from quantdeck.core.launch import cpu_device
    from quantdeck.gui.main_window import MainWindow

    win = MainWindow(device=cpu_device(), probe=False)
    qtbot.addWidget(win)
    tab = win.bench
    tab.modes.setCurrentWidget(tab.tune_page)
    tab.tune_where.setCurrentText(TUNE_LIVE)
    assert tab.live.instance.count() == 0  # no fleet
    win.fleet.fleet = fleet  # as its Start fleet leaves it (the table is another test's)
    tab.refresh_instances()
    assert tab.live.instance.count() == 0  # not serving yet
    win.fleet.phase = "serving"
    tab.refresh_instances()  # as showing the page does
    assert tab.live.instance.currentText() == "a"
    win.fleet.phase, win.fleet.fleet = "stopped", None


# -- on a real fleet ----------------------------------------------------------------------------
@pytest.mark.server
@pytest.mark.solo
def test_a_live_chain_on_the_fleet_tabs_fleet_promotes_the_better_value(
    qtbot: Any, demo_model: Path, demo_server_parked: Any, tmp_path: Path
) -> None:
    """A fleet of one demo instance (max-num-seqs 1, eager, small KV) started in the Fleet tab,
    6 clients through the router; the Tune page's live chain over max_num_seqs=1,8 tries 8
    beside 1, promotes it (in the table, the final launch said), 0 failed client requests."""
    import httpx

    from quantdeck.core.runtime.server import ONE_PROCESS_ENGINE_ENV
    from quantdeck.gui.fleet import FleetView

    mp = pytest.MonkeyPatch()
    for k, value in ONE_PROCESS_ENGINE_ENV.items():
        mp.setenv(k, value)
    path, router = fleet_file_of_one(demo_model, tmp_path)
    v = FleetView()
    qtbot.addWidget(v)
    # as the window hands it over (test_the_window_hands_the_tune_page_the_fleet_tabs_fleet...)
    tab = _tab(qtbot, lambda: v.fleet if v.phase == "serving" else None)
    load: Load | None = None
    try:
        v.load(str(path))
        qtbot.waitUntil(lambda: v.start_button.isEnabled(), timeout=20_000)
        qtbot.mouseClick(v.start_button, Qt.MouseButton.LeftButton)
        qtbot.waitUntil(lambda: v.phase == "serving" or v.job is None, timeout=600_000)
        assert v.phase == "serving", v.message.text()
        url = f"http://127.0.0.1:{router}"
        model = httpx.get(url + "/v1/models", timeout=30).json()["data"][0]["id"]

        load = Load(url, model).__enter__()
        tab.refresh_instances()  # as showing the page does
        assert tab.live.instance.currentText() == "a"
        tab.space.setPlainText("max_num_seqs = 1,8")
        tab.live.min_requests.setValue(20)
        tab.live.max_duration.setValue(240)
        qtbot.mouseClick(tab.run_button, Qt.MouseButton.LeftButton)
        assert tab.live.error.text() == "" and tab.worker is not None
        # (a clear difference may be decided at the first look: its "measuring" and its
        # decision then reach the page in one pass of the event loop, and no poll sees it)
        qtbot.waitUntil(
            lambda: _cells(tab, "result") == ["measuring"] or tab.worker is None, timeout=400_000
        )
        if tab.worker is not None and _cells(tab, "result") == ["measuring"]:
            assert tab.status.text().startswith("trial 1 (max-num-seqs 1 → 8): measuring")
        qtbot.waitUntil(lambda: tab.worker is None, timeout=400_000)
        assert _cells(tab, "result") == ["promoted"], (_cells(tab, "reason"), tab.status.text())
        assert _cells(tab, "decision") == ["promote"]
        assert "better (beyond the 10 % margin)" in _cells(tab, "verdict (goal figure)")[0]
        assert tab.result is not None and isinstance(tab.result, LiveTuneResult)
        assert tab.result.launch["max-num-seqs"] == 8
        assert tab.tune_summary.text().startswith(
            "Final launch of a: max-num-seqs=8 (changed by the chain: max-num-seqs 1 → 8)."
        )
        assert "max-num-seqs=8" in v.model.text(1, "knobs")  # the Fleet tab's row follows
        assert v.rows is not None and "a+try" not in v.rows
        load.__exit__()
        assert load.failed == [] and load.sent >= 40, (load.failed[:3], load.sent)
    finally:
        if load is not None:
            load.__exit__()
        v.stop_fleet()
        qtbot.waitUntil(lambda: v.job is None, timeout=180_000)
        v.shutdown()
        mp.undo()
