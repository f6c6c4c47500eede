"""The API key in the GUI: a password field, *** on the clipboard, never in gui.ini or a
profile; the keyring or a clear word that the key is not remembered."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QApplication, QLineEdit

from quantdeck.core.launch import cpu_device, iter_knobs, profiles
from quantdeck.core.launch.device import H200
from quantdeck.core.paths import config_dir
from quantdeck.core.runtime.engine import Capabilities
from quantdeck.gui.launch import LaunchTab
from quantdeck.gui.main_window import MainWindow

KEY = "s3cret-KEY-42"


@pytest.fixture
def tab(qtbot) -> LaunchTab:
    t = LaunchTab(cpu_device())
    qtbot.addWidget(t)
    t.set_model("/m", None)
    t.form.editors["api_key"].widget.setText(KEY)
    return t


def test_key_field_is_masked_and_copy_shows_stars(qtbot, tab: LaunchTab) -> None:
    assert tab.form.editors["api_key"].widget.echoMode() == QLineEdit.Password
    qtbot.mouseClick(tab.copy_button, Qt.LeftButton)  # the command follows the engine's options
    assert "not probed yet" in tab.message.text() and KEY not in tab.message.text()
    flags = {k.flag: {} for k in iter_knobs()} | {"--compilation-config": {}}
    tab.set_engine(Capabilities("0.32.0", "2.9", "cpu", "cli", options=flags))
    qtbot.mouseClick(tab.copy_button, Qt.LeftButton)
    copied = QApplication.clipboard().text()
    env, _, argv = copied.partition(" -m quantdeck.core.workers.engine /m ")
    assert argv and "VLLM_API_KEY=***" in env.split()  # the launcher's line, the key by name
    assert KEY not in copied and KEY not in tab.message.text()


def test_saving_a_profile_never_keeps_the_key(qtbot, tab: LaunchTab, no_keyring) -> None:
    tab.profiles.setCurrentText("mine")
    tab.remember_key.setChecked(True)
    qtbot.mouseClick(tab.save_profile, Qt.LeftButton)
    assert KEY not in profiles.profile_path("mine").read_text()
    # no keyring here: said once, and the box cannot be ticked again
    assert "not remembered" in tab.message.text()
    assert not tab.remember_key.isChecked() and not tab.remember_key.isEnabled()
    # loading the profile keeps the key typed in (none was remembered)
    qtbot.mouseClick(tab.load_profile, Qt.LeftButton)
    assert tab.config().server.api_key == KEY


def test_gui_ini_is_private_and_keyless(qtbot) -> None:
    win = MainWindow(device=H200, probe=False)
    qtbot.addWidget(win)
    win.launch.form.editors["api_key"].widget.setText(KEY)
    win.launch.form.editors["max_num_seqs"].widget.setValue(48)
    win.close()
    ini = Path(config_dir()) / "gui.ini"
    assert "max-num-seqs: 48" in ini.read_text() and KEY not in ini.read_text()
    assert stat.S_IMODE(ini.stat().st_mode) == 0o600


def test_attach_over_plain_http_with_a_key_warns(qtbot, tab: LaunchTab) -> None:
    tab.attach_url.setText("http://10.0.0.5:8000")
    tab.attach_key.setText(KEY)
    with qtbot.waitSignal(tab.attach_requested) as sig:
        qtbot.mouseClick(tab.attach_button, Qt.LeftButton)
    assert sig.args == ["http://10.0.0.5:8000", KEY]
    assert "plain http" in tab.message.text()


def test_own_settings_are_never_greyed_out(qtbot, tab: LaunchTab) -> None:
    tab.form.set_supported({"--host", "--port", "--api-key"})
    assert tab.form.editors["allow_open"].widget.isEnabled()
    assert not tab.form.editors["max_num_seqs"].widget.isEnabled()
