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
from pathlib import Path
from typing import IO, Any

import psutil

from quantdeck.core.errors import QuantdeckError, ServerError
from quantdeck.core.events import (
    AdviceEvent,
    Event,
    FactEvent,
    InstanceEvent,
    Publisher,
    StateEvent,
)
from quantdeck.core.fleet.live import LiveTrial
from quantdeck.core.fleet.liveness import (
    OK,
    Liveness,
    look_at,
    read_pressure,
)
from quantdeck.core.fleet.roles import ROUTER
from quantdeck.core.fleet.router import FallbackJudge, RouterClient
from quantdeck.core.fleet.router_keeper import RouterKeeping
from quantdeck.core.fleet.rows import FleetRows, InstanceSampler
from quantdeck.core.fleet.spec import FleetSpec, InstanceSpec
from quantdeck.core.fleet.tending import RESTART_DELAYS, RESTART_LIMIT, InstanceTending, _Tended
from quantdeck.core.fleet.trials import RETIRED, FleetTrials, Retired
from quantdeck.core.launch import to_dict
from quantdeck.core.models import ModelInfo
from quantdeck.core.paths import cache_dir, write_atomic
from quantdeck.core.procs import Child, signal_group, spawn, subprocess_env, worker_command
from quantdeck.core.runtime import EngineEnv, ServerProcess
from quantdeck.core.runtime.server import STARTUP_TIMEOUT_S, free_port, port_free
from quantdeck.core.schema import Fields, load_json, read_bounded

log = logging.getLogger(__name__)

ROUTER_READY_S = 60.0
TICK_S = 0.25  # the fleet loop's look at its instances
SAMPLE_S = 1.0  # the instances' metrics scraped (and the fallback rule judged)
METRICS_WINDOW_S = 60.0  # their quantiles' window, where no fallback rule sets one
FACTS_S = 5.0  # the router's facts, reported when they change
# The router's launcher (quantdeck.core.workers.router) takes the API key from this variable
# (another user can read a process's argv in /proc, not its environment) and, given one, has
# the router ask it on every route, /health included.
ROUTER_KEY_ENV = "QUANTDECK_ROUTER_API_KEY"


_ANOTHER_FLEET = "a fleet already runs from this cache folder: `quantdeck fleet down`"


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


class Fleet(RouterKeeping, InstanceTending, FleetTrials):
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

    def wait_ready(self, stop: threading.Event, timeout: float | None = None) -> bool:
        """Block until every instance is ready (True). Meanwhile each start is tended as
        later ones are (:meth:`_tend`): told every STARTING_EVERY_S, and a crash (its start-up
        limit included) restarted with back-off under ``restart: on-failure``. False, with
        :attr:`failure` saying why, when one crashed for good (``restart: "no"``, or the
        restarts given up) or stopped; False on ``stop``, or after ``timeout`` seconds
        (default: the start-up limit for each restart allowed, with their delays)."""
        if timeout is None:
            limit = self.startup_timeout or STARTUP_TIMEOUT_S
            timeout = (RESTART_LIMIT + 1) * limit + sum(RESTART_DELAYS)
        deadline = time.monotonic() + timeout
        while not stop.is_set() and time.monotonic() < deadline:
            self._start_due()
            now = time.monotonic()
            for name, t in self._tended.items():
                if name not in self._queued:
                    self._tend(t, now)
            down = self._down_for_good()
            if down is not None:
                self.failure = down
                return False
            states = {s.state for n, s in self.servers.items() if n not in self._queued}
            if states <= {"ready"} and not self._queued:
                return True
            stop.wait(0.2)
        if not stop.is_set():
            self.failure = f"the instances were not all ready in {timeout:.0f} s"
        return False

    def _down_for_good(self) -> str | None:
        """An instance that will not come up (why, in one line), while the fleet starts."""
        for name, t in self._tended.items():
            if name in self._queued or t.acting:
                continue
            state = t.server.state
            waiting = t.restart_at is not None
            if state == "stopped" or (state == "crashed" and not waiting):
                why = t.server.crash_reason or state
                if t.spec.restart == "on-failure" and t.crashes > RESTART_LIMIT:
                    why += f"; restart given up after {RESTART_LIMIT} in a row"
                return f"{name}: {why}"
        return None

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

    # -- the state file ----------------------------------------------------------------------
    def _save_state(self) -> None:
        """The state file written again (the knobs changed), while the fleet holds it."""
        if self._state_lock is not None:
            write_atomic(state_path(), json.dumps(self._state()))

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
