"""The fleet at run time: its instances (one :class:`ServerProcess` each) behind vLLM's router.

The router is the ``vllm-router`` package's launcher, started by :func:`spawn` (its own group,
dies with us, leased) once the instances are ready, with the primaries as its workers (the
backups start and wait: the SLA fallback adds them). Every event of an instance reaches the
observers as an :class:`InstanceEvent` carrying its name; the router's are instance
``"router"``. A small state file in the cache folder lets ``fleet status`` and ``fleet down``
in another shell find the running fleet.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil

from quantdeck.core.errors import QuantdeckError, ServerError
from quantdeck.core.events import (
    Event,
    FactEvent,
    InstanceEvent,
    Publisher,
    RestartEvent,
    RouteEvent,
    StateEvent,
)
from quantdeck.core.fleet.router import FallbackJudge, RouterClient
from quantdeck.core.fleet.rows import FleetRows, InstanceSampler
from quantdeck.core.fleet.spec import ROUTER, FleetSpec, InstanceSpec
from quantdeck.core.models import ModelInfo
from quantdeck.core.paths import cache_dir, write_atomic
from quantdeck.core.procs import Child, own_python, signal_group, spawn, subprocess_env
from quantdeck.core.runtime import EngineEnv, ServerProcess
from quantdeck.core.runtime.server import alive_pids, free_port, port_free
from quantdeck.core.schema import Fields, load_json, read_bounded

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
# The router's launcher, with the API key from the environment put into its arguments inside
# the process: another user can read a process's argv in /proc, not its environment.
_KEY_ENV = "QUANTDECK_ROUTER_API_KEY"
_LAUNCH = (
    "import os, sys; from vllm_router.launch_router import main; "
    f"key = os.environ.pop('{_KEY_ENV}', ''); "
    "sys.argv[1:] += ['--api-key', key] if key else []; main()"
)


def router_command_workers(spec: FleetSpec) -> list[str]:
    """The workers the router starts with: the primaries."""
    return [i.url for i in spec.instances if i.role == "primary"]


def state_path() -> Path:
    """Where the running fleet says what it is (one fleet per cache folder)."""
    return cache_dir() / "fleet" / "state.json"


def router_command(
    spec: FleetSpec, python: str | None = None, *, metrics_port: int | None = None
) -> list[str]:
    """The router's command line: the primaries as its workers, the fleet file's settings,
    its Prometheus exposition on loopback at ``metrics_port`` (default: the file's)."""
    r = spec.router
    workers = router_command_workers(spec)
    port = metrics_port or r.metrics_port
    return [
        python or own_python(),
        "-c",
        _LAUNCH,
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


class Fleet:
    """Start, watch and stop one fleet."""

    def __init__(
        self, spec: FleetSpec, *, startup_timeout: float | None = None, nice: int = 0
    ) -> None:
        """``nice``: run the instances this much nicer (the panel keeps its UI responsive)."""
        self.spec = spec
        self.servers: dict[str, ServerProcess] = {
            i.name: self._server(i, startup_timeout, nice) for i in spec.local
        }
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
        server.subscribe(lambda ev: self._events.emit(InstanceEvent(inst.name, ev)))
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
        self, stop: threading.Event | None = None, timeout: float = ROUTER_READY_S
    ) -> None:
        """Start the router and wait for its ``/health`` (or ``stop``); ServerError when it
        does not come."""
        r = self.spec.router
        self._check_router_port()
        self._metrics_port = r.metrics_port or free_port()
        cmd = router_command(self.spec, metrics_port=self._metrics_port)
        self._router_event(StateEvent("starting", command=cmd))
        self.router_log.parent.mkdir(parents=True, exist_ok=True)
        env = subprocess_env({_KEY_ENV: r.api_key} if r.api_key else {})
        with open(self.router_log, "w", encoding="utf-8") as log:
            self.router = spawn(
                cmd,
                kind="vLLM router",
                port=r.port,
                deathsig=signal.SIGTERM,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
            )
        self._router_event(FactEvent("pid", self.router.pid))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not (stop and stop.is_set()):
            if self.router.poll() is not None:
                break
            if self.router_healthy():
                self._routed = set(router_command_workers(self.spec))
                self._router_event(StateEvent("ready", url=r.url))
                self._router_event(FactEvent("workers", self.workers()))
                return
            time.sleep(0.3)
        if stop and stop.is_set():
            return
        tail = self.router_log.read_text(errors="replace").splitlines()[-20:]
        self._router_event(
            StateEvent("crashed", exit_code=self.router.poll(), reason="not ready", log_tail=tail)
        )
        raise ServerError(f"router: not ready after {timeout:g} s (log: {self.router_log})")

    def router_healthy(self) -> bool:
        return probe(self.spec.router.url) == "ready"

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

        check_fleet(self.spec)
        self._router_event(FactEvent("fleet", self.describe()))
        if running_fleet() is not None:
            raise ServerError("a fleet already runs from this cache folder: `quantdeck fleet down`")
        if stop.is_set():  # stopped while it was checked: start nothing
            return True
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
        """Keep the fleet serving until ``stop``: restart crashed instances (``restart:
        on-failure``, with back-off), keep the router's workers in step with the instances
        that are ready, apply the fallback rule, report the router's facts. False when the
        router itself has gone."""
        next_sample = next_facts = 0.0
        last_facts: dict[str, Any] | None = None
        while not stop.is_set():
            if not self.router_running:
                return False
            now = time.monotonic()
            for t in self._tended.values():
                self._tend(t, now)
            if now >= next_sample:
                next_sample = now + SAMPLE_S
                self.sample(now)
            self.sync_routes()
            if now >= next_facts:
                next_facts = now + FACTS_S
                facts = self.router_facts()
                if facts and facts != last_facts:
                    self._router_event(FactEvent("router", facts))
                    last_facts = facts
            stop.wait(TICK_S)
        return True

    def sample(self, now: float) -> None:
        """Scrape the instances that serve (and every remote one), report each one's figures
        as a ``metrics`` event, and judge the fallback rule on the primaries'."""
        targets = [
            (i.name, i.url, i.api_key)
            for i in self.spec.instances
            if i.url_ is not None or self.servers[i.name].state == "ready"
        ]
        self.sampler.forget({url for _, url, _ in targets})
        samples = self.sampler.sample(targets)
        for name, ev in samples.items():
            self._events.emit(InstanceEvent(name, ev))
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

    def _tend(self, t: _Tended, now: float) -> None:
        """One look at an instance: a crash counted and its restart planned, a restart due
        started, a stay long enough to forgive the earlier crashes."""
        state = t.server.state
        if state == "ready":
            t.up_since = t.up_since or now
            if now - t.up_since >= STABLE_S:
                t.crashes = 0
        elif state == "crashed" and not t.crash_seen:
            t.crash_seen, t.up_since = True, None
            if t.spec.restart == "on-failure":
                t.crashes += 1
                gave_up = t.crashes > RESTART_LIMIT
                delay = RESTART_DELAYS[min(t.crashes, len(RESTART_DELAYS)) - 1]
                t.restart_at = None if gave_up else now + delay
                ev = RestartEvent(t.crashes, 0.0 if gave_up else delay, gave_up=gave_up)
                self._events.emit(InstanceEvent(t.spec.name, ev))
        if t.restart_at is not None and now >= t.restart_at:
            t.restart_at, t.crash_seen = None, False
            t.server.stop()  # what is left of the crashed one (nothing, as a rule)
            try:
                t.server.start()
            except QuantdeckError as e:  # a port taken meanwhile...: a crash like another
                self._events.emit(InstanceEvent(t.spec.name, StateEvent("crashed", reason=str(e))))

    def _ready_primaries(self) -> list[InstanceSpec]:
        return [
            i
            for i in self.spec.instances
            if i.role == "primary" and (i.url_ is not None or self.servers[i.name].state == "ready")
        ]

    def wanted_workers(self) -> dict[str, str]:
        """The workers the router should have now, each with why: the primaries that are
        ready (remote ones always); the backups while the fallback is active or no primary is
        ready."""
        primaries = self._ready_primaries()
        active = self.fallback is not None and self.fallback.active
        backups_on = active or not primaries
        wanted = {i.url: "ready" for i in primaries}
        for i in self.spec.instances if backups_on else []:
            if i.role == "backup" and (i.url_ is not None or self.servers[i.name].state == "ready"):
                wanted[i.url] = "fallback" if active else "no primary ready"
        return wanted

    def sync_routes(self) -> None:
        """Add to the router what should serve and is missing; remove what should not."""
        wanted = self.wanted_workers()
        by_url = {i.url: i for i in self.spec.instances}
        for url in sorted(self._routed - set(wanted)):
            inst = by_url[url]
            state = self.servers[inst.name].state if inst.name in self.servers else "ready"
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

    # -- stop --------------------------------------------------------------------------------
    def stop(self) -> None:
        """The router first (no request goes to a stopping instance), then every instance,
        side by side; nothing of the fleet runs afterwards."""
        if self.router is not None:
            self._stop_router(self.router)
        self.sampler.close()
        threads = [
            threading.Thread(target=s.stop, name=f"fleet-stop-{name}")
            for name, s in self.servers.items()
            if s.pid is not None
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

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
    def write_state(self) -> None:
        me = psutil.Process()
        state = {
            "pid": me.pid,
            "create_time": me.create_time(),
            "file": str(self.spec.path.expanduser().absolute()),  # `fleet status FILE` checks
            "router": self.spec.router.url,
            "instances": [
                {"name": i.name, "url": i.url, "role": i.role} for i in self.spec.instances
            ],
        }
        write_atomic(state_path(), json.dumps(state))

    def clear_state(self) -> None:
        state_path().unlink(missing_ok=True)


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


def probe(url: str) -> str:
    """``ready`` when ``url``'s ``/health`` (open without a key, on vLLM and the router)
    answers 200, else ``down``."""
    try:
        code = httpx.get(url.rstrip("/") + "/health", timeout=2).status_code
    except httpx.HTTPError:
        return "down"
    return "ready" if code == 200 else "down"
