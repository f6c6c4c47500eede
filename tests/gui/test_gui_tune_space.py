"""The Tune page's space box reads as ``--space`` does (one knob a line): a knob on two lines is
refused in one line (the live form's red line, the status line offline), before anything runs;
eager mode and an engine option are a space like any other. No server starts: the fleet of one
instance is never started."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fleet_load import tiny_fleet_file
from PySide6.QtCore import Qt

from quantdeck.core.fleet import Fleet, load_fleet
from quantdeck.core.launch import LaunchConfig
from quantdeck.gui.bench import TUNE_LIVE, TUNE_OFFLINE, BenchTab
from quantdeck.gui.style import FORM_ERROR


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QUANTDECK_CACHE_DIR", str(tmp_path / "cache"))


def _launch_config() -> LaunchConfig:
    cfg = LaunchConfig()
    cfg.model.model = "/models/demo"
    return cfg


def _tab(qtbot: Any, fleet: Fleet) -> BenchTab:
    tab = BenchTab(lambda: (None, None, None), _launch_config, lambda: False, fleet=lambda: fleet)
    qtbot.addWidget(tab)
    tab.resize(1400, 900)
    tab.show()
    qtbot.waitExposed(tab)
    tab.modes.setCurrentWidget(tab.tune_page)
    return tab


def _run_refused(qtbot: Any, tab: BenchTab) -> str:
    with qtbot.waitSignal(tab.failed, timeout=5000) as blocker:
        qtbot.mouseClick(tab.run_button, Qt.MouseButton.LeftButton)
    assert tab.worker is None and tab.run_button.isEnabled()
    return str(blocker.args[0])


def test_a_knob_on_two_lines_is_refused_in_one_line(qtbot: Any, tmp_path: Path) -> None:
    tab = _tab(qtbot, Fleet(load_fleet(str(tiny_fleet_file(tmp_path)))))
    repeat = "enforce_eager = true,false\nmax_num_seqs = 2,8\nmax-num-seqs = 16"
    # live: the form's red line
    tab.tune_where.setCurrentText(TUNE_LIVE)
    tab.space.setPlainText(repeat + "\n\n")
    assert tab.tune_page.space_items() == repeat.splitlines()  # blank lines left out
    line = _run_refused(qtbot, tab)
    assert tab.live.error.text() == line and "\n" not in line
    assert "max_num_seqs is given twice" in line and FORM_ERROR in tab.live.error.styleSheet()
    # a space of eager mode and an engine option passes the space's check: what stops this
    # run is the instance, which does not serve
    tab.space.setPlainText("enforce_eager = true,false\nvllm:max-logprobs = 5,10")
    assert "does not serve" in _run_refused(qtbot, tab)
    tab.space.setPlainText("vllm:max-num-seqs = 2,8")
    assert "tune that knob (max_num_seqs=V1,V2)" in _run_refused(qtbot, tab)
    # offline: the status line, before any server starts
    tab.live.error.setText("")
    tab.tune_where.setCurrentText(TUNE_OFFLINE)
    tab.space.setPlainText(repeat)
    line = _run_refused(qtbot, tab)
    assert "max_num_seqs is given twice" in line and tab.status.text() == line
