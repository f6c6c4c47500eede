"""Liveness: hung is no progress (or a stopped process), never a slow answer or a starved
watcher (issue 43)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from quantdeck.core.fleet.liveness import (
    CONFIRM_S,
    DEGRADED,
    HUNG,
    IDLE_SILENT_S,
    OK,
    STUCK_S,
    Liveness,
    Pressure,
    ProcessLook,
    look_at,
    read_pressure,
)
from quantdeck.core.snapshots import MetricsSnapshot

CALM = Pressure(5.0, 0.5, 2)
SATURATED = Pressure(98.5, 13.2, 2)
RUNNING = ProcessLook(cpu_s=1.0)


def snap(tokens: float, busy: int = 1, finished: float = 0.0) -> MetricsSnapshot:
    return MetricsSnapshot.from_json(
        {
            "t": time.time(),
            "running": busy,
            "waiting": 0,
            "preemptions_total": 0.0,
            "prompt_tokens_total": 0.0,
            "generation_tokens_total": tokens,
            "requests_finished_total": finished,
        }
    )


def test_a_watcher_that_did_not_look_sees_no_silence() -> None:
    """The fleet's own scrape stalled 12.7 s under load while clients were answered: no
    failed scrape, so nothing is known against the instance."""
    live = Liveness(0.0)
    live.scraped(1.0, snap(10))
    assert live.judge(40.0, RUNNING, SATURATED).verdict == OK  # 39 s without a look


def test_failed_scrapes_of_a_busy_process_are_degraded_then_hung_past_the_confirm_window() -> None:
    live = Liveness(0.0)
    cpu = 1.0
    for k in range(1, 5):
        live.scraped(float(k) * 2, None)
        cpu += 0.2  # it computes: slow, not dead
        j = live.judge(float(k) * 2, ProcessLook(cpu_s=cpu), SATURATED)
    assert j.verdict == DEGRADED and "the CPU is saturated" in j.why and "PSI" in j.why, j
    live.scraped(2 + CONFIRM_S, None)
    j = live.judge(2 + CONFIRM_S, ProcessLook(cpu_s=cpu + 1), SATURATED)
    assert j.verdict == HUNG and "no answer" in j.why


def test_silent_with_no_cpu_time_is_hung_after_the_idle_window() -> None:
    live = Liveness(0.0)
    for k in range(4):
        live.scraped(float(k), None)
        live.judge(float(k), ProcessLook(cpu_s=3.0), CALM)
    j = live.judge(1.0 + IDLE_SILENT_S, ProcessLook(cpu_s=3.0), CALM)
    assert j.verdict == HUNG and "no CPU time" in j.why, j


def test_an_answer_ends_the_silence() -> None:
    live = Liveness(0.0)
    for k in range(5):
        live.scraped(float(k) * 2, None)
        live.judge(float(k) * 2, ProcessLook(cpu_s=float(k)), CALM)
    assert live.judgement.verdict == DEGRADED
    live.scraped(11.0, snap(3))
    assert live.judge(11.0, RUNNING, CALM).verdict == OK


def test_requests_held_without_progress_are_hung_unless_the_cpu_is_saturated() -> None:
    for pressure, verdict in ((CALM, HUNG), (SATURATED, DEGRADED)):
        live = Liveness(0.0)
        live.scraped(1.0, snap(10))
        live.scraped(1.0 + STUCK_S, snap(10))
        j = live.judge(1.0 + STUCK_S, RUNNING, pressure)
        assert j.verdict == verdict and "no progress" in j.why, (pressure, j)
    live.scraped(1.0 + CONFIRM_S, snap(10))  # saturated, and still nothing: confirmed
    assert live.judge(1.0 + CONFIRM_S, RUNNING, SATURATED).verdict == HUNG


@pytest.mark.parametrize(
    "moved", [snap(11), snap(10, busy=0), snap(10, finished=1.0)], ids=["token", "idle", "done"]
)
def test_any_progress_counter_or_no_work_keeps_it_ok(moved: MetricsSnapshot) -> None:
    live = Liveness(0.0)
    live.scraped(1.0, snap(10))
    live.scraped(1.0 + STUCK_S / 2, snap(10))
    live.scraped(1.0 + STUCK_S, moved)
    live.scraped(1.0 + STUCK_S * 1.4, snap(moved.generation_tokens_total, finished=1.0))
    assert live.judge(1.0 + STUCK_S * 1.4, RUNNING, CALM).verdict == OK


def test_a_stopped_process_is_hung_at_once_and_its_cpu_time_is_read() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert look_at(child.pid).stopped == () and look_at(child.pid).cpu_s is not None
        child.send_signal(signal.SIGSTOP)
        deadline = time.monotonic() + 10
        while not look_at(child.pid).stopped and time.monotonic() < deadline:
            time.sleep(0.05)
        look = look_at(child.pid)
        assert look.stopped == (child.pid,)
        j = Liveness(0.0).judge(0.5, look, CALM)  # answered a moment ago: a fact all the same
        assert j.verdict == HUNG and "stopped" in j.why and str(child.pid) in j.why
    finally:
        child.kill()
        child.wait()
    assert look_at(child.pid) == ProcessLook()  # gone: nothing read


def test_pressure_reads_psi_and_says_so(tmp_path: Path) -> None:
    psi = tmp_path / "cpu"
    psi.write_text(
        "some avg10=98.50 avg60=80.00 avg300=40.00 total=1\n"
        "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"
    )
    p = read_pressure(psi)
    assert p.some_avg10 == 98.5 and p.saturated and "PSI some avg10 98 %" in p.describe()
    psi.write_text("garbage")
    assert read_pressure(psi).some_avg10 is None  # no PSI: the run queue alone
    assert not Pressure(None, 1.0, 2).saturated and Pressure(None, 4.0, 2).saturated
