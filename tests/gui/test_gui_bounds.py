"""Every pane and history of the panel keeps to its bound, however much is pushed into it;
the Monitor says what the sampler could not read."""

from __future__ import annotations

from conftest import metrics_event

from quantdeck.core.events import BenchProgress, LogEvent, StateEvent
from quantdeck.core.launch import LaunchConfig, cpu_device
from quantdeck.core.monitor import TimeSeriesStore
from quantdeck.gui import bench, convert_tab, logs, playground
from quantdeck.gui.bench import BenchTab
from quantdeck.gui.convert_tab import ConvertTab
from quantdeck.gui.logs import LogsPanel
from quantdeck.gui.monitor import MonitorPanel
from quantdeck.gui.playground import PlaygroundPanel


def test_playground_transcript_keeps_its_newest_lines(qtbot) -> None:
    pg = PlaygroundPanel(lambda: (None, None, None))
    qtbot.addWidget(pg)
    n = 3 * playground.MAX_TRANSCRIPT_LINES
    pg._write("".join(f"line {i}\n" for i in range(n)))
    doc = pg.transcript.document()
    assert doc.blockCount() <= playground.MAX_TRANSCRIPT_LINES
    assert f"line {n - 1}\n" in pg.transcript.toPlainText()
    assert "line 0\n" not in pg.transcript.toPlainText()


def test_convert_log_keeps_its_newest_lines(qtbot) -> None:
    tab = ConvertTab(lambda: None, cpu_device())
    qtbot.addWidget(tab)
    n = 3 * convert_tab.MAX_LOG_LINES
    for i in range(n):
        tab._log(f"job 1: line {i}")
    assert tab.log.document().blockCount() == convert_tab.MAX_LOG_LINES
    assert tab.log.toPlainText().endswith(f"job 1: line {n - 1}")
    tab.shutdown()


def test_logs_keep_their_newest_lines_each_cut_short(qtbot, monkeypatch) -> None:
    monkeypatch.setattr(logs, "MAX_LINES", 500)  # the panel takes its bound when made
    panel = LogsPanel()
    qtbot.addWidget(panel)
    n = 4 * logs.MAX_LINES
    for i in range(n):
        panel.add_event(LogEvent(f"line {i}", level="INFO"))
    panel.add_event(LogEvent("x" * 2**20, level="INFO"))  # one line of a MiB
    assert len(panel.lines) == logs.MAX_LINES
    assert panel.view.document().blockCount() <= logs.MAX_LINES + 1
    assert panel.lines[0][1] == f"line {n - logs.MAX_LINES + 1}"
    level, text = panel.lines[-1]
    assert len(text) < logs.MAX_LINE_CHARS + 40 and text.endswith(
        f"({2**20 - logs.MAX_LINE_CHARS} more)"
    )
    panel.add_event(StateEvent("crashed", reason="y" * 2**20, log_tail=["a", "b"]))
    assert len(panel.lines[-1][1]) < logs.MAX_LINE_CHARS + 40
    panel.level.setCurrentIndex(1)  # a refilter shows what is kept, no more
    assert panel.view.document().blockCount() <= logs.MAX_LINES + 1


def test_bench_live_plot_keeps_the_newest_requests(qtbot) -> None:
    tab = BenchTab(lambda: (None, None, None), LaunchConfig, lambda: False)
    qtbot.addWidget(tab)
    n = 2 * bench.MAX_LIVE_POINTS + 17
    tab._on_events([BenchProgress(i + 1, n, ttft_ms=float(i)) for i in range(n)])
    x, y = tab.curve.getData()
    assert len(x) == len(y) == bench.MAX_LIVE_POINTS
    assert x[-1] == n - 1 and y[-1] == float(n - 1) and y[0] == float(n - len(y))


def test_monitor_store_keeps_its_capacity(qtbot) -> None:
    m = MonitorPanel(TimeSeriesStore(capacity=512))
    qtbot.addWidget(m)
    cap = m.store.capacity
    nbytes = sum(c.nbytes for c in m.store._cols.values())
    for i in range(5 * cap):
        m.add_event(metrics_event(float(i), running=i % 7))
    m.refresh(force=True)
    assert len(m.store) == cap and sum(c.nbytes for c in m.store._cols.values()) == nbytes
    assert len(m.data_of("running")) == 61  # the last minute, at 1 Hz


def test_monitor_says_what_the_sampler_misses(qtbot) -> None:
    m = MonitorPanel()
    qtbot.addWidget(m)
    m.show()
    m.add_event(metrics_event(1.0, error="telemetry: NVML_ERROR_GPU_IS_LOST"))
    assert m.problem.isVisible()
    assert m.problem.text() == "monitoring: telemetry: NVML_ERROR_GPU_IS_LOST"
    m.add_event(metrics_event(2.0))
    assert not m.problem.isVisible() and len(m.store) == 2
