"""Qt side of the server: core events delivered on the UI thread, process control in workers.

:class:`QtServerController` owns at most one :class:`quantdeck.core.runtime.server.ServerProcess`
(or an attached URL), one :class:`quantdeck.core.monitor.telemetry.Sampler` and, for a server
started with kv events, a :class:`quantdeck.core.monitor.kv_events.KvFeed`. Every blocking step
(spawn, stop, HTTP) runs in a superqt worker (:mod:`quantdeck.gui.workers`); the core's callbacks
arrive on the supervisor's and the sampler's threads and are re-emitted as Qt signals, which Qt
queues onto the UI thread. Nothing here touches a widget."""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QObject, Signal

from quantdeck.core.events import Event, FactEvent, KvEvent, MetricsEvent, StateEvent
from quantdeck.core.launch import LaunchConfig

if TYPE_CHECKING:
    from quantdeck.gui.workers import WorkerSet

# The server, metrics and telemetry modules (httpx, prometheus_client, psutil) are imported
# where used: the window shows before they load.

# The servers the panel starts run this much nicer than the panel: the vLLM CPU engine keeps
# every core busy while it serves, and the UI thread, which needs little CPU but needs it
# at once, would otherwise wait for a core for up to seconds (benchmarks/gui_latency.py).
# It costs the server nothing when the panel is idle; on a GPU it hardly ever competes.
SERVER_NICE = 10


class QtServerController(QObject):
    """Start / stop / restart / attach, with every core event as the ``event`` signal."""

    # any core Event: state, fact, progress, log, advice, plan, marker (a signal that shadows
    # QObject.event(), which PySide6's stubs type as that method only); each view subscribes
    # itself to the kinds it shows (``follow(controller)``): no window relays them
    event = Signal(Event)  # type: ignore[assignment]
    state_changed = Signal(StateEvent)  # after ``event`` had it (``state``: the last one's)
    metrics = Signal(MetricsEvent)  # a sample (telemetry included)
    kv = Signal(KvEvent)  # once a second while a server started with kv events is ready
    error = Signal(str)  # one-line user-facing errors
    idle = Signal()  # the last action asked has ended

    def __init__(self, parent: QObject | None = None, *, hz: float = 2.0) -> None:
        super().__init__(parent)
        self.server: Any = None  # quantdeck.core.runtime.server.ServerProcess
        self.attached: Any = None  # quantdeck.core.runtime.server.AttachedServer
        self.sampler: Any = None  # quantdeck.core.monitor.telemetry.Sampler
        self.slo_ms: dict[str, float] = {}  # the SLOs whose attainment the metrics report
        # where vLLM writes its profiler traces: a server started with the Profiler knob says
        # so in its profiler_dir fact (None: this server cannot be profiled)
        self.profiler_dir: str | None = None
        self.engine_python: str | None = None  # the engine the next start uses (None: ours)
        self.hz = hz
        self.state = "stopped"
        self._lock = threading.Lock()
        self._workers: WorkerSet | None = None
        self._unsub: Any = None
        self._kv: Any = None  # quantdeck.core.monitor.kv_events.KvFeed, made on its first fact
        self._actions: collections.deque[Callable[[], None]] = collections.deque()

    # -- helpers -----------------------------------------------------------------------------
    def _run(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` in a worker once the actions asked before it have ended (one at a time,
        in the order asked: a double-clicked Start never spawns two servers, a Stop clicked
        while a start runs stops what it started); a failure is the ``error`` signal's line."""
        self._actions.append(fn)
        if len(self._actions) == 1:
            self._run_next()

    def _run_next(self) -> None:
        if self._workers is None:  # superqt is imported on first use: after the first paint
            from quantdeck.gui.workers import WorkerSet

            self._workers = WorkerSet(self.error.emit)
        self._workers.start(self._actions[0], finished=self._on_action_finished)

    def _on_action_finished(self) -> None:
        self._actions.popleft()
        if self._actions:
            self._run_next()
        else:
            self.idle.emit()

    def _on_core_event(self, ev: Event) -> None:
        match ev:
            case FactEvent(name="profiler_dir", value=folder):
                self.profiler_dir = str(folder)
            case StateEvent(state=state):
                self.state = state
                if state == "ready":
                    self._start_sampler()
                elif state in ("crashed", "stopped"):
                    self._stop_sampler()
        self._feed_kv(ev)
        self.event.emit(ev)
        if isinstance(ev, StateEvent):
            self.state_changed.emit(ev)

    def _feed_kv(self, ev: Event) -> None:
        """The KV-event subscriber follows the server (as ``serve`` runs it): bound and started
        on the ``kv_events`` fact, before vLLM is spawned; stopped with a stopped or crashed
        server. Its ``kv`` events reach the ``kv`` signal while the server is ready."""
        if self._kv is None:
            if not (isinstance(ev, FactEvent) and ev.name == "kv_events"):
                return
            from quantdeck.core.monitor.kv_events import KvFeed

            self._kv = KvFeed(
                self.kv.emit,
                ready=lambda: self.state == "ready",
                on_error=self.error.emit,
                # /metrics may want the key (the server's open_metrics off)
                api_key=self.server.cfg.server.api_key if self.server else None,
            )
        self._kv.on_server_event(ev)

    @property
    def kv_subscriber(self) -> Any:
        """The running KV-event subscriber (None: no server with kv events runs)."""
        return self._kv.subscriber if self._kv is not None else None

    def _start_sampler(self) -> None:
        from quantdeck.core.monitor import MetricsScraper, ProcessWatch, Sampler

        self._stop_sampler()
        url = self.server.url if self.server else self.attached.url if self.attached else None
        if url is None:
            return
        key = (
            self.server.cfg.server.api_key
            if self.server
            else self.attached.api_key
            if self.attached
            else None
        )
        watch = ProcessWatch(self.server.pid) if self.server else None
        scraper = MetricsScraper(url, api_key=key, slo_ms=self.slo_ms)
        s = Sampler(hz=self.hz, scraper=scraper, watch=watch)
        s.subscribe(lambda sample: self.metrics.emit(sample.to_event()))
        s.start()
        self.sampler = s

    def set_slo(self, slo_ms: dict[str, float]) -> None:
        """The SLOs (``ttft``, ``itl``, ``e2e`` in ms; none: no attainment) for this sampler
        and the next: the deriver reads its dict once per scrape, so one assignment hands it
        over between threads."""
        self.slo_ms = {k: v for k, v in slo_ms.items() if v > 0}
        s = self.sampler
        if s is not None and s.scraper is not None:
            s.scraper.deriver.slo_ms = dict(self.slo_ms)

    def _stop_sampler(self) -> None:
        s, self.sampler = self.sampler, None
        if s is not None:
            s.stop()

    @property
    def url(self) -> str | None:
        if self.server is not None:
            return self.server.url
        return self.attached.url if self.attached else None

    @property
    def model_name(self) -> str | None:
        if self.server is not None:
            return self.server.served_name
        return self.attached.models[0] if self.attached and self.attached.models else None

    @property
    def api_key(self) -> str | None:
        if self.server is not None:
            return self.server.cfg.server.api_key
        return self.attached.api_key if self.attached else None

    # -- actions -----------------------------------------------------------------------------
    def start(self, cfg: LaunchConfig) -> None:
        """Spawn a server for ``cfg`` (stopping the current one first)."""
        from quantdeck.core.events import MarkerEvent
        from quantdeck.core.launch import knobs

        # the tuning timeline's marker (the Monitor's timeline makes it a launch, a restart or
        # a knob change with its diff), at the click: before the old server stops
        self.event.emit(MarkerEvent("launch", "launch", config=knobs.to_dict(cfg)))

        def body() -> None:
            from quantdeck.core.runtime import EngineEnv, ServerProcess

            self._shutdown()
            self.profiler_dir = None
            engine = EngineEnv(self.engine_python) if self.engine_python else None
            srv = ServerProcess(cfg, engine=engine, nice=SERVER_NICE)
            with self._lock:
                self.server, self.attached = srv, None
            self._unsub = srv.subscribe(self._on_core_event)
            srv.start()

        self._run(body)

    def stop(self) -> None:
        self._run(self._shutdown)

    def restart(self, cfg: LaunchConfig) -> None:
        self.start(cfg)

    def attach(self, url: str, api_key: str | None = None) -> None:
        def body() -> None:
            from quantdeck.core.runtime import AttachedServer

            self._shutdown()
            self.profiler_dir = None  # its trace folder is not ours to know
            att = AttachedServer(url, api_key=api_key)
            models = att.check()
            with self._lock:
                self.attached, self.server = att, None
            self._on_core_event(StateEvent("attached", url=att.url, models=models))
            self._start_sampler()

        self._run(body)

    def _shutdown(self) -> None:
        self._stop_sampler()
        srv = self.server
        if srv is not None and srv.running:
            srv.stop()
        if self._kv is not None:
            self._kv.stop()
        if self.attached is not None:
            self.attached = None
            self._on_core_event(StateEvent("stopped"))

    def shutdown(self, timeout: float = 60.0) -> None:
        """Stop everything (the app is closing): the actions not yet begun are dropped, the
        one running ends first (a start would otherwise spawn a server after this stop)."""
        while len(self._actions) > 1:
            self._actions.pop()
        if self._workers is not None:
            self._workers.wait(timeout)
        self._shutdown()
