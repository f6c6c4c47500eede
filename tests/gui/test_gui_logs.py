"""The Logs tab as an operator reads it: it follows the tail until scrolled up, each run opens
with a header, and a crashed run's tail stays pinned with a jump to its first error."""

from __future__ import annotations

import re

from quantdeck.core.events import FactEvent, InstanceEvent, LogEvent, StateEvent, TrialEvent
from quantdeck.core.runtime.server import panel_access_line
from quantdeck.gui.logs import LogsPanel


def _fill(panel: LogsPanel, n: int, start: int = 0) -> None:
    for i in range(start, start + n):
        panel.add_event(LogEvent(f"line {i}", level="INFO"))


def test_the_view_follows_the_tail_until_scrolled_up(qtbot) -> None:
    panel = LogsPanel()
    qtbot.addWidget(panel)
    panel.resize(600, 300)
    panel.show()
    _fill(panel, 400)
    bar = panel.view.verticalScrollBar()
    assert bar.maximum() > 0 and bar.value() == bar.maximum()  # following
    bar.setValue(10)  # the operator scrolls up to read
    _fill(panel, 50, start=400)
    assert bar.value() == 10 and not panel.at_bottom()
    panel.bottom_button.click()  # back to the tail: following again
    _fill(panel, 50, start=450)
    assert bar.value() == bar.maximum()


def test_each_run_opens_with_a_header_and_a_crash_is_pinned(qtbot) -> None:
    panel = LogsPanel()
    qtbot.addWidget(panel)
    panel.add_event(StateEvent("starting"))
    _fill(panel, 5)
    panel.add_event(LogEvent("ERROR 12-05 boom in run one", level="ERROR"))
    panel.add_event(StateEvent("stopped"))
    panel.add_event(StateEvent("starting"))
    panel.add_event(FactEvent("ready_s", 21.5))
    _fill(panel, 300, start=100)
    panel.add_event(LogEvent("ERROR 12-05 the engine died", level="ERROR"))
    panel.add_event(LogEvent("ERROR 12-05 and then this", level="ERROR"))
    tail = [f"tail {i}" for i in range(60)]
    panel.add_event(StateEvent("crashed", reason="engine process 42 exited", log_tail=tail))
    text = panel.text()
    assert "━━ run 1 ·" in text and "━━ run 2 ·" in text
    assert text.index("━━ run 1") < text.index("boom in run one") < text.index("━━ run 2")
    assert "[fact] ready_s = 21.5" in text  # the CLI's line for it
    assert panel.summary.isVisibleTo(panel) and "engine process 42 exited" in panel.summary.text()
    # the pinned tail: the newest lines of it, whatever the log shows
    pinned = panel.tail_view.toPlainText().splitlines()
    assert pinned[-1] == "tail 59" and len(pinned) == 40
    assert panel.error_button.isVisibleTo(panel)
    # the jump goes to the crashed run's first error, not to an earlier run's
    panel.search.setText("nothing matches this")
    assert panel.jump_to_first_error()
    assert panel.view.textCursor().block().text() == "ERROR 12-05 the engine died"
    assert panel.search.text() == ""  # the filter that hid it was cleared
    # the next start unpins it
    panel.add_event(StateEvent("starting"))
    assert not panel.summary.isVisibleTo(panel) and not panel.tail_view.isVisibleTo(panel)
    assert not panel.error_button.isVisibleTo(panel)


def test_a_crash_without_an_error_line_offers_no_jump(qtbot) -> None:
    panel = LogsPanel()
    qtbot.addWidget(panel)
    panel.add_event(StateEvent("starting"))
    _fill(panel, 3)
    panel.add_event(StateEvent("crashed", reason="server exited with code 1", log_tail=["x"]))
    assert not panel.error_button.isVisibleTo(panel) and not panel.jump_to_first_error()


def test_a_fleet_instances_lines_are_shown(qtbot) -> None:
    panel = LogsPanel()
    qtbot.addWidget(panel)
    panel.add_event(InstanceEvent("a", LogEvent("from instance a", level="INFO")))
    assert "from instance a" in panel.text()


def test_the_panels_and_the_routers_scrapes_and_probes_are_recognised() -> None:
    ours = [
        '(APIServer pid=7) INFO:     127.0.0.1:41234 - "GET /metrics/?name%5B%5D=vllm%3A'
        'num_requests_running HTTP/1.1" 200 OK',
        'INFO:     127.0.0.1:41234 - "GET /metrics HTTP/1.1" 200 OK',
        'INFO:     127.0.0.1:41234 - "GET /health HTTP/1.1" 200 OK',
        # vLLM's router's load probe (vLLM has no such route)
        'INFO:     127.0.0.1:41234 - "GET /get_load HTTP/1.1" 404 Not Found',
    ]
    theirs = [
        'INFO:     127.0.0.1:41234 - "POST /v1/completions HTTP/1.1" 200 OK',
        'INFO:     127.0.0.1:41234 - "GET /v1/models HTTP/1.1" 200 OK',
        'INFO:     127.0.0.1:41234 - "GET /healthz HTTP/1.1" 404 Not Found',
        "WARNING the word /metrics in a message",
    ]
    assert all(panel_access_line(x) for x in ours)
    assert not any(panel_access_line(x) for x in theirs)


def test_behind_the_router_each_start_trial_arm_promotion_and_undo_has_a_header(qtbot) -> None:
    """A fleet instance's log in the Logs tab: its starts name it, and a trial's steps, the
    promotion and the undo each open a header in the operator's words (the knobs as every
    view names them)."""
    panel = LogsPanel()
    qtbot.addWidget(panel)
    panel.add_event(FactEvent("fleet instance", "serve"), "serve")
    panel.add_event(StateEvent("starting"), "serve")
    _fill(panel, 3)
    knobs = {"max_num_seqs": [8, 16]}
    for ev in (
        TrialEvent("admitted", knobs=knobs, reason="fits"),
        TrialEvent("started", knobs=knobs, reason="ready in 20 s"),
        TrialEvent("measuring", knobs=knobs),  # every 2 s: the Trial view's, not a header
        TrialEvent("promoted", knobs=knobs),
        TrialEvent("admitted", knobs={"max_num_seqs": [16, 8]}, undo=True),
        TrialEvent("promoted", knobs={"max_num_seqs": [16, 8]}, undo=True),
    ):
        panel.add_event(ev, "serve")
    headers = [line for line in panel.text().splitlines() if line.startswith("━━")]
    assert [re.sub(r" · \d\d:\d\d:\d\d.*", "", h) for h in headers] == [
        "━━ fleet instance serve",
        "━━ run 1 · serve",
        "━━ serve: trial admitted: max-num-seqs 8 → 16 (fits)",
        "━━ serve: trial started (ready in 20 s)",
        "━━ serve: promoted max-num-seqs 16",
        "━━ serve: undo admitted: back to max-num-seqs 8",
        "━━ serve: undone: back to max-num-seqs 8",
    ]
    # an instance event names its instance itself
    panel.add_event(InstanceEvent("b", StateEvent("starting")))
    assert panel.text().splitlines()[-1].startswith("━━ run 2 · b · ")
