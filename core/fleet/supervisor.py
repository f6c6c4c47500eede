"""The fleet at run time: its instances (one :class:`ServerProcess` each) behind vLLM's router.

The router is the ``vllm-router`` package's launcher, started by :func:`spawn` (its own group,
dies with us, leased) once the instances are ready, with the primaries as its workers (the
backups start and wait: the SLA fallback adds them). Every event of an instance reaches the
observers as an :class:`InstanceEvent` carrying its name; the router's are instance
``"router"``. A small state file in the cache folder lets ``fleet status`` and ``fleet down``
in another shell find the running fleet.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import httpx
import psutil

from quantdeck.core.errors import ConfigError, QuantdeckError, ServerError
from quantdeck.core.events import (
    AdviceEvent,
    Event,
    FactEvent,
    InstanceEvent,
    Publisher,
    RestartEvent,
    RouteEvent,
    StateEvent,
)
from quantdeck.core.fleet.live import LiveTrial, drain
from quantdeck.core.fleet.live import sleep as sleep_server
from quantdeck.core.fleet.liveness import (
    DEGRADED,
    HUNG,
    OK,
    Judgement,
    Liveness,
    look_at,
    read_pressure,
    tree_pids,
)
from quantdeck.core.fleet.router import FallbackJudge, RouterClient
from quantdeck.core.fleet.rows import STARTING_FACT, FleetRows, InstanceSampler
from quantdeck.core.fleet.spec import ROUTER, FleetSpec, InstanceSpec, admit_candidate
from quantdeck.core.fleet.trial import TrialOptions
from quantdeck.core.http import auth_headers
from quantdeck.core.launch import LaunchConfig, to_dict, validate
from quantdeck.core.launch.knobs import to_yaml
from quantdeck.core.models import ModelInfo
from quantdeck.core.paths import cache_dir, write_atomic
from quantdeck.core.procs import Child, signal_group, spawn, subprocess_env, worker_command
from quantdeck.core.runtime import EngineEnv, ServerProcess
from quantdeck.core.runtime.server import alive_pids, free_port, port_free
from quantdeck.core.schema import Fields, load_json, read_bounded

log = logging.getLogger(__name__)

ROUTER_READY_S = 60.0
TICK_S = 0.25  # the fleet loop's look at its instances
SAMPLE_S = 1.0  # the instances' metrics scraped (and the fallback rule judged)
METRICS_WINDOW_S = 60.0  # their quantiles' window, where no fallback rule sets one
FACTS_S = 5.0  # the router's facts, reported when they change
ROUTE_RETRY_S = 5.0  # a change of the router's workers it refused, tried again
# restart: on-failure, as systemd's RestartSec with back-off: the delay before each attempt in a
# row; an instance that crashed more than RESTART_LIMIT times in a row, never staying up
# STABLE_S, is given up (systemd's StartLimitBurst).
RESTART_DELAYS = (1.0, 2.0, 4.0, 8.0, 16.0, 30.0)
RESTART_LIMIT = 5
STABLE_S = 60.0
# Liveness (core.fleet.liveness: hung is no progress, not a slow answer): a hung instance is
# out of the router at once (unless it is the last that serves), restarted (restart:
# on-failure) after HUNG_GRACE_S more unless it came back; a degraded one (slow) stays routed.
# The router, judged alike by its own prober: hung, it is killed and, like a router that died,
# started again on its port with the workers it should have, after ROUTER_DELAYS (more than
# ROUTER_LIMIT deaths in a row, none up STABLE_S: the fleet ends).
HUNG_GRACE_S = 10.0
STARTING_EVERY_S = 10.0  # a start under way is told this often (stage, time, limit)
ROUTER_DELAYS = (0.5, 1.0, 2.0, 4.0, 8.0)
ROUTER_LIMIT = 5
PROBE_TIMEOUT_S = 2.0
# a stop of a hung or crashed instance: each signal waits this long (a stopped process gets
# SIGCONT after each, so that it can act on it)
HUNG_STOP_S = 2.0
# The router's launcher (quantdeck.core.workers.router) takes the API key from this variable
# (another user can read a process's argv in /proc, not its environment) and, given one, has
# the router ask it on every route, /health included.
ROUTER_KEY_ENV = "QUANTDECK_ROUTER_API_KEY"


_ANOTHER_FLEET = "a fleet already runs from this cache folder: `quantdeck fleet down`"
RETIRED = "~before"  # a retired (sleeping) incumbent's events: instance NAME~before


@dataclass
class Retired:
    """An instance's launch before its last promotion, kept for ``fleet undo``: its server
    asleep (sleep mode, until ``until``) for a wake-up, or only its launch, to start again."""

    cfg: LaunchConfig
    promotion: str  # what was promoted over it (the knob diff, one line)
    server: ServerProcess | None = None
    until: float = 0.0  # (monotonic) the sleeper is stopped then
    slept_s: float | None = None  # how long it took to fall asleep
    residual: dict[int, int] | None = None  # GPU index -> bytes it holds asleep (NVML)


def router_command_workers(spec: FleetSpec) -> list[str]:
    """The workers the router starts with: the primaries."""
    return [i.url for i in spec.instances if i.role == "primary"]


def state_path() -> Path:
    """Where the running fleet says what it is (one fleet per cache folder)."""
    return cache_dir() / "fleet" / "state.json"


def router_command(
    spec: FleetSpec,
    python: str | None = None,
    *,
    metrics_port: int | None = None,
    workers: list[str] | None = None,
) -> list[str]:
    """The router's command line: its workers (default: the primaries), the fleet file's
    settings, its Prometheus exposition on loopback at ``metrics_port`` (default: the
    file's)."""
    r = spec.router
    workers = router_command_workers(spec) if workers is None else workers
    port = metrics_port or r.metrics_port
    return [
        *worker_command("router", python=python),
        f"--host={r.host}",
        f"--port={r.port}",
        f"--policy={r.policy}",
        *([f"--prometheus-port={port}", "--prometheus-host=127.0.0.1"] if port else []),
        "--worker-urls",
        *workers,
        *r.flags,
    ]


@dataclass
class _Tended:
    """What the fleet's loop knows of one local instance besides its server's state."""

    spec: InstanceSpec
    server: ServerProcess
    crashes: int = 0  # in a row, without staying up STABLE_S
    crash_seen: bool = False
    restart_at: float | None = None
    up_since: float | None = None
    action: threading.Thread | None = None  # a stop and start, off the fleet's loop
    # liveness: fed and judged by the watcher thread, acted on by the loop (monotonic times)
    live: Liveness | None = None  # since it was last ready
    said: str = OK  # the verdict the fleet last told (ok, degraded, hung)
    told_at: float = 0.0  # a start under way last told then
    hung_since: float | None = None
    hung_why: str = ""

    @property
    def acting(self) -> bool:
        return self.action is not None and self.action.is_alive()


class Fleet:
    """Start, watch and stop one fleet."""

    def __init__(
        self, spec: FleetSpec, *, startup_timeout: float | None = None, nice: int = 0
    ) -> None:
        """``nice``: run the instances this much nicer (the panel keeps its UI responsive)."""
        self.spec = spec
        self._forwards: dict[int, Callable[[], None]] = {}  # id(server) -> its unsubscribe
        self.servers: dict[str, ServerProcess] = {
            i.name: self._server(i, startup_timeout, nice) for i in spec.local
        }
        self.retired: dict[str, Retired] = {}  # per instance, for `fleet undo`
        self.router: Child | None = None
        self.router_log = cache_dir() / "fleet" / "router.log"
        self.router_api = RouterClient(spec.router.url, spec.router.api_key)
        self._events: Publisher[Event] = Publisher("fleet")
        self._tended = {
            i.name: _Tended(i, self.servers[i.name]) for i in spec.local if i.name in self.servers
        }
        self._routed: set[str] = set()  # the workers the router has, as we told it
        self._queued: list[str] = []  # instances waiting for a GPU-sharing elder to be ready
        self._route_retry: dict[tuple[str, str], float] = {}
        self.fallback = FallbackJudge(spec) if spec.fallback is not None else None
        window = spec.fallback.window_s if spec.fallback is not None else METRICS_WINDOW_S
        self.sampler = InstanceSampler(window_s=window)
        self._metrics_port: int | None = None
        # the router's supervision (its death or hang: a restart on its port)
        self._router_seen_down = False
        self._router_crashes = 0  # in a row, without staying up STABLE_S
        self._router_up_since: float | None = None
        self._router_restart_at: float | None = None
        self._router_action: threading.Thread | None = None
        self._router_live: Liveness | None = None  # fed by its own prober once it is ready
        self._router_said = OK  # the verdict last told of it
        self._router_ready = threading.Event()  # up and given its workers: routes may change
        self.failure: str | None = None  # why run() ended without a stop (one line)
        self._stopping = False  # stop() has begun: no restart starts anything
        self.slowest_tick_s = 0.0  # the loop's longest look at the fleet (a stall)
        self.nice, self.startup_timeout = nice, startup_timeout
        self.trial: LiveTrial | None = None  # a live trial under way (one at a time)
        self._trial_lock = threading.Lock()
        self.control: Any = None  # the control socket `fleet try` talks to (fleet.control)

    def _server(
        self, inst: InstanceSpec, startup_timeout: float | None, nice: int
    ) -> ServerProcess:
        assert inst.cfg is not None  # local instances have a profile
        server = ServerProcess(
            inst.cfg,
            engine=EngineEnv(inst.engine) if inst.engine else None,
            extra_env=inst.env(),
            startup_timeout=startup_timeout,
            nice=nice,
        )
        self._forwards[id(server)] = server.subscribe(
            lambda ev: self._events.emit(InstanceEvent(inst.name, ev))
        )
        return server

    def subscribe(self, fn: Callable[[Event], None]) -> Callable[[], None]:
        return self._events.subscribe(fn)

    def _router_event(self, ev: Event) -> None:
        self._events.emit(InstanceEvent(ROUTER, ev))

    # -- start -------------------------------------------------------------------------------
    def start_instances(self) -> None:
        """Start the local instances side by side, except that one sharing a GPU with an
        instance before it in the file waits until that one is ready (:meth:`wait_ready`
        starts it): vLLM sizes its KV cache from the GPU memory it finds free while it starts,
        and two starting on one GPU would each see the other's allocations come and go. The
        router's port is checked first, so that a taken port costs no model load."""
        self._check_router_port()
        self._queued = list(self.servers)
        self._start_due()

    def _start_due(self) -> None:
        """Start each queued instance whose GPU-sharing elders are all ready."""
        for name in list(self._queued):
            if all(self.servers[e].state == "ready" for e in self._gpu_elders(name)):
                self._queued.remove(name)
                self.servers[name].start()

    def _gpu_elders(self, name: str) -> list[str]:
        """The local instances before ``name`` in the file that share a GPU with it."""
        spec = next(i for i in self.spec.local if i.name == name)
        elders = []
        for i in self.spec.local[: self.spec.local.index(spec)]:
            if set(i.gpus or []) & set(spec.gpus or []):
                elders.append(i.name)
        return elders

    def _check_router_port(self) -> None:
        r = self.spec.router
        if not port_free(r.host, r.port):
            raise ServerError(f"router: port {r.port} on {r.host} is already in use")

    def wait_ready(self, stop: threading.Event, timeout: float = 1800.0) -> bool:
        """Block until every instance is ready (True); False when one crashed or stopped, on
        ``stop``, or after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while not stop.is_set() and time.monotonic() < deadline:
            self._start_due()
            states = {s.state for n, s in self.servers.items() if n not in self._queued}
            if states & {"crashed", "stopped"}:
                return False
            if states <= {"ready"} and not self._queued:
                return True
            stop.wait(0.2)
        return False

    def start_router(
        self,
        stop: threading.Event | None = None,
        timeout: float = ROUTER_READY_S,
        workers: list[str] | None = None,
    ) -> None:
        """Start the router with ``workers`` (default: the primaries) and wait for its
        ``/health`` (or ``stop``); ServerError when it does not come. A restart (``workers``
        given) takes the same ports: the one it had is not checked (its connections may
        linger in TIME_WAIT, which the router's own bind allows)."""
        r = self.spec.router
        if workers is None:
            self._check_router_port()
        self._router_ready.clear()
        self._metrics_port = self._metrics_port or r.metrics_port or free_port()
        first = router_command_workers(self.spec) if workers is None else workers
        cmd = router_command(self.spec, metrics_port=self._metrics_port, workers=first)
        self._router_event(StateEvent("starting", command=cmd))
        self.router_log.parent.mkdir(parents=True, exist_ok=True)
        env = subprocess_env({ROUTER_KEY_ENV: r.api_key} if r.api_key else {})
        # a restart appends: the dead router's last lines stay
        with open(self.router_log, "w" if workers is None else "a", encoding="utf-8") as out:
            self.router = spawn(
                cmd,
                kind="vLLM router",
                port=r.port,
                deathsig=signal.SIGTERM,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
            )
        self._router_seen_down = False  # a new process: its death is news
        self._router_event(FactEvent("pid", self.router.pid))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not (stop and stop.is_set()):
            if self.router.poll() is not None:
                break
            if self.router_healthy():
                self._routed = set(first)
                self._router_live, self._router_said = Liveness(time.monotonic()), OK
                self._router_seen_down = False
                self._router_event(StateEvent("ready", url=r.url))
                self._router_event(FactEvent("workers", self.workers()))
                self._router_ready.set()
                return
            time.sleep(0.3)
        if stop and stop.is_set():
            return
        code = self.router.poll()
        if workers is not None:  # a restart: one that did not come is killed, and its death
            signal_group(self.router.pid, signal.SIGKILL)  # counted by the loop (back-off)
            raise ServerError(f"router: restart not ready (exit code {code})")
        tail = self.router_log.read_text(errors="replace").splitlines()[-20:]
        why = f"exited with code {code}" if code is not None else f"not ready after {timeout:g} s"
        self._router_event(StateEvent("crashed", exit_code=code, reason=why, log_tail=tail))
        raise ServerError(f"router: {why} (log: {self.router_log})")

    def router_healthy(self) -> bool:
        r = self.spec.router
        return probe(r.url, api_key=r.api_key) == "ready"

    def workers(self) -> list[str]:
        """The router's workers, as it lists them."""
        return self.router_api.workers()

    @property
    def router_running(self) -> bool:
        return self.router is not None and self.router.poll() is None

    # -- running -----------------------------------------------------------------------------
    def serve(self, stop: threading.Event) -> bool:
        """The whole life of the fleet, until ``stop``: check it, start the instances, then
        the router, keep them serving, and stop everything. True when it ended because of
        ``stop`` (False: an instance or the router failed). What ``fleet up`` and the panel's
        Fleet tab both run."""
        from quantdeck.core.fleet.spec import check_fleet

        warnings = check_fleet(self.spec)
        self._router_event(FactEvent("fleet", self.describe()))
        for text in warnings:  # it runs, but slower than it could: said before it starts
            self._router_event(AdviceEvent({"level": "warning", "knob": "cpus", "message": text}))
        if running_fleet() is not None:
            raise ServerError("a fleet already runs from this cache folder: `quantdeck fleet down`")
        if stop.is_set():  # stopped while it was checked: start nothing
            return True
        from quantdeck.core.fleet.control import ControlServer

        self.control = ControlServer(self)  # `fleet try` in another shell
        self.write_state()
        try:
            self.start_instances()
            if self.wait_ready(stop):
                self.start_router(stop)
                self.run(stop)
            return stop.is_set()
        finally:
            self.stop()
            self.clear_state()

    def run(self, stop: threading.Event) -> bool:
        """Keep the fleet serving until ``stop``: restart crashed and hung instances
        (``restart: on-failure``, with back-off), restart the router when it dies or hangs,
        keep the router's workers in step with the instances that serve, apply the fallback
        rule, report the router's facts. False (and :attr:`failure` says why) when the router
        could not be kept up.

        Three threads, so that one instance's trouble never delays another's handling: this
        loop only looks at states and clocks and starts the stops and starts in a thread per
        instance (and one for the router); the watcher scrapes the instances side by side and
        probes the router; the router's workers change in a thread of their own (a hung
        router delays nothing else)."""
        done = threading.Event()
        helpers = [
            threading.Thread(target=self._watch_loop, args=(stop, done), name="fleet-watch"),
            threading.Thread(target=self._route_loop, args=(stop, done), name="fleet-routes"),
            threading.Thread(
                target=self._router_watch_loop, args=(stop, done), name="fleet-router-watch"
            ),
        ]
        for h in helpers:
            h.daemon = True
            h.start()
        try:
            while not stop.is_set():
                now = time.monotonic()
                if not self._tend_router(now, stop):
                    return False
                for t in self._tended.values():
                    self._tend(t, now)
                if self.trial is not None and self.trial.done.is_set():
                    self.trial = None
                self._expire(now)
                self.slowest_tick_s = max(self.slowest_tick_s, time.monotonic() - now)
                stop.wait(TICK_S)
            return True
        finally:
            done.set()
            for h in helpers:
                h.join(timeout=10)

    def _watch_loop(self, stop: threading.Event, done: threading.Event) -> None:
        """The watcher: every SAMPLE_S the instances' scrapes (side by side, each with its
        timeout), their liveness, the fallback rule; the router's health; its facts."""
        next_facts = 0.0
        last_facts: dict[str, Any] | None = None
        while not (stop.is_set() or done.is_set()):
            now = time.monotonic()
            try:
                self.sample(now)
                if now >= next_facts:
                    next_facts = now + FACTS_S
                    facts = self.router_facts()
                    if facts and facts != last_facts:
                        self._router_event(FactEvent("router", facts))
                        last_facts = facts
            except Exception:  # a bug here must not end the watching
                log.exception("the fleet's watcher failed a turn")
            done.wait(max(0.0, SAMPLE_S - (time.monotonic() - now)))

    def _router_watch_loop(self, stop: threading.Event, done: threading.Event) -> None:
        """The router's liveness, probed every SAMPLE_S in a thread of its own: slow scrapes
        of busy instances (the watcher's) must not make a router that answers look hung (a
        loaded machine once had it killed while it served, every client then refused)."""
        r = self.spec.router
        while not (stop.is_set() or done.is_set()):
            now = time.monotonic()
            try:
                live, router = self._router_live, self.router
                if live is not None and router is not None and self.router_running:
                    if probe(r.url, PROBE_TIMEOUT_S, r.api_key) == "ready":
                        live.answered(time.monotonic())
                    else:
                        live.scraped(time.monotonic(), None)
                    live.judge(time.monotonic(), look_at(router.pid), read_pressure())
            except Exception:
                log.exception("the router's probe failed a turn")
            done.wait(max(0.0, SAMPLE_S - (time.monotonic() - now)))

    def _route_loop(self, stop: threading.Event, done: threading.Event) -> None:
        """The router's workers kept in step, while the router is up."""
        while not (stop.is_set() or done.is_set()):
            if self._router_ready.is_set() and self.router_running:
                try:
                    self.sync_routes()
                except Exception:
                    log.exception("the fleet's routes failed a turn")
            done.wait(TICK_S)

    def sample(self, now: float) -> None:
        """Scrape the instances that serve (and every remote one), report each one's figures
        as a ``metrics`` event, note each local one's liveness, and judge the fallback rule
        on the primaries'."""
        targets = [
            (i.name, i.url, i.api_key)
            for i in self.spec.instances
            if i.url_ is not None or self.servers[i.name].state == "ready"
        ]
        trial = self.trial
        if trial is not None and trial.server.state == "ready" and trial.label != trial.name:
            targets.append((trial.label, trial.url, trial.cfg.server.api_key))
        self.sampler.forget({url for _, url, _ in targets})
        samples = self.sampler.sample(targets)
        answered = time.monotonic()
        pressure = read_pressure()
        for name, ev in samples.items():
            self._events.emit(InstanceEvent(name, ev))
            t = self._tended.get(name)
            live = t.live if t is not None else None
            if t is not None and live is not None:
                live.scraped(answered, ev.metrics)
                live.judge(time.monotonic(), look_at(t.server.pid), pressure)
        if self.fallback is not None:
            worst = self.fallback.worst(self._ready_primaries(), samples)
            judged = self.fallback.judge(worst, now)
            if judged is not None:
                self._router_event(judged)

    def describe(self) -> list[dict[str, Any]]:
        """The fleet's rows as the Fleet view shows them before anything runs (``fleet``
        fact: a recording of ``fleet up`` is replayed from it)."""
        from quantdeck.core.models import inspect_model

        infos: dict[str, ModelInfo | None] = {}
        for inst in self.spec.local:
            assert inst.cfg is not None  # local instances have a profile
            try:
                infos[inst.name] = inspect_model(inst.cfg.model.model)
            except QuantdeckError:
                infos[inst.name] = None
        return FleetRows(self.spec, infos).describe()

    def _instance_event(self, t: _Tended, ev: Event) -> None:
        self._events.emit(InstanceEvent(t.spec.name, ev))

    def _act(self, t: _Tended, what: str, fn: Callable[[], None]) -> None:
        """Run ``fn`` (a stop and a start) in the instance's own thread; a start refused
        (a port taken meanwhile...) is a crash like another."""

        def body() -> None:
            try:
                fn()
            except QuantdeckError as e:
                self._instance_event(t, StateEvent("crashed", reason=str(e)))
            except Exception as e:  # a bug: said, and the loop goes on
                log.exception("%s of %s failed", what, t.spec.name)
                self._instance_event(t, StateEvent("crashed", reason=f"{what} failed: {e}"))

        t.action = threading.Thread(target=body, name=f"fleet-{what}-{t.spec.name}", daemon=True)
        t.action.start()

    def _count_crash(self, t: _Tended, now: float) -> None:
        """A crash (or a hang) counted; the restart planned with back-off, or given up."""
        t.crashes += 1
        gave_up = t.crashes > RESTART_LIMIT
        delay = RESTART_DELAYS[min(t.crashes, len(RESTART_DELAYS)) - 1]
        t.restart_at = None if gave_up else now + delay
        self._instance_event(t, RestartEvent(t.crashes, 0.0 if gave_up else delay, gave_up=gave_up))

    def _tend(self, t: _Tended, now: float) -> None:
        """One look at an instance (no waiting: stops and starts run in its own thread): a
        crash counted and its restart planned, a hang noticed, a restart due started, a stay
        long enough to forgive the earlier crashes."""
        if t.acting:
            return
        state = t.server.state
        if state == "ready":
            if t.up_since is None:  # just up: its liveness is counted from now
                t.up_since, t.live, t.said = now, Liveness(now), OK
            if now - t.up_since >= STABLE_S and t.hung_since is None:
                t.crashes = 0
            self._judge_liveness(t, now)
        else:
            t.hung_since, t.live = None, None
            self._tell_start(t, now)
        owner = self._trial_of(t)
        if owner is not None:  # the trial owns its arms: it ends first, then the policy
            if state in ("crashed", "stopped") or t.hung_since is not None:
                why = t.hung_why if state == "ready" else t.server.crash_reason or "crashed"
                owner.arm_failed("incumbent", f"{'hung' if state == 'ready' else state}: {why}")
            return
        if state == "crashed" and not t.crash_seen:
            t.crash_seen, t.up_since = True, None
            if t.spec.restart == "on-failure":
                self._count_crash(t, now)
        if t.restart_at is not None and now >= t.restart_at:
            t.restart_at, t.crash_seen, t.up_since = None, False, None
            server = t.server

            def restart() -> None:
                # what is left of the crashed or hung one goes first, each signal short
                server.stop(sigint_timeout=HUNG_STOP_S, sigterm_timeout=HUNG_STOP_S)
                if not self._stopping:
                    server.start()

            self._act(t, "restart", restart)

    def _judge_liveness(self, t: _Tended, now: float) -> None:
        """Tell the watcher's judgement when it changes: degraded (slow, kept routed), hung
        (out of the router, unless it is the last that serves: :meth:`wanted_workers`), back
        to ready; under ``restart: on-failure`` a hung one is restarted after HUNG_GRACE_S, said
        before it happens."""
        j = t.live.judgement if t.live is not None else Judgement(OK)
        if j.verdict == HUNG and t.hung_since is None:
            t.hung_since, t.hung_why = now, j.why
            last = self._last_serving(t.spec)
            plan = (
                f"; restarted in {HUNG_GRACE_S:g} s unless it comes back (restart: on-failure)"
                if t.spec.restart == "on-failure" and self._trial_of(t) is None
                else ""
            )
            kept = "; the last instance that serves: kept in the router" if last else ""
            self._instance_event(t, StateEvent("hung", reason=j.why + kept + plan))
            t.said = HUNG
        elif j.verdict == DEGRADED and t.said == OK:
            self._instance_event(t, StateEvent("degraded", reason=j.why + "; kept in the router"))
            t.said = DEGRADED
        elif j.verdict == OK and t.said != OK and t.restart_at is None:
            t.hung_since = None  # (a restart planned goes ahead: it stays out of the router)
            self._instance_event(t, StateEvent("ready", url=t.spec.url, reason="recovered"))
            t.said = OK
        if (
            t.hung_since is not None
            and t.restart_at is None
            and t.spec.restart == "on-failure"
            and self._trial_of(t) is None
            and now - t.hung_since >= HUNG_GRACE_S
        ):
            t.crash_seen = True  # the stop to come is not a crash of its own
            self._count_crash(t, now)

    def _tell_start(self, t: _Tended, now: float) -> None:
        """A start under way told every STARTING_EVERY_S (its stage, time and limit)."""
        server = t.server
        if server.state in ("crashed", "stopped", "stopping") or server.started_at is None:
            return
        if now - t.told_at < STARTING_EVERY_S:
            return
        t.told_at = now
        elapsed = round(time.time() - server.started_at)
        if elapsed >= STARTING_EVERY_S:
            value = {"stage": server.state, "elapsed_s": elapsed, "limit_s": server.startup_timeout}
            self._instance_event(t, FactEvent(STARTING_FACT, value))

    def _trial_of(self, t: _Tended) -> LiveTrial | None:
        """The trial under way of this instance, if any: it owns the instance meanwhile."""
        trial = self.trial
        if trial is None or trial.done.is_set() or trial.name != t.spec.name:
            return None
        return None if trial.label == trial.name else trial  # (promoted: the instance's own)

    def _last_serving(self, inst: InstanceSpec) -> bool:
        """Whether no other instance (nor a trial's candidate) serves beside ``inst``."""
        others = [i for i in self.spec.instances if i.name != inst.name and self._serving(i)]
        trial = self.trial
        candidate = trial is not None and trial.routed and trial.server.state == "ready"
        return not others and not candidate

    # -- the router's supervision --------------------------------------------------------------
    def _tend_router(self, now: float, stop: threading.Event) -> bool:
        """One look at the router: its death or hang noticed and its restart planned (with
        back-off) or started; False once it is given up."""
        if self.router is None or (
            self._router_action is not None and self._router_action.is_alive()
        ):
            return True
        if self.router_running:
            if self._router_up_since is None and self._router_ready.is_set():
                self._router_up_since = now
            if self._router_up_since is not None and now - self._router_up_since >= STABLE_S:
                self._router_crashes = 0
            live = self._router_live
            j = live.judgement if live is not None else Judgement(OK)
            if self._router_ready.is_set() and j.verdict != self._router_said:
                self._router_said = j.verdict
                if j.verdict == DEGRADED:
                    self._router_event(StateEvent("degraded", reason=j.why))
                elif j.verdict == OK:
                    self._router_event(StateEvent("ready", url=self.spec.router.url))
            if self._router_ready.is_set() and j.verdict == HUNG:
                self._router_event(StateEvent("hung", reason=j.why))
                signal_group(self.router.pid, signal.SIGKILL)  # its death follows: restarted
                signal_group(self.router.pid, signal.SIGCONT)
                self._router_ready.clear()
            return True
        if not self._router_seen_down:
            self._router_seen_down, self._router_up_since = True, None
            self._router_ready.clear()
            code = self.router.poll()
            tail = self.router_log.read_text(errors="replace").splitlines()[-20:]
            how = f"killed by signal {-code}" if code is not None and code < 0 else f"code {code}"
            reason = f"the router exited ({how})"
            self._router_event(StateEvent("crashed", exit_code=code, reason=reason, log_tail=tail))
            self._router_crashes += 1
            gave_up = self._router_crashes > ROUTER_LIMIT
            delay = ROUTER_DELAYS[min(self._router_crashes, len(ROUTER_DELAYS)) - 1]
            self._router_event(RestartEvent(self._router_crashes, delay, gave_up=gave_up))
            if gave_up:
                self.failure = f"router: {reason}, {self._router_crashes} times in a row"
                return False
            self._router_restart_at = now + delay
        if self._router_restart_at is not None and now >= self._router_restart_at:
            self._router_restart_at = None
            workers = sorted(self.wanted_workers())

            def restart() -> None:
                if self._stopping:
                    return
                try:
                    self.start_router(stop, workers=workers)
                except ServerError as e:  # counted as its death on the next look
                    log.info("router restart failed: %s", e)

            self._router_action = threading.Thread(
                target=restart, name="fleet-router-restart", daemon=True
            )
            self._router_action.start()
        return True

    def _serving(self, inst: InstanceSpec) -> bool:
        """Remote (always), or ready and not hung."""
        if inst.url_ is not None:
            return True
        t = self._tended.get(inst.name)
        return self.servers[inst.name].state == "ready" and (t is None or t.hung_since is None)

    def _ready_primaries(self) -> list[InstanceSpec]:
        return [i for i in self.spec.instances if i.role == "primary" and self._serving(i)]

    def wanted_workers(self) -> dict[str, str]:
        """The workers the router should have now, each with why: the primaries that are
        ready (remote ones always); the backups while the fallback is active or no primary is
        ready."""
        primaries = self._ready_primaries()
        active = self.fallback is not None and self.fallback.active
        backups_on = active or not primaries
        wanted = {i.url: "ready" for i in primaries}
        for i in self.spec.instances if backups_on else []:
            if i.role == "backup" and self._serving(i):
                wanted[i.url] = "fallback" if active else "no primary ready"
        trial = self.trial
        if trial is not None:
            if trial.retiring:
                wanted.pop(trial.inst.url, None)
            if trial.routed and trial.server.state == "ready":
                wanted[trial.url] = "trial"
        if not wanted:  # the last that serves is kept, hung or not: else nothing would serve
            for i in self.spec.local:
                t = self._tended.get(i.name)
                if i.url in self._routed and t is not None and t.server.state == "ready":
                    wanted[i.url] = f"hung ({t.hung_why}), but the last instance that serves"
        return wanted

    def sync_routes(self) -> None:
        """Add to the router what should serve and is missing; remove what should not."""
        wanted = self.wanted_workers()
        by_url = {i.url: i for i in self.spec.instances}
        for url in sorted(self._routed - set(wanted)):
            inst = by_url.get(url)
            if inst is None:  # a trial's candidate (or an incumbent promoted away)
                self._route("remove", url, "trial")
                continue
            state = self.servers[inst.name].state if inst.name in self.servers else "ready"
            t = self._tended.get(inst.name)
            if state == "ready" and t is not None and t.hung_since is not None:
                state = f"hung: {t.hung_why}"
            trial = self.trial
            if trial is not None and trial.retiring and url == trial.inst.url:
                state = "trial: promoting the candidate"
            reason = state if state != "ready" else "recovered"
            self._route("remove", url, reason)
        for url in sorted(set(wanted) - self._routed):
            self._route("add", url, wanted[url])

    def _route(self, action: str, url: str, reason: str) -> None:
        """One change of the router's workers; one the router refused is tried again after
        ROUTE_RETRY_S (one event per try, not one per look)."""
        if time.monotonic() < self._route_retry.get((action, url), 0.0):
            return
        try:
            if action == "add":
                self.router_api.add_worker(url)
                self._routed.add(url)
            else:
                self.router_api.remove_worker(url)
                self._routed.discard(url)
        except ServerError as e:
            self._route_retry[(action, url)] = time.monotonic() + ROUTE_RETRY_S
            self._router_event(RouteEvent(action, url, reason, ok=False, error=str(e)))
            return
        self._route_retry.pop((action, url), None)
        self._router_event(RouteEvent(action, url, reason))

    def router_facts(self) -> dict[str, Any]:
        """The router's own view: its workers with health, load and circuit state, and its
        request, retry and error counts (from its Prometheus port and ``/get_loads``)."""
        if self._metrics_port is None:
            return {}
        return self.router_api.facts(f"http://127.0.0.1:{self._metrics_port}/metrics")

    # -- one instance at a time (the panel's buttons) ----------------------------------------
    def stop_instance(self, name: str) -> None:
        """Stop one instance (the router drops it on the loop's next look); no restart."""
        t = self._tended[name]
        t.restart_at = None
        t.server.stop()

    def start_instance(self, name: str) -> None:
        """Start a stopped or crashed instance again (the router gets it once it is ready)."""
        t = self._tended[name]
        t.restart_at, t.crash_seen, t.crashes = None, False, 0
        if t.server.running:
            return
        t.server.stop()
        t.server.start()

    def restart_instance(self, name: str) -> None:
        self.stop_instance(name)
        self.start_instance(name)

    # -- live trials ---------------------------------------------------------------------------
    def start_trial(self, name: str, cfg: LaunchConfig, opts: TrialOptions) -> LiveTrial:
        """Admit and start a live trial of instance ``name`` against ``cfg`` (its events come
        as the instance's): refused (ConfigError, one line, nothing started) when another trial
        runs, the instance is not a local primary that serves, or the candidate does not fit
        beside the fleet (the planner's figures)."""
        with self._trial_lock:
            if self.trial is not None and not self.trial.done.is_set():
                raise ConfigError(f"a trial of '{self.trial.name}' is under way: one at a time")
            inst = next((i for i in self.spec.instances if i.name == name), None)
            if inst is None:
                names = ", ".join(i.name for i in self.spec.instances)
                raise ConfigError(f"no instance '{name}' in this fleet (it has {names})")
            if inst.cfg is None or inst.role != "primary":
                raise ConfigError(
                    f"instance '{name}': a trial is of a primary that Quantdeck starts"
                )
            if self.servers[name].state != "ready" or not self._router_ready.is_set():
                raise ConfigError(f"instance '{name}' does not serve now: try it once it does")
            cfg = validate(cfg.copy())
            admitted = admit_candidate(self.spec, inst, cfg, asleep=self._asleep())
            trial = self._trial(inst, cfg, opts)
        trial.start(admitted)
        return trial

    def _trial(
        self, inst: InstanceSpec, cfg: LaunchConfig, opts: TrialOptions, **kw: Any
    ) -> LiveTrial:
        trial = LiveTrial(
            inst,
            cfg,
            opts,
            emit=self._events.emit,
            promote=self._promote,
            routed_now=lambda url: url in self._routed,
            nice=self.nice,
            startup_timeout=self.startup_timeout,
            **kw,
        )
        self.trial = trial
        return trial

    def _asleep(self) -> dict[int, list[tuple[str, int]]]:
        """The sleeping retired incumbents' GPU memory (NVML, when they fell asleep), per GPU:
        what a candidate's admission counts beside the fleet."""
        held: dict[int, list[tuple[str, int]]] = {}
        for name, r in self.retired.items():
            if r.server is not None:
                for gpu, used in (r.residual or {}).items():
                    held.setdefault(gpu, []).append((name + RETIRED + " (asleep)", used))
        return held

    def undo(self, name: str) -> LiveTrial:
        """Undo the last promotion of instance ``name``: its launch from before back without
        downtime, as a trial that promotes as soon as it serves: woken up where it sleeps
        (seconds), else started beside the instance (a start-up). Refused (ConfigError, one
        line) when a trial runs or nothing was promoted."""
        with self._trial_lock:
            if self.trial is not None and not self.trial.done.is_set():
                raise ConfigError(f"a trial of '{self.trial.name}' is under way: one at a time")
            inst = next((i for i in self.spec.instances if i.name == name), None)
            before = self.retired.get(name)
            if inst is None or inst.cfg is None or before is None:
                raise ConfigError(f"instance '{name}' has no promotion to undo in this fleet")
            if self.servers[name].state != "ready" or not self._router_ready.is_set():
                raise ConfigError(f"instance '{name}' does not serve now: undo it once it does")
            asleep = before.server
            if asleep is not None and asleep.state == "ready":
                admitted = f"the launch before ({before.promotion}) sleeps: a wake-up"
                self._forwards.pop(id(asleep), lambda: None)()  # the trial forwards it now
            else:
                asleep = None
                admitted = admit_candidate(self.spec, inst, before.cfg, asleep=self._asleep())
            del self.retired[name]
            opts = TrialOptions(keep_s=self._keep_s)
            trial = self._trial(
                inst,
                before.cfg,
                opts,
                undo=f"undo of the promotion ({before.promotion})",
                asleep=asleep,
            )
        trial.start(admitted)
        return trial

    def _promote(self, trial: LiveTrial) -> str:
        """The candidate becomes the instance: the incumbent out of the router, drained and
        stopped; the instance's launch is the candidate's from now (restarts included) and its
        profile is saved. Returns where it was saved (one line)."""
        inst, t = trial.inst, self._tended[trial.name]
        old, old_url = t.server, inst.url
        trial.retiring = True
        if trial.wait_routes(old_url, False):
            drain(old_url, inst.api_key, trial.opts.drain_timeout_s)
        with self._trial_lock:
            inst.cfg = trial.server.cfg.copy()
            t.server = self.servers[trial.name] = trial.server
            t.up_since, t.crashes, t.crash_seen, t.restart_at = None, 0, False, None
            t.hung_since = None
            trial.label = trial.name  # its events are the instance's from now
            trial.routed = trial.retiring = False  # its URL is the instance's: a primary's
            self._forwards[id(trial.server)] = trial.forward
        self._keep_s = trial.opts.keep_s
        kept = self._retire(trial, old)
        saved = self._save_profile(inst, trial) + "; " + kept
        if self._state_lock is not None:
            write_atomic(state_path(), json.dumps(self._state()))
        return saved

    _keep_s = TrialOptions().keep_s  # the last trial's: an undo keeps what it retires as long

    def _retire(self, trial: LiveTrial, old: ServerProcess) -> str:
        """The promoted-over incumbent, kept for ``fleet undo``: asleep for ``keep_s`` where
        it runs with sleep mode (its events become instance ``NAME~before``), else stopped
        (its launch kept). One line saying which."""
        name = trial.name
        diff = ", ".join(f"{k} {a!r} -> {b!r}" for k, (a, b) in trial.knobs.items()) or "same"
        earlier = self.retired.pop(name, None)
        if earlier is not None and earlier.server is not None:
            earlier.server.stop()  # one launch kept per instance: the last one
        before = Retired(trial.incumbent_cfg.copy(), diff)
        self.retired[name] = before
        keep = trial.opts.keep_s
        if not old.cfg.model.enable_sleep_mode:
            why = "it runs without sleep mode"
        elif keep <= 0:
            why = "--keep 0"
        else:
            try:
                slept = sleep_server(old.url, old.cfg.server.api_key)
            except ServerError as e:
                why = f"it did not sleep: {e}"
            else:
                self._forwards.pop(id(old), lambda: None)()
                self._forwards[id(old)] = old.subscribe(
                    lambda ev: self._events.emit(InstanceEvent(name + RETIRED, ev))
                )
                before.server, before.slept_s = old, slept
                before.until = time.monotonic() + keep
                before.residual = _gpu_memory(old, trial.inst.gpus or [])
                held = ", ".join(
                    f"{b / 2**30:.2f} GiB of GPU {g}" for g, b in (before.residual or {}).items()
                )
                return (
                    f"the incumbent sleeps for {keep:g} s (asleep in {slept:.1f} s"
                    f"{', holding ' + held if held else ''}): `fleet undo` wakes it up"
                )
        old.stop()
        return f"the incumbent stopped ({why}): `fleet undo` starts its launch again"

    def _expire(self, now: float) -> None:
        """Stop the sleepers whose time is up (their launch stays, for an undo by start)."""
        for r in self.retired.values():
            if r.server is not None and now >= r.until:
                server, r.server = r.server, None
                threading.Thread(target=server.stop, name="fleet-stop-retired").start()

    def _save_profile(self, inst: InstanceSpec, trial: LiveTrial) -> str:
        """The promoted launch saved: over the instance's profile file (atomically; the one
        before kept beside it), or beside the fleet file when its profile is inline (the fleet
        file is never rewritten). One line saying where."""
        cfg = trial.server.cfg.copy()
        cfg.server.port = trial.incumbent_cfg.server.port  # the port the fleet gives it
        try:
            version = trial.server.engine.version()[1]
            text = f"# saved with vLLM {version}\n" + to_yaml(cfg)
        except QuantdeckError:
            text = to_yaml(cfg)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        try:
            if inst.profile_file is not None:
                path = inst.profile_file
                kept = path.with_name(f"{path.name}.before-trial-{stamp}")
                private = path.stat().st_mode & 0o077 == 0
                write_atomic(kept, path.read_text(encoding="utf-8"), replace=False)
                write_atomic(path, text, private=private)
                return f"profile {path} replaced (the one before: {kept})"
            path = self.spec.path.with_name(f"{self.spec.path.stem}.{inst.name}.{stamp}.yaml")
            write_atomic(path, text, replace=False)
        except OSError as e:
            return f"the promoted launch serves, but its profile was not saved: {e}"
        return (
            f"the fleet file's profile of '{inst.name}' is inline and was left as it is; the "
            f"promoted one is saved as {path} (name it as the instance's profile to keep it)"
        )

    # -- stop --------------------------------------------------------------------------------
    def stop(self) -> None:
        """The router first (no request goes to a stopping instance), then every instance,
        side by side; nothing of the fleet runs afterwards. A restart under way ends first
        (its start is refused from now on)."""
        self._stopping = True
        if self.control is not None:
            self.control.close()
        trial = self.trial
        aborted = trial is not None and not trial.done.is_set()
        if trial is not None and aborted:  # its candidate stops beside the instances, below
            trial.abort("the fleet stops", wait=False)
        actions = [t.action for t in self._tended.values()] + [self._router_action]
        for a in actions:
            if a is not None:
                a.join(timeout=60)
        if self.router is not None:
            self._stop_router(self.router)
        self.sampler.close()
        asleep = [(n + RETIRED, r.server) for n, r in self.retired.items() if r.server]
        candidate = [(trial.label, trial.server)] if trial is not None and aborted else []
        threads = [
            threading.Thread(target=s.stop, name=f"fleet-stop-{name}")
            for name, s in [*self.servers.items(), *asleep, *candidate]
            if s.pid is not None
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if trial is not None and aborted:
            trial.wait(5)  # its decision said (a probe request still out is not waited for)

    def _stop_router(self, proc: Child) -> None:
        pids = {proc.pid}
        try:
            pids |= {c.pid for c in psutil.Process(proc.pid).children(recursive=True)}
        except psutil.Error:
            pass
        running = proc.poll() is None
        if running:
            self._router_event(StateEvent("stopping"))
        for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
            if proc.poll() is not None and not alive_pids(pids):
                break
            signal_group(proc.pid, sig)
            try:
                proc.wait(timeout=wait)
            except subprocess.TimeoutExpired:
                pass
        if running:
            self._router_event(StateEvent("stopped", exit_code=proc.returncode))

    # -- the state file ----------------------------------------------------------------------
    _state_lock: IO[bytes] | None = None  # fleet/state.lock, held (flock) while it runs

    def write_state(self) -> None:
        """Say that this fleet runs (``fleet/state.json``, for ``fleet status`` and ``fleet
        down``), under the fleet's lock: an exclusive ``flock`` on ``fleet/state.lock``, taken
        here and held until :meth:`clear_state` or this process's end (the kernel lets it go
        then, kill -9 included). Of two ``fleet up`` that both found no fleet running, the
        second is refused here. The fleet's folder is made private (0700; the router's log
        in it 0600: its lines hold requests)."""
        folder = state_path().parent
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        folder.chmod(0o700)
        took = self._state_lock is None
        if took:
            lock = open(folder / "state.lock", "ab")  # noqa: SIM115 (held for the fleet's life)
            try:
                fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:  # BlockingIOError: another fleet holds it
                lock.close()
                raise ServerError(_ANOTHER_FLEET) from None
            self._state_lock = lock
        try:
            other = running_fleet()  # one whose Quantdeck took no lock (an older one)
            if other is not None and other.get("pid") != os.getpid():
                raise ServerError(_ANOTHER_FLEET)
            log_fd = os.open(self.router_log, os.O_WRONLY | os.O_CREAT, 0o600)
            try:
                os.fchmod(log_fd, 0o600)  # start_router writes into it, keeping its mode
            finally:
                os.close(log_fd)
            write_atomic(state_path(), json.dumps(self._state()))
        except BaseException:
            if took and self._state_lock is not None:  # refused: the lock goes, no file
                self._state_lock.close()
                self._state_lock = None
            raise

    def _state(self) -> dict[str, Any]:
        """What the state file says: this process, the fleet file, the router, each instance
        with its launch knobs as they run now (secrets never), the control socket."""
        me = psutil.Process()
        return {
            "pid": me.pid,
            "create_time": me.create_time(),
            "file": str(self.spec.path.expanduser().absolute()),  # `fleet status FILE`
            "router": self.spec.router.url,
            "control": getattr(self.control, "address", None),
            "instances": [
                {
                    "name": i.name,
                    "url": i.url,
                    "role": i.role,
                    **({"knobs": to_dict(i.cfg)} if i.cfg is not None else {}),
                }
                for i in self.spec.instances
            ],
        }

    def clear_state(self) -> None:
        """Remove the state file and let the lock go: only the fleet that holds the lock
        (one refused by :meth:`write_state` never removes the running fleet's file)."""
        if self._state_lock is None:
            return
        state_path().unlink(missing_ok=True)
        self._state_lock.close()  # the flock goes with it
        self._state_lock = None


def _gpu_memory(server: ServerProcess, gpus: list[int]) -> dict[int, int] | None:
    """What ``server``'s processes hold on each of ``gpus`` (NVML); None without NVML."""
    from quantdeck.core.monitor.telemetry import read_gpu

    pids = tree_pids(server.pid)
    held: dict[int, int] = {}
    for g in gpus:
        used = read_gpu(g, frozenset(pids)).server_memory_bytes
        if isinstance(used, int):
            held[g] = used
    return held or None


def running_fleet() -> dict[str, Any] | None:
    """The state of the fleet running from this cache folder, or None (a stale file, whose
    owner is gone, is removed)."""
    path = state_path()
    if not path.exists():
        return None
    data = load_json(read_bounded(path, 2**20, "fleet state"), str(path))
    f = Fields(data, str(path))
    pid = f.integer("pid", lo=1, required=True)
    started = f.number("create_time", required=True)
    f.text("router", required=True)
    f.items("instances", max_len=1000, required=True)
    try:
        alive = abs(psutil.Process(pid).create_time() - (started or 0)) < 0.05
    except psutil.Error:
        alive = False
    if not alive:
        path.unlink(missing_ok=True)
        return None
    return f.data


def stop_running_fleet(timeout: float = 120.0) -> bool:
    """SIGTERM to the running fleet's ``fleet up``; True once it has gone (or none ran)."""
    state = running_fleet()
    if state is None:
        return True
    pid = int(state["pid"])
    try:
        os.kill(pid, signal.SIGTERM)
        psutil.Process(pid).wait(timeout)
    except (ProcessLookupError, psutil.NoSuchProcess):
        pass
    except psutil.TimeoutExpired:
        return False
    return True


def probe(url: str, timeout: float = 2.0, api_key: str | None = None) -> str:
    """``ready`` when ``url``'s ``/health`` answers 200 within ``timeout`` seconds (sent
    ``api_key`` where given), else ``down``. vLLM's /health wants no key; a keyed router's
    does: asked without a key, its 401 counts as ready (it answered; ``fleet status`` in
    another shell does not know the key)."""
    try:
        r = httpx.get(url.rstrip("/") + "/health", headers=auth_headers(api_key), timeout=timeout)
    except httpx.HTTPError:
        return "down"
    return "ready" if r.status_code == 200 or (r.status_code == 401 and not api_key) else "down"
