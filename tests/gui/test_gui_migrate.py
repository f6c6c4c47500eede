"""A profile from another vLLM in the Launch tab (issue 33): loaded, or left in the form while
the engine picker changes, its settings are fit for the chosen engine's vLLM as ``quantdeck
serve --profile F --engine NAME`` fits them (core/launch/migrate.py): a renamed option migrated
with a note naming both versions; one the engine cannot take refused in the tab's error line,
and Start with it.

The fast tests take the engines' parsers as recorded from vllm-cpu 0.29.0 and 0.32.0 themselves
(tests/fixtures/engine-options-diff.json, written by tests/engines.py from each engine's own
probe); the ``engines`` test probes the real vllm-cpu 0.29.0 in its own venv."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
from ckpt import TINY_LLAMA, write_checkpoint
from engines import FIXTURE, SETUP, engine_name, engine_python, engines_root
from PySide6.QtCore import Qt

from quantdeck.core.launch import LaunchConfig, cpu_device, profiles, vllm_args
from quantdeck.core.models import inspect_model
from quantdeck.core.runtime.engine import Capabilities
from quantdeck.gui.launch import LaunchTab
from quantdeck.gui.main_window import MainWindow

RECORDED: dict[str, Any] = json.loads(FIXTURE.read_text())
# --moe-backend's FlashInfer CuTeDSL MoE-EP megakernel: 'flashinfer_moe_ep_mega_cutedsl' up to
# vLLM 0.31, 'flashinfer_moe_ep_cutedsl' from 0.32 (migrate.VALUE_RENAMED, vllm#54049)
NEW_NAME, OLD_NAME = "flashinfer_moe_ep_cutedsl", "flashinfer_moe_ep_mega_cutedsl"
# the note's head: the target's version and the engine's name
TO_029 = "migrated to vLLM 0.29.0 (engine 'vllm-cpu-0.29'):"
TO_032 = "migrated to vLLM 0.32.0 (engine 'vllm-cpu-0.32'):"


def recorded(version: str) -> Capabilities:
    """The engine vllm-cpu ``version`` as its probe recorded its ``vllm serve`` parser (the
    options the fixture keeps: every knob's and every one the migration tables name)."""
    name = engine_name(version)
    return Capabilities(
        vllm_version=version,
        torch_version="2.13.0",
        platform="cpu",
        launcher="cli",
        options=RECORDED["options"][version],
        distribution="vllm-cpu",
        python=f"/engines/{name}/bin/python",
        name=name,
    )


def demo_config(**extra: Any) -> LaunchConfig:
    cfg = LaunchConfig()
    cfg.model.model = "/models/demo"
    cfg.compilation.enforce_eager = True
    cfg.cache.kv_cache_memory_bytes = 64 * 2**20
    cfg.extra_args = dict(extra)
    return cfg


def save_032(name: str, cfg: LaunchConfig) -> None:
    """A profile as a Quantdeck next to vllm-cpu 0.32.0 saves it."""
    profiles.save_profile(name, cfg, vllm_version="0.32.0")
    assert profiles.read_profile(name)[1] == "0.32.0"


@pytest.fixture
def tab(qtbot: Any, tmp_path: Path) -> LaunchTab:
    """The Launch tab with a tiny model chosen (Start is enabled for it on this CPU)."""
    t = LaunchTab(cpu_device())
    qtbot.addWidget(t)
    root = write_checkpoint(tmp_path / "tiny", TINY_LLAMA)
    t.set_model(str(root), inspect_model(root))
    return t


def load(qtbot: Any, tab: LaunchTab, name: str) -> None:
    tab.profiles.setCurrentText(name)
    qtbot.mouseClick(tab.load_profile, Qt.MouseButton.LeftButton)
    assert tab.message.text() == f"loaded profile {name}"


def note_lines(tab: LaunchTab) -> list[str]:
    assert not tab.engine_note.isHidden()
    return tab.engine_note.text().splitlines()


def test_a_032_profile_loads_on_029_migrated_with_a_note(qtbot: Any, tab: LaunchTab) -> None:
    tab.set_engine(recorded("0.29.0"))
    save_032("p32", demo_config(**{"moe-backend": NEW_NAME}))
    load(qtbot, tab, "p32")
    # the form holds the option as vLLM 0.29 names it
    assert tab.form.extra_args() == {"moe-backend": OLD_NAME}
    assert tab.all_options.text() == "All engine options… (1 set)"
    head, *notes = note_lines(tab)
    assert head == f"Profile 'p32' (saved with vLLM 0.32.0) {TO_029}"
    renamed = next(n for n in notes if "moe-backend" in n)
    assert f"'{NEW_NAME}' is '{OLD_NAME}' on vLLM 0.29.0 (renamed in" in renamed
    assert "renamed in vLLM 0.32, vllm-project/vllm#54049" in renamed
    assert "the profile was saved with vLLM 0.32.0" in renamed
    assert tab.engine_error.isHidden() and not tab.engine_error.text()
    # Start launches the migrated config; its argv is the one vLLM 0.29 takes
    assert tab.start_button.isEnabled()
    with qtbot.waitSignal(tab.start_requested) as sig:
        qtbot.mouseClick(tab.start_button, Qt.MouseButton.LeftButton)
    cfg = sig.args[0]
    assert cfg.extra_args == {"moe-backend": OLD_NAME}
    assert f"--moe-backend={OLD_NAME}" in vllm_args(cfg, engine=recorded("0.29.0"))
    # saved again, the profile records the vLLM its settings are now made for
    tab.profiles.setCurrentText("p29")
    qtbot.mouseClick(tab.save_profile, Qt.MouseButton.LeftButton)
    assert profiles.read_profile("p29")[1] == "0.29.0"


def test_an_option_029_lacks_is_refused_inline_and_start_with_it(
    qtbot: Any, tab: LaunchTab
) -> None:
    tab.set_engine(recorded("0.29.0"))
    cfg = demo_config(**{"moe-backend": NEW_NAME})
    cfg.scheduler.max_num_active_seqs = 2  # --max-num-active-seqs: vLLM 0.31 added it
    save_032("p32-newer", cfg)
    load(qtbot, tab, "p32-newer")
    line = tab.engine_error.text()
    assert not tab.engine_error.isHidden() and "\n" not in line
    assert line.startswith(
        "scheduler.max_num_active_seqs: engine 'vllm-cpu-0.29' (vllm-cpu 0.29.0, "
    )
    assert "has no --max-num-active-seqs option (added in vLLM 0.31" in line
    assert "the profile was saved with vLLM 0.32.0" in line and "vLLM >= 0.31" in line
    # nothing half-migrated: the form keeps the profile's settings, no note
    assert tab.form.extra_args() == {"moe-backend": NEW_NAME}
    assert tab.engine_note.isHidden()
    # Start is refused with that line
    assert not tab.start_button.isEnabled() and tab.start_button.toolTip() == line
    with qtbot.assertNotEmitted(tab.start_requested):
        qtbot.mouseClick(tab.start_button, Qt.MouseButton.LeftButton)
    # the knob 0.29 lacks stays editable while it holds a value, shown although advanced
    # knobs are hidden: set back, the profile fits
    box = tab.form.editors["max_num_active_seqs"].widget
    assert tab.form.editors["max_num_active_seqs"].knob.advanced
    assert not tab.advanced.isChecked() and not box.isHidden()
    assert box.isEnabled() and "set it back to auto to launch there" in box.toolTip()
    box.setValue(box.minimum())
    assert tab.engine_error.isHidden() and tab.start_button.isEnabled()
    assert not box.isEnabled() and "has no such option" in box.toolTip() and box.isHidden()
    assert tab.form.extra_args() == {"moe-backend": OLD_NAME}
    head, *notes = note_lines(tab)
    assert head == f"Profile 'p32-newer' (saved with vLLM 0.32.0) {TO_029}"
    assert any("moe-backend" in n for n in notes)


def test_an_option_removed_without_effect_is_dropped_with_a_note(
    qtbot: Any, tab: LaunchTab
) -> None:
    """A 0.29 profile's --enable-bf16x3-router-gemm (gone in 0.30: the GEMM is the default)
    on 0.32; and a profile that records no version, its option renamed all the same."""
    tab.set_engine(recorded("0.32.0"))
    profiles.save_profile(
        "p29", demo_config(**{"enable-bf16x3-router-gemm": True}), vllm_version="0.29.0"
    )
    load(qtbot, tab, "p29")
    assert tab.form.extra_args() == {}
    assert tab.all_options.text() == "All engine options…"
    head, *notes = note_lines(tab)
    assert head == f"Profile 'p29' (saved with vLLM 0.29.0) {TO_032}"
    dropped = next(n for n in notes if "router-gemm" in n)
    assert "left out on vLLM 0.32.0" in dropped and "vllm-project/vllm#55899" in dropped
    assert "the profile was saved with vLLM 0.29.0" in dropped
    assert tab.engine_error.isHidden() and tab.start_button.isEnabled()

    tab.set_engine(recorded("0.29.0"))
    profiles.profile_path("old").write_text(
        f"model: /models/demo\nvllm-args:\n  moe-backend: {NEW_NAME}\n"
    )
    load(qtbot, tab, "old")
    assert tab.form.extra_args() == {"moe-backend": OLD_NAME}
    head, *notes = note_lines(tab)
    assert head == f"Profile 'old' (its vLLM not recorded) {TO_029}"
    assert any("the profile does not record its vLLM version" in n for n in notes)


def test_switching_the_engine_fits_the_settings_for_the_new_one(qtbot: Any, tab: LaunchTab) -> None:
    """The picker moves the form's settings from one vLLM to the other and back; while the
    new engine is probed Start waits; a setting the new one cannot take is refused there and
    fits again on the engine that has it."""
    tab.set_engine(recorded("0.32.0"))
    save_032("p32", demo_config(**{"moe-backend": NEW_NAME}))
    load(qtbot, tab, "p32")
    assert tab.engine_note.isHidden() and tab.engine_error.isHidden()  # its own version
    assert tab.form.extra_args() == {"moe-backend": NEW_NAME}

    tab.set_engine(None)  # the picker changed: its engine is probed
    assert not tab.start_button.isEnabled()
    assert "once it is probed" in tab.start_button.toolTip()
    tab.set_engine(recorded("0.29.0"))
    assert tab.form.extra_args() == {"moe-backend": OLD_NAME}
    # (fit for 0.32 on loading, they are settings made for 0.32 now, the profile's or not)
    assert note_lines(tab)[0] == f"Settings made for vLLM 0.32.0 {TO_029}"
    assert tab.start_button.isEnabled()

    tab.set_engine(None)
    tab.set_engine(recorded("0.32.0"))  # and back: the 0.32 name again
    assert tab.form.extra_args() == {"moe-backend": NEW_NAME}
    head, *notes = note_lines(tab)
    assert head == f"Settings made for vLLM 0.29.0 {TO_032}"
    assert any(f"'{OLD_NAME}' is '{NEW_NAME}' on vLLM 0.32.0" in n for n in notes)
    assert any("--allowed-origins" in n for n in notes)
    assert not any("profile" in n for n in notes)  # no profile's: those of the form

    # a knob only 0.32 has, set there: refused on 0.29, fine on 0.32 again
    tab.form.editors["max_num_active_seqs"].widget.setValue(2)
    assert not tab.engine_note.isHidden()  # an edit keeps the last migration's note
    tab.set_engine(None)
    tab.set_engine(recorded("0.29.0"))
    line = tab.engine_error.text()
    assert line.startswith("scheduler.max_num_active_seqs: engine 'vllm-cpu-0.29'")
    assert "the profile" not in line and not tab.start_button.isEnabled()
    tab.set_engine(None)
    tab.set_engine(recorded("0.32.0"))
    assert tab.engine_error.isHidden() and tab.start_button.isEnabled()
    assert tab.form.editors["max_num_active_seqs"].value() == 2


# -- the real engine ---------------------------------------------------------------------------


def wait_for_cpu() -> None:
    """Other sessions on this machine mark heavy runs of theirs with /tmp/qd/cpu-busy."""
    while os.path.exists("/tmp/qd/cpu-busy"):
        time.sleep(20)


@pytest.mark.engines
def test_real_029_engine_migrates_or_refuses_a_032_profile(qtbot: Any, tmp_path: Path) -> None:
    """vllm-cpu 0.29.0 in its own venv, registered and chosen in the picker, probed in its own
    interpreter; profiles saved by this Quantdeck (beside vllm-cpu 0.32.0) loaded on it."""
    python = engine_python("0.29.0")
    if python is None:
        pytest.skip(f"no vllm-cpu 0.29.0 engine in {engines_root()} ({SETUP} makes it, once)")
    from quantdeck.core.engines import registry_path

    name = engine_name("0.29.0")
    registry_path().parent.mkdir(parents=True, exist_ok=True)
    entry = {"name": name, "python": str(python), "added": 1.0}
    registry_path().write_text(json.dumps({"version": 1, "engines": [entry]}))
    model = str(write_checkpoint(tmp_path / "tiny", TINY_LLAMA))
    renamed = demo_config(**{"moe-backend": NEW_NAME})
    newer = demo_config()
    newer.scheduler.max_num_active_seqs = 2
    for cfg in (renamed, newer):
        cfg.model.model = model
    profiles.save_profile("p32", renamed)
    profiles.save_profile("p32-newer", newer)
    assert profiles.read_profile("p32")[1] == "0.32.0"  # this venv's vLLM recorded

    win = MainWindow(device=cpu_device(), probe=False)
    qtbot.addWidget(win)
    win.add_model(Path(model), select=True)
    launch = win.launch
    wait_for_cpu()
    launch.engine_box.setCurrentIndex(launch.engine_box.findText(name))
    assert not launch.start_button.isEnabled()  # probed: Start waits
    qtbot.waitUntil(lambda: hasattr(win, "capabilities"), timeout=300_000)
    caps = win.capabilities
    assert caps.vllm_version == "0.29.0" and caps.name == name
    assert OLD_NAME in caps.choices("--moe-backend") and NEW_NAME not in caps.choices(
        "--moe-backend"
    )

    load(qtbot, launch, "p32")
    assert launch.form.extra_args() == {"moe-backend": OLD_NAME}
    head, *notes = note_lines(launch)
    assert head == f"Profile 'p32' (saved with vLLM 0.32.0) {TO_029}"
    assert any(f"'{NEW_NAME}' is '{OLD_NAME}' on vLLM 0.29.0" in n for n in notes)
    assert launch.start_button.isEnabled(), launch.start_button.toolTip()
    assert launch.engine_error.isHidden()
    assert f"--moe-backend={OLD_NAME}" in vllm_args(launch.config(), engine=caps)

    load(qtbot, launch, "p32-newer")
    line = launch.engine_error.text()
    assert line.startswith(f"scheduler.max_num_active_seqs: {caps.label} has no ")
    assert "saved with vLLM 0.32.0" in line and "\n" not in line
    assert not launch.start_button.isEnabled() and launch.start_button.toolTip() == line
