"""The item models of the lists and tables (model library, conversion jobs, benchmark results and
history), without a server: cells read by column name, rows follow the core objects' events."""

from __future__ import annotations

import threading
from pathlib import Path

from ckpt import LLAMA3_8B, write_checkpoint
from PySide6.QtCore import QItemSelectionModel, Qt

from quantdeck.core.bench import list_runs, save_run
from quantdeck.core.bench.results import ABResult, BenchResult, LiveTuneResult
from quantdeck.core.convert import Conversion, JobQueue, QuantSpec
from quantdeck.core.convert.jobs import Job
from quantdeck.core.events import ProgressEvent, StateEvent
from quantdeck.core.launch import LaunchConfig, cpu_device
from quantdeck.core.launch.device import H200
from quantdeck.gui.bench import METRICS, BenchTab
from quantdeck.gui.convert_tab import ConvertTab
from quantdeck.gui.main_window import MainWindow
from quantdeck.gui.table_model import Column, ObjectTableModel


def test_object_table_model_columns_by_name(qtbot) -> None:
    cols = (
        Column("name", lambda d: d["name"], tooltip=lambda d: d["path"]),
        Column("%", lambda d: f"{d['pct']:.0f}", value=lambda d: d["pct"], align_right=True),
    )
    m: ObjectTableModel[dict] = ObjectTableModel(cols)
    row = {"name": "a", "path": "/m/a", "pct": 12.5}
    assert m.append(row) == 0 and m.rowCount() == 1 and m.columnCount() == 2
    assert m.headerData(1, Qt.Horizontal) == "%"
    assert m.text(0, "name") == "a" and m.value(0, "%") == 12.5 and m.value(0, "name") is None
    assert m.index(0, m.column("name")).data(Qt.ToolTipRole) == "/m/a"
    assert m.index(0, m.column("%")).data(Qt.UserRole) == 12.5
    assert m.find(lambda d: d["name"] == "a") == 0 and m.find(lambda d: False) == -1
    with qtbot.waitSignal(m.dataChanged) as changed:
        row["pct"] = 50.0
        m.row_changed(0)
    assert changed.args[0].row() == 0 and changed.args[1].column() == 1
    assert m.text(0, "%") == "50"
    with qtbot.waitSignal(m.modelReset):
        m.set_rows([{"x": 1}, {"x": 2}], [Column("x", lambda d: str(d["x"]))])
    assert m.column_names == ["x"] and [m.text(i, "x") for i in range(2)] == ["1", "2"]


def test_library_model(qtbot, tmp_path: Path) -> None:
    """Each folder once; the selection drives the Launch tab; unreadable folders say so."""
    good = write_checkpoint(tmp_path / "l8b", LLAMA3_8B)
    bad = tmp_path / "broken"
    bad.mkdir()
    (bad / "config.json").write_text("{")
    win = MainWindow(device=H200, probe=False)
    qtbot.addWidget(win)
    win.add_model(good)
    win.add_model(good)  # known: not added again
    assert win.library_model.rowCount() == 1 and win.selected_model() is None
    with qtbot.waitSignal(win.model_selected) as selected:
        win.add_model(bad, select=True)
    assert selected.args[0] == str(bad)
    assert win.library_model.text(1, "model") == "broken   (unreadable)"
    assert win.selected_model().info is None
    win.add_model(good, select=True)
    row = win.library.currentIndex().row()
    assert row == 0 and "BF16" in win.library_model.text(row, "model")
    assert win.library_model.index(row, 0).data(Qt.ToolTipRole) == str(good)
    assert win.launch.model_path == str(good) and "l8b" in win.launch.model_label.text()


def test_job_table_follows_the_queue_events(qtbot, tmp_path: Path) -> None:
    """The JobQueue's observer runs on the queue's thread: its events reach the table through
    the tab's queued signal, in order, on the GUI thread."""
    tab = ConvertTab(lambda: None, cpu_device(), jobs=JobQueue())
    qtbot.addWidget(tab)
    job = Job(1, QuantSpec(src=str(tmp_path / "src"), method="w8a8", out=str(tmp_path / "out")))
    seen: list[str] = []  # the threads the rows were inserted on
    tab.jobs_model.rowsInserted.connect(lambda *_: seen.append(threading.current_thread().name))

    def queue_thread() -> None:
        for ev in (
            StateEvent("queued"),
            StateEvent("running"),
            ProgressEvent("quantize", 40.0, extra={"layer": 2, "layers": 4}),
        ):
            tab.job_event.emit(job, ev)

    t = threading.Thread(target=queue_thread)
    t.start()
    t.join()
    qtbot.waitUntil(lambda: tab.jobs_model.rowCount() == 1 and tab.jobs_model.value(0, "%") == 40)
    assert seen == [threading.main_thread().name]
    m = tab.jobs_model
    assert m.text(0, "job") == "1" and m.text(0, "model") == "src" and m.text(0, "format") == "w8a8"
    assert m.text(0, "state") == "running" and m.text(0, "stage") == "quantize layer 2/4"
    assert "job 1: quantize layer 2/4 (40%)" in tab.log.toPlainText()
    job.state, job.result = (
        "done",
        Conversion(
            out=str(tmp_path / "out"),
            quant_method="compressed-tensors",
            scheme="W8A8-INT8",
            bytes=50,
            source_bytes=100,
            seconds=3.0,
        ),
    )
    with qtbot.waitSignal(tab.job_finished, timeout=5000):
        threading.Thread(target=lambda: tab.job_event.emit(job, StateEvent("done"))).start()
    assert m.text(0, "state") == "done" and m.value(0, "%") == 100 and m.text(0, "ETA") == "-"
    assert m.text(0, "result") == "W8A8-INT8 · 50% of the source · 3 s"
    tab.table.selectRow(0)
    assert tab.selected_job() is job and tab.launch_button.isEnabled()
    with qtbot.waitSignal(tab.launch_requested, timeout=2000) as launched:
        qtbot.mouseClick(tab.launch_button, Qt.LeftButton)
    assert launched.args[0] == str(tmp_path / "out")
    tab.shutdown()


def test_results_table_and_history(qtbot) -> None:
    """A result, an A/B result and a comparison of two runs picked in the history."""
    tab = BenchTab(lambda: (None, None, None), LaunchConfig, lambda: False)
    qtbot.addWidget(tab)
    assert tab.runs_model.rowCount() == 0
    tab.show_result(BenchResult(completed=6, failed=0, output_throughput=123.456))
    m = tab.results_model
    assert m.column_names == ["metric", "value"] and m.rowCount() == len(METRICS)
    cells = {m.text(i, "metric"): m.text(i, "value") for i in range(m.rowCount())}
    assert cells["completed"] == "6" and cells["output tok/s"] == "123.5"
    assert cells["TTFT p50 ms"] == "-"
    tab.show_result(
        ABResult.from_json(
            {
                "kind": "ab",
                "arms": [
                    {"label": "eager", "result": {"completed": 4}},
                    {"label": "graphs", "skipped": "cancelled"},
                ],
            }
        )
    )
    assert m.column_names == ["metric", "eager", "graphs"]
    cells = {
        m.text(i, "metric"): (m.text(i, "eager"), m.text(i, "graphs")) for i in range(m.rowCount())
    }
    assert cells["completed"] == ("4", "-")
    assert cells["arm error"] == ("-", "cancelled")  # why an arm has no figures, said
    for label, tput in (("first", 100.0), ("second", 150.0)):
        save_run(BenchResult(completed=6, failed=0, output_throughput=tput), label)
    qtbot.mouseClick(tab.refresh_button, Qt.LeftButton)
    assert tab.runs_model.rowCount() == 2
    assert [tab.runs_model.text(i, "run") for i in range(2)] == [p.name for p in list_runs()]
    for row in (1, 0):  # the older run first: it is A
        index = tab.runs_model.index(row, 0)
        tab.history.selectionModel().select(index, QItemSelectionModel.Select)
    qtbot.mouseClick(tab.compare_button, Qt.LeftButton)
    assert m.column_names == ["metric", "first", "second", "B / A"]
    i = next(i for i in range(m.rowCount()) if m.text(i, "metric") == "output_throughput")
    assert m.text(i, "first") == "100.00" and m.text(i, "second") == "150.00"
    assert m.text(i, "B / A") == "1.500 better"
    # a live tuning chain saved in the history reads back, and is no run to compare
    save_run(LiveTuneResult.from_json({"kind": "live_tune", "trials": [], "ended": "x"}), "live")
    qtbot.mouseClick(tab.refresh_button, Qt.LeftButton)
    tab.history.selectionModel().clearSelection()
    for row in range(2):
        index = tab.runs_model.index(row, 0)
        tab.history.selectionModel().select(index, QItemSelectionModel.Select)
    qtbot.mouseClick(tab.compare_button, Qt.LeftButton)
    assert tab.status.text() == "select two benchmark runs to compare"


def test_bench_error_is_one_message(qtbot) -> None:
    """A run against no server fails in its worker: one line, and the tab is ready again."""
    tab = BenchTab(lambda: ("http://127.0.0.1:9", "m", None), LaunchConfig, lambda: False)
    qtbot.addWidget(tab)
    with qtbot.waitSignal(tab.failed, timeout=20000) as failed:
        qtbot.mouseClick(tab.run_button, Qt.LeftButton)
    assert "unreachable" in failed.args[0] and "Traceback" not in failed.args[0]
    qtbot.waitUntil(lambda: tab.run_button.isEnabled() and tab.job is None, timeout=5000)
    assert tab.status.text() == failed.args[0] and not tab.cancel_button.isEnabled()
