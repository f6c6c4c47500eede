"""The Benchmark tab's A/B and Tune pages without a server: each arm's diff against the Launch
tab and the refusal of identical arms; a tuning run's progress, dropped point, best point, saved
profile, the Launch tab's list following it and "Apply to Launch"; the results' share of the
width. The tuning runs are the real :class:`Tuner` and worker, with ``measure`` scoring points
from a known goodput curve instead of serving them (as tests/core/bench's ``_ScoredTuner``)."""

from __future__ import annotations

from typing import Any

import pytest
from PySide6.QtCore import Qt

from quantdeck.core.bench.ab import ABRun
from quantdeck.core.bench.results import BenchResult
from quantdeck.core.bench.tune import Point, Tuner
from quantdeck.core.events import ArmEvent, PointEvent
from quantdeck.core.launch import LaunchConfig, cpu_device, profiles
from quantdeck.gui.bench import BenchTab
from quantdeck.gui.launch import LaunchTab


def _launch_config(eager: bool = True) -> LaunchConfig:
    cfg = LaunchConfig()
    cfg.model.model = "/models/demo"  # A/B and tuning read it only when they serve
    cfg.compilation.enforce_eager = eager
    return cfg


def _tab(qtbot, launch_config=_launch_config, **kw: Any) -> BenchTab:
    tab = BenchTab(lambda: (None, None, None), launch_config, lambda: False, **kw)
    qtbot.addWidget(tab)
    tab.resize(1400, 900)
    tab.show()
    qtbot.waitExposed(tab)
    return tab


def test_ab_shows_each_arms_diff_and_refuses_identical_arms(qtbot) -> None:
    tab = _tab(qtbot)  # the Launch tab has Eager ticked
    tab.modes.setCurrentIndex(tab.modes.indexOf(tab.arms.parentWidget()))
    # the default arms are eager against CUDA graphs whatever the Launch tab says
    assert tab.arm_diffs.text().splitlines()[1:] == [
        "eager: same as the Launch tab",
        "graphs: enforce-eager on → off",
    ]
    assert not tab.arm_warning.isVisible()
    # the operator's arms: with Eager ticked, both are the Launch tab's config
    tab.arms.setPlainText("eager = --enforce-eager\ndefault =")
    assert tab.arm_diffs.text().splitlines()[1:] == [
        "eager: same as the Launch tab",
        "default: same as the Launch tab",
    ]
    assert tab.arm_warning.isVisible()
    assert "'eager' and 'default' have the same config" in tab.arm_warning.text()
    # Run is off, the page's line its tooltip; a run asked for anyway is refused in one line
    assert not tab.run_button.isEnabled()
    assert tab.run_button.toolTip() == tab.arm_warning.text()
    with qtbot.waitSignal(tab.failed, timeout=5000) as blocker:
        tab.run()
    assert "have the same config" in blocker.args[0]
    assert tab.worker is None and "have the same config" in tab.status.text()


def test_ab_diffs_follow_the_launch_tab(qtbot) -> None:
    launch = {"cfg": _launch_config(eager=False)}
    tab = _tab(qtbot, launch_config=lambda: launch["cfg"])
    assert "eager: enforce-eager off → on" in tab.arm_diffs.text()
    assert "graphs: same as the Launch tab" in tab.arm_diffs.text()
    launch["cfg"] = _launch_config(eager=True)
    tab.hide()
    tab.show()  # back on the tab: the diffs are taken against the Launch tab's config now
    assert "graphs: enforce-eager on → off" in tab.arm_diffs.text()


def test_results_get_at_least_half_the_width(qtbot) -> None:
    tab = _tab(qtbot)
    form, results = tab.splitter.widget(0), tab.splitter.widget(1)
    assert results.width() >= tab.width() / 2
    assert results.width() > form.width()


# -- tuning ------------------------------------------------------------------------------------

# goodput per max_num_seqs; None: the point is dropped early. The walk starts at 4 (the middle,
# max_num_seqs unset), gains nothing at 8, turns down to 2 (dropped) and stops: 4, 8, 2.
CURVE: dict[int, float | None] = {1: 1.0, 2: None, 4: 2.0, 8: 1.5}
DROPPED = "dropped: 7 of 8 requests missed the targets, more than the best point's 0: it cannot win"


def _scored_measure(self: Tuner, values: dict[str, Any]) -> Point:
    """Tuner.measure's events and bookkeeping, with the goodput read from CURVE."""
    point = Point(dict(values))
    if point.key() in self.points:
        return self.points[point.key()]
    self.points[point.key()] = point
    n = len(self.points)
    self._emit(PointEvent(n, point.values, "starting"))
    self._emit(ArmEvent(n, 1, f"point {n}", "starting", point=n))
    goodput = CURVE[values["max_num_seqs"]]
    if goodput is None:
        point.dropped = DROPPED
        point.result = BenchResult(completed=1, failed=7)
    else:
        point.goodput, point.meets = goodput, goodput >= 2.0
        point.result = BenchResult(completed=8, failed=0, p99_ttft_ms=90.0, p99_tpot_ms=9.0)
        if self.best is None or goodput > (self.best.goodput or 0):
            self.best = point
    self._emit(PointEvent(n, point.values, "done", self._result(point)))
    return point


@pytest.fixture
def scored_tuning(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Tuner, "measure", _scored_measure)
    monkeypatch.setattr(ABRun, "preflight", lambda self: None)  # no model to read


def test_tune_progress_best_point_profile_and_apply(qtbot, scored_tuning: None) -> None:
    launch = LaunchTab(cpu_device())
    qtbot.addWidget(launch)
    tab = _tab(qtbot, launch_config=lambda: _launch_config(), apply_profile=launch.select_profile)
    assert tab.apply_button.isVisible() and not tab.apply_button.isEnabled()
    shown: list[str] = []
    set_status = tab.status.setText
    tab.status.setText = lambda text: (shown.append(text), set_status(text))  # type: ignore[method-assign]
    tab.modes.setCurrentIndex(tab.modes.indexOf(tab.space.parentWidget()))
    tab.space.setPlainText("max_num_seqs = 1,2,4,8")
    tab.save_profile.setText("tuned-seqs")
    with qtbot.waitSignal(tab.finished, timeout=30000) as blocker:
        qtbot.mouseClick(tab.run_button, Qt.LeftButton)
    result = blocker.args[0]
    assert [p.values["max_num_seqs"] for p in result.points] == [4, 8, 2]
    # progress in words: point i of n (the walk measures at most 1 + 3 points), no "arm 2/1"
    assert "point 1 of at most 4 (max-num-seqs=4): starting" in shown
    assert "point 2 of at most 4: starting its server" in shown
    assert f"point 3 of at most 4 (max-num-seqs=2): {DROPPED}" in shown
    assert not any(text.startswith("arm ") for text in shown)
    # the table: the best point marked, the dropped one explained (not "failed 7")
    model = tab.results_model
    rows = {model.text(i, "point"): i for i in range(model.rowCount())}
    assert list(rows) == ["1 ★ best", "2", "3"]
    assert model.text(rows["1 ★ best"], "max_num_seqs") == "4"
    assert model.text(rows["3"], "outcome") == DROPPED
    assert model.text(rows["3"], "failed") == "-"
    assert model.text(rows["2"], "outcome") == "misses the p99 targets"
    # the plot: goodput per point, a star on the best, a cross where a point has none
    assert [list(a) for a in tab.best_marker.getData()] == [[1], [2.0]]
    assert [list(a) for a in tab.goodput_curve.getData()] == [[1, 2], [2.0, 1.5]]
    assert list(tab.no_goodput_curve.getData()[0]) == [3]
    assert tab.best_text.isVisible() and tab.best_text.textItem.toPlainText() == "best"
    # the profile: saved, named in plain view, in the Launch tab's list without a relay
    assert profiles.load_profile("tuned-seqs").scheduler.max_num_seqs == 4
    assert tab.tune_summary.isVisible()
    assert "Best: point 1 (max-num-seqs=4)" in tab.tune_summary.text()
    assert "Saved as profile 'tuned-seqs'" in tab.tune_summary.text()
    names = lambda: [launch.profiles.itemText(i) for i in range(launch.profiles.count())]
    qtbot.waitUntil(lambda: "tuned-seqs" in names(), timeout=5000)
    # Apply to Launch: the Launch form takes the tuned profile
    assert launch.form.editors["max_num_seqs"].value() != 4
    qtbot.mouseClick(tab.apply_button, Qt.LeftButton)
    assert launch.form.editors["max_num_seqs"].value() == 4
    assert launch.profiles.currentText() == "tuned-seqs"
    assert launch.message.text() == "loaded profile tuned-seqs"
    assert "loaded into the Launch tab" in tab.status.text()


def test_tune_without_a_name_saves_a_dated_profile(qtbot, scored_tuning: None) -> None:
    tab = _tab(qtbot)
    tab.modes.setCurrentIndex(tab.modes.indexOf(tab.space.parentWidget()))
    tab.space.setPlainText("max_num_seqs = 1,2,4,8")
    with qtbot.waitSignal(tab.finished, timeout=30000):
        qtbot.mouseClick(tab.run_button, Qt.LeftButton)
    assert tab.saved_profile is not None and tab.saved_profile.startswith("tuned-")
    assert tab.saved_profile in profiles.list_profiles()
    assert f"Saved as profile '{tab.saved_profile}'" in tab.tune_summary.text()
    assert not tab.apply_button.isVisible()  # no Launch tab to apply to


def test_tune_refuses_a_bad_profile_name_before_it_runs(qtbot, scored_tuning: None) -> None:
    tab = _tab(qtbot)
    tab.modes.setCurrentIndex(tab.modes.indexOf(tab.space.parentWidget()))
    tab.save_profile.setText("../escape")
    with qtbot.waitSignal(tab.failed, timeout=5000) as blocker:
        qtbot.mouseClick(tab.run_button, Qt.LeftButton)
    assert blocker.args[0].startswith("profile name")
    assert tab.worker is None


def test_launch_tab_follows_the_profiles_folder(qtbot) -> None:
    """A profile saved elsewhere (the CLI, the Benchmark tab) shows up in the list; a name
    being typed stays."""
    launch = LaunchTab(cpu_device())
    qtbot.addWidget(launch)
    assert launch.profiles.count() == 0
    launch.profiles.setCurrentText("typing")
    cfg = _launch_config()
    cfg.scheduler.max_num_seqs = 5
    profiles.save_profile("from-cli", cfg)
    qtbot.waitUntil(lambda: launch.profiles.count() == 1, timeout=5000)
    assert launch.profiles.itemText(0) == "from-cli"
    assert launch.profiles.currentText() == "typing"
    profiles.save_profile("second", cfg)
    qtbot.waitUntil(lambda: launch.profiles.count() == 2, timeout=5000)
    launch.select_profile("second")
    assert launch.form.editors["max_num_seqs"].value() == 5
