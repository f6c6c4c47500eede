"""The Benchmark tab's Run button where the chosen page cannot run (issue 44, seen at
1400×900): it stayed enabled under the A/B page's own "Run refuses" line. Now it is disabled
with the page's reason as its tooltip (and in a line under it where the page does not say it
itself), on each page, and enabled again once the page can run: the arms fixed, a server
started or stopped (read again while the tab is shown), a fleet serving."""

from __future__ import annotations

from typing import Any

from quantdeck.core.launch import LaunchConfig
from quantdeck.gui.bench import BenchTab
from quantdeck.gui.bench.columns import TUNE_LIVE
from quantdeck.gui.bench.run_gate import NOT_A_RUN, RUN_TIP, SERVER_RUNS
from quantdeck.gui.bench.run_page import NO_SERVER
from quantdeck.gui.live_tune import NO_FLEET


def _launch_config() -> LaunchConfig:
    cfg = LaunchConfig()
    cfg.model.model = "/models/demo"
    cfg.compilation.enforce_eager = True
    return cfg


class World:
    """The other tabs as the Benchmark tab reads them: the server's URL, whether one runs, the
    Fleet tab's fleet."""

    def __init__(self) -> None:
        self.url: str | None = None
        self.running = False
        self.fleet: Any = None


def _tab(qtbot, world: World) -> BenchTab:
    tab = BenchTab(
        lambda: (world.url, "demo" if world.url else None, None),
        _launch_config,
        lambda: world.running,
        fleet=lambda: world.fleet,
    )
    qtbot.addWidget(tab)
    tab.resize(1400, 900)
    tab.show()
    qtbot.waitExposed(tab)
    return tab


def _off(tab: BenchTab, why: str) -> None:
    assert not tab.run_button.isEnabled()
    assert why in tab.run_button.toolTip(), tab.run_button.toolTip()


def _on(tab: BenchTab) -> None:
    assert tab.run_button.isEnabled(), tab.run_button.toolTip()
    assert tab.run_button.toolTip() == RUN_TIP
    assert not tab.gate.note.isVisible()


def test_ab_arms_that_cannot_run_turn_run_off_with_the_pages_reason(qtbot) -> None:
    tab = _tab(qtbot, World())
    tab.modes.setCurrentWidget(tab.ab_page)
    _on(tab)  # eager against graphs
    tab.arms.setPlainText("eager = --enforce-eager\ndefault =")
    assert tab.arm_warning.isVisible()
    _off(tab, "'eager' and 'default' have the same config")  # before: enabled
    assert tab.run_button.toolTip() == tab.arm_warning.text()
    assert not tab.gate.note.isVisible()  # the page says it already
    tab.arms.setPlainText("eager = --enforce-eager")
    _off(tab, "needs at least two arms")
    tab.arms.setPlainText("eager = --enforce-eager\ngraphs = --no-enforce-eager")
    _on(tab)


def test_the_run_page_without_a_server_then_with_one(qtbot) -> None:
    world = World()
    tab = _tab(qtbot, world)
    assert tab.modes.currentWidget() is tab.run_page
    _off(tab, NO_SERVER)
    assert tab.gate.note.isVisible() and tab.gate.note.text() == NO_SERVER
    world.url = "http://127.0.0.1:8000"  # started on the Launch tab, the Benchmark tab shown
    qtbot.waitUntil(tab.run_button.isEnabled, timeout=3000)
    _on(tab)
    world.url = None  # it stopped
    qtbot.waitUntil(lambda: not tab.run_button.isEnabled(), timeout=3000)
    _off(tab, NO_SERVER)


def test_ab_and_offline_tuning_while_a_server_runs(qtbot) -> None:
    world = World()
    world.running = True
    tab = _tab(qtbot, world)
    for page in (tab.ab_page, tab.tune_page):
        tab.modes.setCurrentWidget(page)
        _off(tab, SERVER_RUNS)
        assert tab.gate.note.isVisible() and tab.gate.note.text() == SERVER_RUNS
    world.running = False
    qtbot.waitUntil(tab.run_button.isEnabled, timeout=3000)
    _on(tab)


def test_live_tuning_without_a_fleet_and_the_history_page(qtbot) -> None:
    world = World()
    tab = _tab(qtbot, world)
    tab.modes.setCurrentWidget(tab.tune_page)
    _on(tab)  # offline, no server running
    tab.tune_where.setCurrentText(TUNE_LIVE)
    assert tab.live_mode
    _off(tab, NO_FLEET)
    assert "No fleet serves" in tab.live.note.text() and not tab.gate.note.isVisible()
    tab.modes.setCurrentWidget(tab.history_page)
    _off(tab, NOT_A_RUN)
    tab.modes.setCurrentWidget(tab.run_page)
    _off(tab, NO_SERVER)


def test_run_stays_off_while_a_job_runs(qtbot) -> None:
    world = World()
    world.url = "http://127.0.0.1:8000"
    tab = _tab(qtbot, world)
    _on(tab)
    tab.job = object()  # as run() has it while its worker measures
    tab.run_button.setEnabled(False)
    tab.gate.refresh()
    assert not tab.run_button.isEnabled()
    tab.job = None
    tab._on_finished()
    _on(tab)
