"""A live trial run by the fleet: a candidate config beside an instance, on the same traffic.

:class:`LiveTrial` is the trial's own thread. It starts the candidate on a port of its own
(never touching the incumbent), warms it up (uncounted), has the fleet add it to the router,
then compares the two arms on the router's split of the live traffic (:mod:`.trial` judges)
until a verdict, a breach or the time limit, and carries the decision out: a promotion (the
incumbent out of the router, drained, stopped; the candidate becomes the instance and its
profile is saved, the old one kept) or a rollback (the candidate out of the router, drained,
stopped). Until the decision nothing about the incumbent changes. Every step is a
:class:`~quantdeck.core.events.TrialEvent` of the instance.
"""

from __future__ import annotations

import collections
import logging
import math
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from quantdeck.core.errors import QuantdeckError, ServerError
from quantdeck.core.events import Event, InstanceEvent, MarkerEvent, StateEvent, TrialEvent
from quantdeck.core.fleet.trial import (
    CANDIDATE,
    LOOKS,
    ArmSpan,
    TrialOptions,
    Verdict,
    breach,
    judge,
    next_look,
)
from quantdeck.core.launch import LaunchConfig
from quantdeck.core.launch.diff import knob_diff
from quantdeck.core.monitor.metrics import MetricsScraper, RawMetrics, parse_metrics
from quantdeck.core.runtime import EngineEnv, ServerProcess
from quantdeck.core.runtime.server import free_port, warm_up

if TYPE_CHECKING:
    from quantdeck.core.fleet.spec import InstanceSpec

log = logging.getLogger(__name__)

TICK_S = 1.0  # the arms scraped and judged
REPORT_S = 2.0  # a "measuring" event with the running verdict and both arms' figures
ROUTE_WAIT_S = 30.0  # the router takes (or drops) the candidate within this
SILENT_S = 5.0  # a candidate that does not answer this long is rolled back


class LiveTrial:
    """One trial of the instance ``inst`` against the candidate launch ``cfg``. The fleet
    starts it (:meth:`start`), asks :attr:`routed` and :attr:`retiring` for the router's
    workers, and carries out a promotion (:meth:`Fleet._promote`)."""

    def __init__(
        self,
        inst: InstanceSpec,
        cfg: LaunchConfig,
        opts: TrialOptions,
        *,
        emit: Callable[[Event], None],
        promote: Callable[[LiveTrial], str],
        routed_now: Callable[[str], bool],
        nice: int = 0,
        startup_timeout: float | None = None,
    ) -> None:
        assert inst.cfg is not None  # trials are of local instances
        self.inst, self.opts, self._emit, self._promote = inst, opts, emit, promote
        self.routed_now = routed_now  # whether the router has a worker, as the fleet told it
        self.name = inst.name
        self.incumbent_cfg = inst.cfg.copy()
        self.cfg = cfg.copy()
        self.cfg.server.host = self.incumbent_cfg.server.host
        self.cfg.server.port = free_port(self.cfg.server.host)
        self.cfg.server.api_key = self.incumbent_cfg.server.api_key  # the fleet's, never sent
        self.knobs = {
            k: [a, b]
            for k, (a, b) in knob_diff(self.incumbent_cfg, self.cfg).items()
            if k != "port"
        }
        self.label = self.name + CANDIDATE  # the candidate server's events' instance name
        self.server = ServerProcess(
            self.cfg,
            engine=EngineEnv(inst.engine) if inst.engine else None,
            extra_env=inst.env(),
            nice=nice,
            startup_timeout=startup_timeout,
        )
        self.server.subscribe(self._on_server)
        self._why_down = ""  # the candidate's crash reason, as its state event said it
        self.routed = False  # the fleet's router should have the candidate
        self.retiring = False  # ... and no longer the incumbent (a promotion under way)
        self.phase = "admitted"
        self.verdict: Verdict | None = None
        self.arms: dict[str, dict[str, Any]] = {}
        self.result: str | None = None  # "promoted" or "rolled back", once carried out
        self.done = threading.Event()
        self._decision: tuple[str, str] | None = None  # the operator's (ask) or a stop
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return self.server.url

    # -- the fleet's and the operator's side ---------------------------------------------------
    def start(self, admitted: str) -> None:
        self._event("admitted", reason=admitted)
        self._thread = threading.Thread(target=self._run, name=f"trial-{self.name}", daemon=True)
        self._thread.start()

    def decide(self, decision: str, reason: str) -> None:
        """The operator's decision (``promote`` or ``rollback``), or a stop (``rollback``)."""
        with self._lock:
            if self._decision is None:
                self._decision = (decision, reason)

    def abort(self, reason: str) -> None:
        """The fleet stops: the candidate goes at once (no drain), the incumbent stays."""
        self.decide("rollback", reason)
        self.server.stop(sigint_timeout=5.0, sigterm_timeout=5.0)
        if self._thread is not None:
            self._thread.join(timeout=30)

    def wait(self, timeout: float | None = None) -> bool:
        return self.done.wait(timeout)

    # -- the trial's thread ----------------------------------------------------------------------
    def _on_server(self, ev: Event) -> None:
        if isinstance(ev, StateEvent) and ev.state == "crashed" and isinstance(ev.reason, str):
            self._why_down = ev.reason
        self._emit(InstanceEvent(self.label, ev))

    def _event(self, phase: str, **kw: Any) -> None:
        self.phase = phase
        ev = TrialEvent(phase, candidate=self.url, knobs=self.knobs, goal=self.opts.goal, **kw)
        self._emit(InstanceEvent(self.name, ev))

    def _marker(self, label: str) -> None:
        diff = {k: list(v) for k, v in self.knobs.items()}
        self._emit(InstanceEvent(self.name, MarkerEvent("trial", label, diff)))

    def _operator(self) -> tuple[str, str] | None:
        with self._lock:
            return self._decision

    def _run(self) -> None:
        try:
            decision, reason = self._trial()
            self._event(
                "decided",
                decision=decision,
                reason=reason,
                verdict=self.verdict.to_json() if self.verdict else {},
                arms=self.arms,
            )
            self._marker(f"trial {decision}: {reason}")
            if decision == "promote":
                saved = self._promote(self)
                self.result = "promoted"
                self._event("promoted", reason=saved)
            else:
                self._roll_back()
                self.result = "rolled back"
                self._event("rolled back", reason=reason)
        except Exception as e:  # a bug must not leave a candidate behind
            log.exception("the trial of %s failed", self.name)
            self.routed = False
            self.server.stop()
            self.result = "rolled back"
            self._event("rolled back", reason=f"the trial failed: {e}")
        finally:
            self.done.set()

    def _wait_ready(self) -> str | None:
        """Wait for the candidate to be ready; None, or why it is not."""
        try:
            self.server.start()
        except QuantdeckError as e:
            return f"the candidate did not start: {e}"
        while True:
            state = self.server.state
            if state == "ready":
                return None
            if state in ("crashed", "stopped"):
                return f"the candidate {state}: {self._why_down or 'see its log'}"
            stop = self._operator()
            if stop is not None:
                return stop[1]
            time.sleep(0.2)

    def _trial(self) -> tuple[str, str]:
        """Start, warm up, route, measure; the decision and its reason."""
        t0 = time.monotonic()
        why = self._wait_ready()
        if why is not None:
            return "rollback", why
        self._event("started", reason=f"ready in {time.monotonic() - t0:.0f} s on {self.url}")
        try:
            warm_up(self.server, self.opts.warmup_requests)
        except (QuantdeckError, OSError) as e:
            return "rollback", f"the candidate failed its warm-up: {e}"
        self.routed = True
        if not self.wait_routes(self.url, True):
            return "rollback", f"the router did not take the candidate in {ROUTE_WAIT_S:g} s"
        self._marker("trial started")
        return self._measure()

    def wait_routes(self, url: str, routed: bool) -> bool:
        """Wait until the router has (or no longer has) ``url``; False after ROUTE_WAIT_S."""
        deadline = time.monotonic() + ROUTE_WAIT_S
        while self.routed_now(url) != routed:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.1)
        return True

    def _measure(self) -> tuple[str, str]:
        inc = MetricsScraper(self.inst.url, api_key=self.inst.api_key, timeout=2.0)
        cand = MetricsScraper(self.url, api_key=self.cfg.server.api_key, timeout=2.0)
        try:
            return self._compare(inc, cand)
        finally:
            inc.close()
            cand.close()

    def _compare(self, inc: MetricsScraper, cand: MetricsScraper) -> tuple[str, str]:
        opts = self.opts
        start_i = start_c = None
        history: collections.deque[RawMetrics] = collections.deque()
        answered = time.monotonic()
        began = time.monotonic()
        look_at: float = opts.min_requests
        looks = 0
        reported = 0.0
        settled: Verdict | None = None  # the latest look's verdict
        while True:
            stop = self._operator()
            if stop is not None:
                return stop
            if self.server.state != "ready":
                why = self._why_down or "see its log"
                return "rollback", f"the candidate {self.server.state}: {why}"
            try:
                now_c = parse_metrics(cand.fetch())
                answered = time.monotonic()
            except (ServerError, ValueError, KeyError, TypeError):
                if time.monotonic() - answered > SILENT_S:
                    return "rollback", f"the candidate did not answer for {SILENT_S:g} s"
                time.sleep(TICK_S)
                continue
            try:
                now_i = parse_metrics(inc.fetch())
            except (ServerError, ValueError, KeyError, TypeError):
                time.sleep(TICK_S)
                continue
            if start_i is None or start_c is None:
                start_i, start_c = now_i, now_c
                history.append(now_c)
                time.sleep(TICK_S)
                continue
            if now_i.counters.get("generation_tokens", 0.0) < start_i.counters.get(
                "generation_tokens", 0.0
            ):
                return "rollback", "the incumbent restarted during the trial"
            history.append(now_c)
            while len(history) > 1 and now_c.t - history[1].t >= opts.breach_window_s:
                history.popleft()
            broke = breach(ArmSpan(history[0], now_c), opts)
            if broke is not None:
                return "rollback", broke
            span_i, span_c = ArmSpan(start_i, now_i), ArmSpan(start_c, now_c)
            final = time.monotonic() - began >= opts.max_duration_s
            n = min(span_i.requests, span_c.requests)
            if n >= look_at or final:
                settled = judge(span_i, span_c, opts, final=final)
                looks += 1  # the last planned look is kept for the time limit
                look_at = next_look(n, opts) if looks < LOOKS - 1 else math.inf
            self.verdict = settled or judge(span_i, span_c, opts)
            self.arms = {
                "incumbent": span_i.figures(opts.slo),
                "candidate": span_c.figures(opts.slo),
            }
            if time.monotonic() - reported >= REPORT_S:
                reported = time.monotonic()
                self._event("measuring", verdict=self.verdict.to_json(), arms=self.arms)
            if (
                settled is not None
                and final
                and settled.outcome == "undecided"
                and opts.decide == "auto"
            ):
                return "rollback", (
                    f"too little traffic in {opts.max_duration_s:g} s to compare "
                    f"({settled.reason}): the incumbent stays"
                )
            if settled is not None and opts.decide == "auto":
                if settled.outcome == "better":
                    return "promote", settled.reason
                if settled.outcome in ("worse", "no difference"):
                    keep = "the incumbent stays: " if settled.outcome != "worse" else ""
                    return "rollback", f"{settled.outcome}: {keep}{settled.reason}"
            time.sleep(TICK_S)

    def _roll_back(self) -> None:
        """The candidate out of the router, drained, stopped."""
        self.routed = False
        if self.wait_routes(self.url, False):  # (else it goes all the same: the router retries)
            drain(self.url, self.cfg.server.api_key, self.opts.drain_timeout_s)
        self.server.stop()


def drain(url: str, api_key: str | None, timeout: float) -> bool:
    """Wait (up to ``timeout`` s) until the server at ``url`` runs and queues no request;
    True once it does (or cannot be asked: it is gone)."""
    scraper = MetricsScraper(url, api_key=api_key, timeout=2.0)
    deadline = time.monotonic() + timeout
    time.sleep(0.5)  # requests the router sent just before the change still arrive
    try:
        while time.monotonic() < deadline:
            try:
                raw = parse_metrics(scraper.fetch())
            except (ServerError, ValueError, KeyError, TypeError):
                return True
            if raw.gauges.get("running", 0.0) + raw.gauges.get("waiting", 0.0) == 0:
                return True
            time.sleep(0.25)
        return False
    finally:
        scraper.close()
