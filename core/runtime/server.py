"""The vLLM server as a supervised subprocess.

One launcher for every vLLM (``python -m quantdeck.core.workers.engine``, see there), its
command line and environment from the launch plan (:func:`quantdeck.core.launch.launch_plan`),
started by :func:`quantdeck.core.procs.spawn` (its own process group, dies with us, leased); a
reader thread that turns the log into states and facts (:mod:`.log_reading`), a watcher that
declares it ready or crashed (:mod:`.watch`), and a stop that escalates SIGINT -> SIGTERM ->
SIGKILL over the whole group and leaves no process behind; what a server leaves (run folders,
its TMPDIR, shared memory) is :mod:`.debris`'s. Observers receive typed events
(core/events.py); nothing here knows about Qt."""

from __future__ import annotations

import collections
import logging
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

import quantdeck.core.runtime.server_log as sl
from quantdeck.core.errors import ConfigError, ServerError
from quantdeck.core.events import (
    AdviceEvent,
    Event,
    FactEvent,
    PlanEvent,
    Publisher,
    StateEvent,
)
from quantdeck.core.http import auth_headers, tls_verify
from quantdeck.core.launch import (
    DeviceFacts,
    Finding,
    KvPlan,
    LaunchConfig,
    LaunchPlan,
    advise,
    cpu_device,
    detect_device,
    errors,
    launch_plan,
    plan,
    validate,
    with_ray,
)
from quantdeck.core.launch.command import (
    MULTI_GPU_ENV,
    ONE_PROCESS_ENGINE_ENV,
    PROFILER_FLAG,
    PROFILES_DIR,
    kv_events_config,
    profiler_config,
)
from quantdeck.core.models import ModelInfo, inspect_model
from quantdeck.core.paths import cache_dir
from quantdeck.core.procs import Child, shm_record, spawn, subprocess_env
from quantdeck.core.runtime.debris import (
    alive_pids,
    drop_engine_tmp,
    engine_tmp_dir,
    new_run_dir,
    prune_run_dirs,
)
from quantdeck.core.runtime.engine import Capabilities, EngineEnv
from quantdeck.core.runtime.log_reading import CappedLog, LogReading, panel_access_line
from quantdeck.core.runtime.ports import base_url, free_port, port_free, url_host
from quantdeck.core.runtime.watch import Watching
from quantdeck.core.shm import ShmLedger

__all__ = [  # what other modules take from here (some made in the modules above)
    "alive_pids",
    "AttachedServer",
    "base_url",
    "CappedLog",
    "free_port",
    "lower_priority",
    "MULTI_GPU_ENV",
    "ONE_PROCESS_ENGINE_ENV",
    "panel_access_line",
    "port_free",
    "PROFILER_FLAG",
    "profiler_config",
    "PROFILES_DIR",
    "prune_run_dirs",
    "ServerProcess",
    "STARTUP_TIMEOUT_S",
    "timed_completion",
    "url_host",
    "warm_up",
]

log = logging.getLogger("quantdeck.server")
Observer = Callable[[Event], None]
LOG_TAIL = 200
# Long enough for a large model read from a slow disk, compiled and captured on first start.
STARTUP_TIMEOUT_S = 1800.0


def lower_priority(pid: int, nice: int) -> None:
    """Make a freshly started server (its own session, nothing forked yet) ``nice`` nicer,
    in both ways Linux shares the CPU: the process's niceness (inherited by the engine
    processes it starts) and, where the kernel groups a session's processes for the
    scheduler (autogroup), the niceness of the server's whole session against the others.
    The vLLM CPU engine fills every core; without this a desktop's UI thread waits up to
    seconds for a core. Best effort: a failure leaves the server as it is."""
    try:
        os.setpriority(os.PRIO_PROCESS, pid, min(19, os.getpriority(os.PRIO_PROCESS, 0) + nice))
    except OSError:
        pass
    try:
        Path(f"/proc/{pid}/autogroup").write_text(f"{nice}\n")
    except OSError:
        pass  # no autogroup (not Linux, or the kernel has it off)


class ServerProcess(LogReading, Watching):
    """One vLLM server owned by Quantdeck: start, watch, stop."""

    def __init__(
        self,
        cfg: LaunchConfig,
        *,
        engine: EngineEnv | None = None,
        capabilities: Capabilities | None = None,
        device: DeviceFacts | None = None,
        run_dir: Path | None = None,
        extra_env: dict[str, str] | None = None,
        nice: int = 0,
        startup_timeout: float | None = None,
    ) -> None:
        """``nice``: run the server this much nicer than this process (see lower_priority).
        ``startup_timeout``: seconds to become ready, after which the start has failed
        (default :data:`STARTUP_TIMEOUT_S`)."""
        self.cfg = cfg.copy()
        self.nice = nice
        self.startup_timeout = startup_timeout or STARTUP_TIMEOUT_S
        self.engine = engine or EngineEnv()
        self._caps = capabilities
        self._device = device
        # None: a folder of its own under cache_dir()/runs (pruned to the last few), made at
        # the first start that passes preflight (a refused start leaves no folder); until
        # then ``run_dir`` is where it would be
        self._own_run_dir = run_dir is None
        self.run_dir = run_dir or cache_dir() / "runs" / time.strftime("%Y%m%d-%H%M%S")
        self.extra_env = dict(extra_env or {})
        self.state = sl.STOPPED
        self.facts: dict[str, Any] = {}
        self.log_tail: collections.deque[str] = collections.deque(maxlen=LOG_TAIL)
        self.exit_code: int | None = None
        self.crash_reason = ""  # why it last crashed (one line), as its state event said
        self.info: ModelInfo | None = None
        self.plan: KvPlan | None = None
        self.findings: list[Finding] = []
        self._proc: Child | None = None
        self._events: Publisher[Event] = Publisher("server")
        self._lock = threading.RLock()
        self._ready = threading.Event()
        self._done = threading.Event()
        self._stop_requested = False
        self._engine_pids: set[int] = set()
        self._foreign_since: float | None = None  # since when another process answers
        self._threads: list[threading.Thread] = []
        self.started_at: float | None = None
        self.log_path = self.run_dir / "server.log"
        self._shm: ShmLedger | None = None  # this start's shared memory (see core/shm)
        # with cache.kv_events: vLLM's --kv-events-config of this start (also a "kv_events" fact)
        self.kv_events: dict[str, Any] | None = None
        # with server.profiler: the folder vLLM writes its traces in (also a "profiler_dir" fact)
        self.profiler_dir: Path | None = None
        # the launch plan: made by the preflight, filled in by the start (what it chose)
        self.launch: LaunchPlan | None = None

    # -- observers ---------------------------------------------------------------------------
    def subscribe(self, fn: Observer) -> Callable[[], None]:
        """Call ``fn`` with every event from now on (in the supervisor's threads); returns the
        function that unsubscribes."""
        return self._events.subscribe(fn)

    def _emit(self, ev: Event) -> None:
        self._events.emit(ev)

    def _set_state(self, state: str, *, unless: tuple[str, ...] = (), **extra: Any) -> None:
        """Go to ``state`` (and say so) unless already there or in one of ``unless``: the
        check and the change are one step, so a thread that read an older state cannot undo a
        newer one."""
        with self._lock:
            if self.state == state or self.state in unless:
                return
            self.state = state
        self._emit(StateEvent(state, **extra))

    # -- properties --------------------------------------------------------------------------
    @property
    def url(self) -> str:
        return base_url(self.cfg)

    @property
    def served_name(self) -> str:
        return self.cfg.model.served_model_name or self.cfg.model.model

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def capabilities(self) -> Capabilities:
        if self._caps is None:
            self._caps = self.engine.capabilities()
        return self._caps

    def device(self) -> DeviceFacts:
        if self._device is None:
            self._device = (
                detect_device() if self.capabilities().platform == "cuda" else cpu_device()
            )
        return self._device

    # -- start -------------------------------------------------------------------------------
    def preflight(self) -> list[str]:
        """Refuse before spawning: bad config or model, advisor errors, port taken. Makes the
        launch plan (:attr:`launch`) and returns its command line, with placeholders for the
        values the start chooses (:attr:`LaunchPlan.at_start`)."""
        caps = self.capabilities()
        # a launch on Ray: the cluster's facts (probed in the engine's Python) for the advisor
        dev = with_ray(self.device(), validate(self.cfg), python=self.engine.python)
        launch = launch_plan(
            self.cfg, caps, dev, python=self.engine.python, extra_env=self.extra_env
        )
        cfg = launch.cfg
        self.info = inspect_model(cfg.model.model)
        q = self.info.quantization
        if cfg.model.quantization == "bitsandbytes" or (
            q is not None and q.method == "bitsandbytes"
        ):
            problem = self.engine.bnb_problem()
            if problem is not None:
                raise ConfigError(problem)
        self.plan = plan(cfg, self.info, dev, vllm_version=caps.vllm_version)
        self.findings = advise(cfg, self.info, dev, self.plan)
        errs = errors(self.findings)
        if errs:
            raise ConfigError(errs[0].message)
        if not port_free(cfg.server.host, cfg.server.port):
            raise ServerError(f"port {cfg.server.port} on {cfg.server.host} is already in use")
        self.launch = launch
        return list(launch.argv)

    def start(self) -> None:
        if self.running:
            raise ServerError("the server is already running")
        self.preflight()
        assert self.launch is not None  # made by the preflight
        made = False  # the run folder, made by this start (it goes if the spawn fails)
        if self._own_run_dir:
            self.run_dir = new_run_dir()
            self.log_path = self.run_dir / "server.log"
            self._own_run_dir, made = False, True  # a restart uses it again
            prune_run_dirs(self.run_dir.parent, spare=self.run_dir)
        self.run_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        kv = self._kv_events_config() if self.launch.cfg.cache.kv_events else None
        self.launch = launch = self.launch.started(self.run_dir, engine_tmp_dir(self.run_dir), kv)
        cmd = list(launch.argv)
        # the API key goes in the environment: another user can read argv in /proc
        env = subprocess_env(launch.spawn_env())
        self.exit_code, self.crash_reason = None, ""
        self.facts = {}
        self.log_tail.clear()
        self._ready.clear()
        self._done.clear()
        self._stop_requested = False
        self._engine_pids = set()
        self._foreign_since = None
        self.started_at = time.time()
        self.kv_events = launch.kv_events
        self.profiler_dir = launch.profiler_dir
        if self.profiler_dir is not None:
            self.profiler_dir.mkdir(mode=0o700, exist_ok=True)
        self._set_state(sl.STARTING, command=cmd)
        if self.kv_events is not None:
            self.facts["kv_events"] = self.kv_events
            self._emit(FactEvent("kv_events", self.kv_events))
        if self.profiler_dir is not None:
            self.facts["profiler_dir"] = str(self.profiler_dir)
            self._emit(FactEvent("profiler_dir", str(self.profiler_dir)))
        self._emit(PlanEvent(self.plan.to_json() if self.plan else {}))
        for f in self.findings:
            self._emit(AdviceEvent(f.to_json()))
        self._shm = ShmLedger()
        try:
            self._proc = spawn(
                cmd,
                kind="vLLM server",
                port=self.cfg.server.port,
                # SIGTERM: vLLM's handler shuts down; the engine worker kills its whole group
                deathsig=signal.SIGTERM,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                text=True,
                bufsize=1,
                errors="replace",
                env=env,
                cwd=str(self.run_dir),
                umask=0o077,  # its files (traces, sockets, caches) are this user's alone
            )
        except OSError as e:
            self._drop_unstarted(made)
            self.crash_reason = str(e)
            self._set_state(sl.CRASHED, exit_code=None, reason=str(e))
            raise ServerError(f"cannot start {cmd[0]}: {e.strerror}") from None
        except BaseException:
            self._drop_unstarted(made)
            raise
        if self._proc.lease is not None:  # kept beside the lease: swept even if we die
            self._shm.record = shm_record(self._proc.lease)
        self._emit(FactEvent("pid", self._proc.pid))
        if self.nice:
            lower_priority(self._proc.pid, self.nice)
        self._threads = [
            threading.Thread(target=self._read_log, name="vllm-log", daemon=True),
            threading.Thread(target=self._watch, name="vllm-watch", daemon=True),
        ]
        for t in self._threads:
            t.start()

    def _drop_unstarted(self, made: bool) -> None:
        """Nothing started: its TMPDIR goes, and the run folder if this start made it."""
        drop_engine_tmp(self.run_dir)
        if made:
            shutil.rmtree(self.run_dir, ignore_errors=True)
            self._own_run_dir = True  # the next start makes a new one

    # -- KV events -----------------------------------------------------------------------------
    @staticmethod
    def _kv_events_config() -> dict[str, Any]:
        """vLLM's ``--kv-events-config`` for this start: its publisher connects to a free
        loopback port, where the subscriber binds (``KvEventSubscriber.for_server_config`` in
        quantdeck.core.monitor, started by whoever monitors the server on the ``kv_events``
        fact, emitted before the spawn); its replay socket binds another."""
        pub = free_port()
        replay = free_port()
        while replay == pub:
            replay = free_port()
        return kv_events_config(pub, replay)

    def stop(self, *, sigint_timeout: float = 20.0, sigterm_timeout: float = 10.0) -> int | None:
        """SIGINT, then SIGTERM, then SIGKILL to the whole group; returns the exit code."""
        if self._proc is None:
            return None
        self._stop_requested = True
        if self._proc.poll() is None:
            self._set_state(sl.STOPPING)
        pids = self._group_pids()
        for sig, wait in (
            (signal.SIGINT, sigint_timeout),
            (signal.SIGTERM, sigterm_timeout),
            (signal.SIGKILL, 10.0),
        ):
            if self._proc.poll() is not None and not alive_pids(pids):
                break
            self._kill_group(sig)
            for p in alive_pids(pids):  # a child that left the group still goes
                try:
                    os.kill(p, sig)
                except OSError:
                    pass
            # a stopped process (SIGSTOP, a debugger's) acts on its signal once continued
            self._kill_group(signal.SIGCONT)
            for p in alive_pids(pids):
                try:
                    os.kill(p, signal.SIGCONT)
                except OSError:
                    pass
            deadline = time.time() + wait
            while time.time() < deadline and (self._proc.poll() is None or alive_pids(pids)):
                time.sleep(0.1)
        self._done.wait(15)
        self.exit_code = self._proc.returncode
        if self.state != sl.STOPPED and self.state != sl.CRASHED:
            self._set_state(sl.STOPPED, exit_code=self.exit_code)
        return self.exit_code

    def restart(self, cfg: LaunchConfig | None = None, timeout: float = 300.0) -> bool:
        self.stop()
        if cfg is not None:
            self.cfg = cfg.copy()
        self.start()
        return self.wait_ready(timeout)


def timed_completion(
    url: str,
    model: str,
    *,
    api_key: str | None = None,
    prompt: str = "Hello",
    max_tokens: int = 4,
    timeout: float = 120.0,
) -> float:
    """Seconds for one short completion (the first-request latency an operator feels)."""
    t0 = time.perf_counter()
    r = httpx.post(
        url.rstrip("/") + "/v1/completions",
        headers=auth_headers(api_key),
        timeout=timeout,
        verify=tls_verify(url),
        json={"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0},
    )
    if r.status_code != 200:
        raise ServerError(f"{url}/v1/completions: HTTP {r.status_code}: {r.text[:200]}")
    return time.perf_counter() - t0


def warm_up(server: ServerProcess, n: int) -> dict[str, float]:
    """Send ``n`` warm-up requests; report the first one's latency and one after warm-up."""
    if n <= 0:
        return {}
    api_key = server.cfg.server.api_key
    first = timed_completion(server.url, server.served_name, api_key=api_key)
    for _ in range(n - 1):
        timed_completion(server.url, server.served_name, api_key=api_key)
    warm = timed_completion(server.url, server.served_name, api_key=api_key)
    facts = {"first_request_ms": round(first * 1000, 1), "warm_request_ms": round(warm * 1000, 1)}
    for k, v in facts.items():
        server.facts[k] = v
        server._emit(FactEvent(k, v))
    return facts


class AttachedServer:
    """A vLLM server somebody else runs, watched without owning it (any host, optional key)."""

    def __init__(self, url: str, *, api_key: str | None = None) -> None:
        self.url = url.rstrip("/")
        self.api_key = api_key
        self.models: list[str] = []

    def check(self, timeout: float = 5.0) -> list[str]:
        """The served model names; ServerError with one line when unreachable or refused."""
        try:
            r = httpx.get(
                self.url + "/v1/models",
                headers=auth_headers(self.api_key),
                timeout=timeout,
                verify=tls_verify(self.url),
            )
        except httpx.HTTPError as e:
            raise ServerError(f"{self.url}: unreachable ({type(e).__name__})") from None
        if r.status_code == 401:
            raise ServerError(f"{self.url}: the server wants an API key (HTTP 401)")
        if r.status_code != 200:
            raise ServerError(f"{self.url}/v1/models: HTTP {r.status_code}")
        try:
            self.models = [m["id"] for m in r.json()["data"]]
        except (ValueError, KeyError, TypeError):
            raise ServerError(f"{self.url}: not an OpenAI-compatible server") from None
        return self.models
