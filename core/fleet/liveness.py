"""Liveness of a fleet's processes: *hung* means no progress, not a slow answer.

Kubernetes documents how liveness probes turn load into outages: a probe that times out under
CPU pressure restarts a busy but healthy container, whose work then lands on the others. Here
(2026-12-07, a fleet of one demo instance under 6 clients on 2 cores) the fleet's 1 Hz scrape
itself stalled for up to 12.7 s while clients were answered in 0.1 s, and "no answer for 5 s"
unrouted the only worker seven times in two minutes. So:

- Silence is counted in scrapes that *failed*, never in wall time since the last answer: when
  the watcher itself is starved and does not scrape, nothing new is known and nothing changes.
- A process in the stopped state (SIGSTOP, ``T``) is hung at once: that is a fact, not a guess.
- An instance that answers, holds requests, and whose own progress counters (tokens generated
  and prefilled, requests finished) stand still across scrapes spanning :data:`STUCK_S` is hung
  (when the CPU is saturated it must stand still :data:`CONFIRM_S`: till then *degraded*).
- An instance that does not answer is *degraded* (shown, kept routed) while its processes use
  CPU time; it is hung when it stays silent and uses no CPU time for :data:`IDLE_SILENT_S`
  (deadlocked), or stays silent :data:`CONFIRM_S` whatever it does (a live-lock).
- The machine's CPU pressure (``/proc/pressure/cpu``, else the run queue) is read with every
  look and named in the reason: "the CPU is saturated" rather than blaming the instance.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from quantdeck.core.snapshots import MetricsSnapshot

SILENT_FAILS = 3  # scrapes in a row that failed before silence counts
SILENT_S = 5.0  # ... and spanning this long: degraded
IDLE_SILENT_S = 10.0  # silent and no CPU time used this long: hung (deadlocked)
STUCK_S = 10.0  # requests held and no progress across scrapes spanning this long: hung
CONFIRM_S = 60.0  # silent (or stuck while the CPU is saturated) this long: hung all the same
SATURATED_PSI = 50.0  # % of the last 10 s that some runnable task waited for a CPU
PSI_PATH = Path("/proc/pressure/cpu")

OK, DEGRADED, HUNG = "ok", "degraded", "hung"


@dataclass(frozen=True)
class Pressure:
    """The machine's CPU pressure at one look."""

    some_avg10: float | None  # PSI: % of the last 10 s some runnable task waited (None: no PSI)
    load1: float  # the run queue, averaged over a minute
    cores: int

    @property
    def saturated(self) -> bool:
        if self.some_avg10 is not None:
            return self.some_avg10 >= SATURATED_PSI
        return self.load1 >= 2 * self.cores

    def describe(self) -> str:
        psi = f"PSI some avg10 {self.some_avg10:.0f} %, " if self.some_avg10 is not None else ""
        return f"the CPU is saturated ({psi}load {self.load1:.1f} on {self.cores} cores)"


def read_pressure(path: Path = PSI_PATH) -> Pressure:
    """The CPU pressure now: PSI where the kernel has it, the load average always."""
    some: float | None = None
    try:
        for line in path.read_text(encoding="ascii").splitlines():
            if line.startswith("some "):
                fields = dict(f.split("=", 1) for f in line.split()[1:] if "=" in f)
                some = float(fields["avg10"])
    except (OSError, ValueError, KeyError):
        some = None
    try:
        load1 = os.getloadavg()[0]
    except OSError:
        load1 = 0.0
    return Pressure(some, load1, os.cpu_count() or 1)


def tree_pids(pid: int | None) -> set[int]:
    """A process and its children (a server's API process and its engine core)."""
    if pid is None:
        return set()
    try:
        proc = psutil.Process(pid)
        return {pid, *(c.pid for c in proc.children(recursive=True))}
    except psutil.Error:
        return set()


@dataclass(frozen=True)
class ProcessLook:
    """What the processes of one server or router show at one look."""

    stopped: tuple[int, ...] = ()  # pids in the stopped state (SIGSTOP: ``T``, or traced)
    cpu_s: float | None = None  # their CPU time, user + system (None: none could be read)


def look_at(pid: int | None) -> ProcessLook:
    """The stopped processes and the CPU time of ``pid``'s tree."""
    stopped: list[int] = []
    cpu = 0.0
    seen = False
    for p in sorted(tree_pids(pid)):
        try:
            proc = psutil.Process(p)
            with proc.oneshot():
                status = proc.status()
                times = proc.cpu_times()
        except psutil.Error:
            continue
        seen = True
        cpu += times.user + times.system
        if status in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP):
            stopped.append(p)
    return ProcessLook(tuple(stopped), cpu if seen else None)


@dataclass(frozen=True)
class Judgement:
    """Whether a process serves: ``ok``, ``degraded`` (slow; kept routed) or ``hung``
    (confirmed: a stopped process, or no progress), and why in one line."""

    verdict: str
    why: str = ""


def _counters(m: MetricsSnapshot) -> tuple[float, float, float]:
    return (m.generation_tokens_total, m.prompt_tokens_total, m.requests_finished_total)


@dataclass
class Liveness:
    """One process's liveness, fed by its scrapes and judged at each look (monotonic times).

    Not thread-safe by itself: the fleet's watcher feeds it, and its loop reads the
    judgement the watcher left (:attr:`judgement`), each under the fleet's own order."""

    started: float  # when it became ready (its clocks start there)
    answered_at: float = 0.0  # its last scrape that answered
    failed_since: float | None = None  # the first failed scrape of the current streak
    fails: int = 0  # failed scrapes in a row
    progressed_at: float = 0.0  # its last answered scrape that was idle or had moved on
    counters: tuple[float, float, float] | None = None
    busy: int = 0  # requests running or waiting at its last answered scrape
    cpu_s: float | None = None  # its CPU time when the silence began
    cpu_moved_at: float = 0.0  # the last look at which its CPU time had moved on
    judgement: Judgement = field(default_factory=lambda: Judgement(OK))

    def __post_init__(self) -> None:
        self.answered_at = self.progressed_at = self.cpu_moved_at = self.started

    def scraped(self, at: float, metrics: MetricsSnapshot | None) -> None:
        """One scrape at ``at``: its figures, or None where it failed."""
        if metrics is None:
            if self.fails == 0:
                self.failed_since = at
            self.fails += 1
            return
        self.fails, self.failed_since = 0, None
        self.answered_at = at
        counters = _counters(metrics)
        self.busy = metrics.running + metrics.waiting
        if self.busy == 0 or counters != self.counters:
            self.progressed_at = at
        self.counters = counters

    def answered(self, at: float) -> None:
        """A bare answer (a router's ``/health``): no figures, nothing held."""
        self.fails, self.failed_since = 0, None
        self.answered_at = self.progressed_at = at
        self.busy = 0

    def judge(self, now: float, procs: ProcessLook, pressure: Pressure) -> Judgement:
        """The judgement at ``now`` (kept in :attr:`judgement`)."""
        self.judgement = self._judge(now, procs, pressure)
        return self.judgement

    def _judge(self, now: float, procs: ProcessLook, pressure: Pressure) -> Judgement:
        if procs.stopped:
            return Judgement(HUNG, f"process {procs.stopped[0]} is stopped (SIGSTOP: state T)")
        busy_note = f"; {pressure.describe()}" if pressure.saturated else ""
        if self.fails >= SILENT_FAILS and self.failed_since is not None:
            silent = max(0.0, now - self.failed_since)
            if procs.cpu_s is None or self.cpu_s is None or procs.cpu_s > self.cpu_s:
                self.cpu_moved_at = now
            self.cpu_s = procs.cpu_s
            idle = now - max(self.cpu_moved_at, self.failed_since)
            if silent >= CONFIRM_S:
                return Judgement(HUNG, f"no answer for {silent:.0f} s")
            if procs.cpu_s is not None and idle >= IDLE_SILENT_S:
                return Judgement(HUNG, f"no answer and no CPU time used for {idle:.0f} s")
            if silent >= SILENT_S:
                return Judgement(
                    DEGRADED, f"slow: {self.fails} scrapes unanswered in {silent:.0f} s{busy_note}"
                )
            return self.judgement  # a streak under way: nothing new is known yet
        self.cpu_s = procs.cpu_s
        stuck = self.answered_at - self.progressed_at
        if self.busy and stuck >= STUCK_S:
            why = f"{self.busy} requests held and no progress for {stuck:.0f} s"
            if pressure.saturated and stuck < CONFIRM_S:
                return Judgement(DEGRADED, why + busy_note)
            return Judgement(HUNG, why)
        return Judgement(OK)
