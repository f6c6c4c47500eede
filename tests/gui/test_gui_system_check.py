"""Help ▸ System check…: the doctor's report in a dialog, from the real menu action."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from quantdeck.core import doctor
from quantdeck.gui.main_window import MainWindow


def test_help_menu_runs_the_system_check(
    qtbot: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bare = tmp_path / "bare"  # an engine without vLLM: the check takes a second, not ten
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    monkeypatch.setattr(doctor, "default_engines", lambda: [str(bare / "bin" / "python")])
    win = MainWindow(probe=False)
    qtbot.addWidget(win)
    (help_menu,) = [a.menu() for a in win.menuBar().actions() if a.text() == "&Help"]
    (action,) = [a for a in help_menu.actions() if a.text() == "System check…"]
    action.trigger()
    dialog = win.system_check
    assert dialog is not None and dialog.isVisible()
    assert not dialog.again_button.isEnabled()  # checking
    qtbot.waitUntil(lambda: dialog.report is not None, timeout=60_000)
    text = dialog.text.toPlainText()
    assert f"Engine    {bare / 'bin' / 'python'}: no vLLM" in text
    assert "Verdict: cannot serve" in text
    assert dialog.status.text().startswith("No engine can serve.")
    assert dialog.again_button.isEnabled()
    dialog.close()
    assert dialog.workers.wait(10)
    win.background().quit()
    assert win.background().wait(10)
