"""The GUI's one worker pattern (quantdeck.gui.workers): events yielded on the GUI thread, the
result returned, quit → aborted (never returned), errors as one line, nothing left running."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import pytest
from conftest import ROOT

from quantdeck.core.errors import ServerError
from quantdeck.core.events import BenchProgress, Event
from quantdeck.gui.workers import EventQueue, WorkerSet, error_text


class _Job:
    """A blocking job with a thread-safe cancel, as the core's Bench/ABRun/Tuner have."""

    def __init__(self, events: EventQueue, n: int = 3, hold: bool = False) -> None:
        self.events, self.n, self.hold = events, n, hold
        self.cancelled = threading.Event()
        self.thread: str | None = None

    def run(self) -> dict:
        self.thread = threading.current_thread().name
        for i in range(self.n):
            self.events.put(BenchProgress(i + 1, self.n, ttft_ms=1.0))
        if self.hold:  # measures until cancelled: ends early, with what it has
            self.cancelled.wait(30)
        return {"done": self.n, "ended_early": "cancelled" if self.cancelled.is_set() else None}

    def cancel(self) -> None:
        self.cancelled.set()


def test_follow_yields_events_on_the_gui_thread_then_returns(qtbot) -> None:
    errors: list[str] = []
    workers = WorkerSet(errors.append)
    events: EventQueue = EventQueue()
    job = _Job(events)
    seen: list[tuple[Event, str]] = []

    def on_events(batch: list[Event]) -> None:
        seen.extend((ev, threading.current_thread().name) for ev in batch)

    order: list[object] = []
    workers.follow(
        job.run,
        events,
        cancel=job.cancel,
        yielded=on_events,
        returned=order.append,
        finished=lambda: order.append("finished"),
    )
    qtbot.waitUntil(lambda: "finished" in order, timeout=5000)
    assert order == [{"done": 3, "ended_early": None}, "finished"]
    assert [ev.done for ev, _ in seen if isinstance(ev, BenchProgress)] == [1, 2, 3]
    assert {name for _, name in seen} == {threading.main_thread().name}
    assert job.thread not in (None, threading.main_thread().name)
    assert not errors and len(workers) == 0


def test_cancel_keeps_the_partial_result(qtbot) -> None:
    """The job's own cancel (the Benchmark tab's Cancel) ends it early with a result."""
    workers = WorkerSet(lambda msg: None)
    events: EventQueue = EventQueue()
    job = _Job(events, hold=True)
    got: list[list[Event]] = []
    w = workers.follow(job.run, events, cancel=job.cancel, yielded=got.append)
    qtbot.waitUntil(lambda: sum(map(len, got)) == 3, timeout=5000)
    with qtbot.waitSignal(w.returned, timeout=5000) as b:
        job.cancel()
    assert b.args[0]["ended_early"] == "cancelled"


def test_quit_aborts_and_never_returns(qtbot) -> None:
    workers = WorkerSet(lambda msg: None)
    events: EventQueue = EventQueue()
    job = _Job(events, hold=True)
    got: list[list[Event]] = []
    w = workers.follow(job.run, events, cancel=job.cancel, yielded=got.append)
    returned: list[object] = []
    w.returned.connect(returned.append)
    qtbot.waitUntil(lambda: sum(map(len, got)) == 3, timeout=5000)
    with qtbot.waitSignals([w.aborted, w.finished], order="strict", timeout=5000):
        w.quit()
    assert job.cancelled.is_set()  # quit() asked the job itself to stop
    assert returned == [] and workers.wait(1)


def test_quit_ends_a_call_that_cannot_be_cancelled(qtbot) -> None:
    """With a tick the worker ends on quit even while the call blocks (the call's thread is a
    daemon and finishes on its own)."""
    release = threading.Event()
    workers = WorkerSet(lambda msg: None)
    w = workers.follow(lambda: release.wait(30), tick_s=0.05)
    qtbot.waitUntil(lambda: w.is_running, timeout=5000)
    t0 = time.monotonic()
    with qtbot.waitSignal(w.aborted, timeout=5000):
        workers.quit()
    assert time.monotonic() - t0 < 2
    assert workers.wait(2)
    release.set()


@pytest.mark.parametrize(
    "exc, text",
    [
        (ServerError("http://x: unreachable"), "http://x: unreachable"),
        (ValueError("bad"), "ValueError: bad"),
        # superqt's generator worker takes a RuntimeError for "worker deleted": still reported
        (RuntimeError("loop closed"), "RuntimeError: loop closed"),
    ],
)
def test_errors_are_one_line_through_one_path(qtbot, exc: Exception, text: str) -> None:
    errors: list[str] = []
    workers = WorkerSet(errors.append)

    def fails() -> None:
        raise exc

    workers.follow(fails)
    workers.start(fails)
    qtbot.waitUntil(lambda: len(workers) == 0, timeout=5000)  # both finished
    assert errors == [text, text]
    assert error_text(exc) == text


def test_generator_functions_run_as_generator_workers(qtbot) -> None:
    def count(n: int):
        yield from range(n)
        return "done"

    workers = WorkerSet(lambda msg: None)
    got: list[int] = []
    result: list[str] = []
    workers.start(count, 3, yielded=got.append, returned=result.append)
    qtbot.waitUntil(lambda: result == ["done"], timeout=5000)
    assert got == [0, 1, 2]


def test_window_shows_before_superqt_and_pyqtgraph_load() -> None:
    """The window's modules leave superqt (workers, ~0.2 s) and pyqtgraph (Monitor) to after the
    first paint."""
    code = (
        "import sys, json\n"
        "import quantdeck.gui.app, quantdeck.gui.main_window, quantdeck.gui.launch\n"
        "print(json.dumps([n for n in ('superqt', 'pyqtgraph') if n in sys.modules]))\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={"QT_QPA_PLATFORM": "offscreen", "PATH": "/usr/bin:/bin"},
    )
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.strip().splitlines()[-1]) == []
