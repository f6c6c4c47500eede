"""The Benchmark tab against the real demo server: run, live plot, results table, history,
compare; cancel; A/B refused while a server runs."""

from __future__ import annotations

import pytest
from PySide6.QtCore import Qt

from quantdeck.core.bench import list_runs
from quantdeck.core.launch import LaunchConfig
from quantdeck.gui.bench_tab import BenchTab

pytestmark = pytest.mark.server


@pytest.fixture
def tab(qtbot, demo_server):
    t = BenchTab(
        lambda: (demo_server.url, demo_server.served_name, None), LaunchConfig, lambda: True
    )
    qtbot.addWidget(t)
    t.show()
    t.concurrency.setValue(2)
    t.num_prompts.setValue(6)
    t.input_len.setValue(24)
    t.output_len.setValue(8)
    yield t
    if t.worker is not None:
        t.cancel()
        qtbot.waitUntil(lambda: t.job is None, timeout=60000)


def test_run_fills_plot_table_history(qtbot, tab: BenchTab) -> None:
    before = len(list_runs())
    tab.label.setText("gui-run")
    with qtbot.waitSignal(tab.finished, timeout=180000) as blocker:
        qtbot.mouseClick(tab.run_button, Qt.LeftButton)
    result = blocker.args[0]
    assert result["completed"] == 6 and result["failed"] == 0
    qtbot.waitUntil(lambda: tab.run_button.isEnabled(), timeout=5000)
    # the live plot got one TTFT point per request
    x, y = tab.curve.getData()
    assert len(y) == 6 and all(v > 0 for v in y)
    assert tab.progress.value() == 6 and tab.progress.maximum() == 6
    cells = {
        tab.table.item(i, 0).text(): tab.table.item(i, 1).text()
        for i in range(tab.table.rowCount())
    }
    assert cells["completed"] == "6"
    assert float(cells["output tok/s"]) == pytest.approx(result["output_throughput"], rel=1e-3)
    assert len(list_runs()) == before + 1
    assert tab.history.count() == before + 1
    # a second run, on vllm bench's random prompts, compared with the first from the history
    tab.history.item(0).setSelected(True)
    tab.dataset.setCurrentIndex(tab.dataset.findData("random"))
    with qtbot.waitSignal(tab.finished, timeout=180000) as blocker:
        qtbot.mouseClick(tab.run_button, Qt.LeftButton)
    again = blocker.args[0]
    assert again["load"]["dataset"] == "random" and again["completed"] == 6
    # vLLM's prompts: re-tokenized text can stay a token or two off the length, as in vLLM
    assert all(abs(r["prompt_len"] - 24) <= 2 for r in again["requests"])
    qtbot.waitUntil(lambda: tab.run_button.isEnabled(), timeout=5000)
    tab.history.clearSelection()
    tab.history.item(0).setSelected(True)
    tab.history.item(1).setSelected(True)
    qtbot.mouseClick(tab.compare_button, Qt.LeftButton)
    assert tab.table.columnCount() == 4
    assert tab.table.item(0, 0).text() == "completed"


def test_cancel_mid_run(qtbot, tab: BenchTab) -> None:
    tab.num_prompts.setValue(60)
    tab.output_len.setValue(48)
    with qtbot.waitSignal(tab.finished, timeout=180000) as blocker:
        qtbot.mouseClick(tab.run_button, Qt.LeftButton)
        qtbot.waitUntil(lambda: tab.progress.value() >= 2, timeout=120000)
        qtbot.mouseClick(tab.cancel_button, Qt.LeftButton)
    result = blocker.args[0]
    assert result["ended_early"] == "cancelled"
    assert result["completed"] + result["failed"] == 60
    assert "ended early" in tab.status.text()


def test_ab_refused_while_a_server_runs(qtbot, tab: BenchTab) -> None:
    tab.modes.setCurrentIndex(1)
    with qtbot.waitSignal(tab.failed, timeout=5000) as blocker:
        qtbot.mouseClick(tab.run_button, Qt.LeftButton)
    assert "stop the running server" in blocker.args[0]
    assert tab.run_button.isEnabled()
