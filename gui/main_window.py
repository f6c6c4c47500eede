"""The main window: the model library on the left, the tabs on the right, the status bar below;
what serves is told by core/deployment.py (the status bar and the Launch tab say the same)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QEvent, QSettings, QTimer, Signal
from PySide6.QtWidgets import (
    QMainWindow,
    QMessageBox,
    QSplitter,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from quantdeck.core.deployment import Deployment, beside, of_server
from quantdeck.core.errors import QuantdeckError
from quantdeck.core.events import (
    Event,
    FallbackEvent,
    InstanceEvent,
    RouteEvent,
    StateEvent,
)
from quantdeck.core.launch import DeviceFacts, detect_device
from quantdeck.core.models import ModelInfo
from quantdeck.core.paths import config_dir
from quantdeck.gui.fleet import FleetView
from quantdeck.gui.launch import LaunchTab
from quantdeck.gui.library import LibraryPanel, ModelFolder
from quantdeck.gui.logs import LogsPanel
from quantdeck.gui.monitor_tab import MonitorTab
from quantdeck.gui.playground import PlaygroundPanel
from quantdeck.gui.recordings import Recordings
from quantdeck.gui.router_of_one import RouterOfOne
from quantdeck.gui.server_control import QtServerController
from quantdeck.gui.status_line import StatusLine

if TYPE_CHECKING:
    from quantdeck.gui.workers import WorkerSet


def _warm_imports() -> None:
    """Import in a worker what the first clicks need (Start, Send: ~0.2 s of imports here), so
    that the UI thread does not stall on them then; a thread yields the GIL every few ms."""
    import importlib

    for name in (
        "quantdeck.core.runtime.server",
        "quantdeck.core.runtime.chat",
        "quantdeck.core.monitor.metrics",
        "quantdeck.core.monitor.telemetry",
    ):
        importlib.import_module(name)


def _probe_engine(python: str = "") -> Any:
    """What the engine's vLLM can do (Capabilities; ``python`` "" for this interpreter's), or
    why it cannot be asked (a string).

    It warms the imports first, in the same thread: two threads importing the runtime package at
    once can meet its import cycle (``runtime/__init__`` <-> ``runtime/server``) half-initialised
    (an ImportError)."""
    _warm_imports()
    from quantdeck.core.engines import default_engine
    from quantdeck.core.runtime import EngineEnv

    try:
        return EngineEnv(python or default_engine()).capabilities()
    except QuantdeckError as e:
        return str(e)


def _scan_hf_cache() -> list[tuple[str, ModelInfo]]:
    """The readable models of the Hugging Face cache (inspected here, not on the UI thread)."""
    from quantdeck.core.models import scan_hf_cache

    return [(e.path, e.info) for e in scan_hf_cache() if e.info is not None]


def gui_settings() -> QSettings:
    """Window state, in Quantdeck's config folder (kept out of tests by QUANTDECK_CONFIG_DIR).
    The file is made private (0600) before Qt writes it: it names models and folders, and Qt
    keeps the mode of the file it replaces. It never holds the API key (to_yaml leaves it out)."""
    path = config_dir() / "gui.ini"
    path.parent.mkdir(parents=True, exist_ok=True)
    os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o600))
    path.chmod(0o600)
    return QSettings(str(path), QSettings.Format.IniFormat)


class MainWindow(QMainWindow):
    """Library on the left; Launch, Monitor, Logs and Playground tabs; server state below."""

    model_selected = Signal(str)

    def __init__(
        self,
        device: DeviceFacts | None = None,
        controller: QtServerController | None = None,
        *,
        probe: bool = True,
    ) -> None:
        """``probe``: ask the engine what it can do and scan the Hugging Face cache, in the
        background (tests of the form alone turn it off)."""
        super().__init__()
        self.setWindowTitle("Quantdeck")
        self.device = device or detect_device()
        self.controller = controller or QtServerController(self)
        self.library_panel = LibraryPanel()
        # the library's parts, as the window's (tests and the screenshots read them here)
        self.library_model = self.library_panel.model
        self.library = self.library_panel.view
        self.library_info = self.library_panel.info
        self.add_folder_button = self.library_panel.add_folder_button
        self.tabs = QTabWidget()
        self.launch = LaunchTab(self.device)
        # pyqtgraph takes most of the start-up time: the Monitor is built right after the
        # window's first paint (or on first use), inside this container
        self.leftovers_box: QMessageBox | None = None  # servers left by an earlier run (app.py)
        self.monitor_tab = MonitorTab(self.controller)
        self._monitor_box, self.monitor_pages = self.monitor_tab, self.monitor_tab.pages
        self.logs = LogsPanel()
        self.playground = PlaygroundPanel(
            lambda: (self.controller.url, self.controller.model_name, self.controller.api_key),
            waiting=self._waiting_for,
        )
        self.tabs.addTab(self.launch, "Launch")
        self.tabs.addTab(self._monitor_box, "Monitor")
        self.tabs.addTab(self.logs, "Logs")
        self.tabs.addTab(self.playground, "Playground")
        self._bench: Any = None
        self._bench_box = QWidget()
        self._bench_lay = QVBoxLayout(self._bench_box)
        self._bench_lay.setContentsMargins(0, 0, 0, 0)
        self.tabs.addTab(self._bench_box, "Benchmark")
        from quantdeck.gui.convert_tab import ConvertTab

        self.convert = ConvertTab(lambda: self.launch.model_path or None, self.device)
        self.tabs.addTab(self.convert, "Convert")
        self.convert.launch_requested.connect(self.launch_converted)
        self.fleet = FleetView()
        self.tabs.addTab(self.fleet, "Fleet")
        self.fleet.instance_chosen.connect(self._on_fleet_instance_chosen)
        self.fleet.instance_event.connect(
            lambda ev: self.logs.add_event(ev, self.fleet.chosen or "")
        )
        # the instance chosen is a Monitor source of its own, across promotions (it follows)
        self.monitor_tab.follow_fleet(self.fleet)
        # a fleet's fallback switches are markers on the Monitor's timeline (a bound method:
        # queued onto the UI thread, as the Fleet tab's own slot is)
        self.fleet.fleet_event.connect(self._on_fleet_event)
        self.fleet.phase_changed.connect(self._on_fleet_phase)
        # the Launch tab's fleet of one (Start behind the router)
        self.router = RouterOfOne(self.launch, self.fleet, self)
        self.router.changed.connect(self._show_serving)
        self.fleet.changed.connect(self._show_serving)  # a fleet's health beside
        self.tabs.currentChanged.connect(self._on_tab_changed)
        split = QSplitter()
        split.addWidget(self.library_panel)
        split.addWidget(self.tabs)
        split.setStretchFactor(1, 4)
        split.setSizes([300, 1100])
        self.setCentralWidget(split)
        self.status = StatusLine(self.statusBar(), self.device.label)
        self.progress = self.status.progress
        self.state_label, self.url_label = self.status.state_label, self.status.url_label
        self.status_label, self.alert_label = self.status.status_label, self.status.alert_label
        self.system_check: Any = None  # Help ▸ System check… (gui/system_check.py)
        self.menuBar().addMenu("&Help").addAction("System check…", self._on_system_check)
        self.library_panel.model_chosen.connect(self._on_model_chosen)
        self.library_panel.folder_added.connect(self.add_folder)
        self.launch.start_requested.connect(self._on_start_requested)
        self.launch.try_live_requested.connect(self._on_try_live_requested)
        self.launch.stop_requested.connect(self._on_stop_requested)
        self.launch.attach_requested.connect(
            lambda url, key: self.controller.attach(url, key or None)
        )
        self.launch.profile_model_requested.connect(self._on_profile_model)
        # each view subscribes itself to the controller (the window relays nothing): the
        # Logs, the Monitor (in MonitorTab), the Launch tab; the status bar tells the
        # deployment once the views have the state
        self.logs.follow(self.controller)
        self.launch.follow(self.controller)
        self.controller.state_changed.connect(lambda _ev: self._show_serving())
        self.controller.metrics.connect(self.status.show_readings)
        self.monitor_tab.alert.connect(
            lambda msg: self.logs.add_event(StateEvent("alert", reason=msg))
        )
        self.monitor_tab.alerts_changed.connect(self._on_alerts_changed)
        self.recordings = Recordings(self, self.launch.message.setText)
        self.monitor_tab.open_requested.connect(self.recordings.ask)
        self.resize(1400, 900)
        settings = gui_settings()
        geo = settings.value("geometry")
        if geo is not None:
            self.restoreGeometry(geo)
        self.folders: list[str] = [f for f in (settings.value("folders") or []) if f]
        self._restore_last_config(settings)
        self._load_engines(
            str(settings.value("engine") or ""), str(settings.value("convert_engine") or "")
        )
        self.launch.engine_box.currentIndexChanged.connect(self._on_engine_chosen)
        self.convert.engine_box.currentIndexChanged.connect(
            lambda _i: gui_settings().setValue(
                "convert_engine", self.convert.engine_box.python() or ""
            )
        )
        self.workers: WorkerSet | None = None  # see background()
        self._probe = probe
        self._painted = False
        self._background_started = False
        # the window paints first; then the Monitor is built (pyqtgraph takes most of the
        # start-up time) and the engine probe and cache scan start (they compete for the CPU)
        self.installEventFilter(self)
        QTimer.singleShot(0, self, self._start_unless_painting)

    def eventFilter(self, obj: Any, ev: Any) -> bool:
        if obj is self and ev.type() == QEvent.Type.Paint and not self._painted:
            self._painted = True
            self.removeEventFilter(self)
            QTimer.singleShot(0, self, self._after_first_paint)  # after the whole paint pass
        return False

    def _start_unless_painting(self) -> None:
        """A window that is not shown (tests, scripts) starts its background work now; a shown
        one after its first paint."""
        if not self.isVisible() or self._painted:
            self._after_first_paint()
        else:  # should no paint come (a minimised window), start anyway
            QTimer.singleShot(1000, self, self._after_first_paint)

    def _after_first_paint(self) -> None:
        if self._background_started:
            return
        self._background_started = True
        for f in self.folders:  # the remembered folders' models: read after the first paint
            self.library_panel.scan(Path(f))
        workers = self.background()
        if self._probe:
            # the probe cannot be cancelled (a subprocess that imports vLLM, ~15 s cold): its
            # worker ticks, so that closing the window does not wait for it
            python = self.controller.engine_python or ""
            self.launch.set_engine(None)  # probed: Start waits for its check of the form
            workers.follow(
                lambda: _probe_engine(python),
                tick_s=0.25,
                returned=lambda caps: self._on_engine_ready(caps, python),
            )
            workers.start(_scan_hf_cache, returned=self._on_hf_models)
        else:
            workers.start(_warm_imports)
        if self.isVisible():
            # the plots, then the KV view and the Trace page
            QTimer.singleShot(0, self, lambda: (self.kv_view, self.profile_view))

    def _on_system_check(self) -> None:
        from quantdeck.gui.system_check import SystemCheckDialog

        self.system_check = SystemCheckDialog(self)
        self.system_check.open()

    def background(self) -> WorkerSet:
        """The window's own workers (start-up probes, the demo build); superqt is imported on
        first use, after the first paint."""
        if self.workers is None:
            from quantdeck.gui.workers import WorkerSet

            self.workers = WorkerSet(self._on_background_error)
        return self.workers

    def _load_engines(self, remembered: str, remembered_convert: str = "") -> None:
        """The registered engines (``quantdeck engines add``) into the Launch and Convert
        tabs' pickers; the remembered ones chosen while they are still registered."""
        from quantdeck.core.engines import load_registry

        try:
            entries = load_registry()
        except QuantdeckError as e:  # a damaged registry: said, and this Python serves
            entries = []
            self.status_label.setText(str(e))
        pairs = [(e.name, e.python) for e in entries]
        self.launch.engine_box.set_engines(pairs, remembered)
        self.convert.engine_box.set_engines(pairs, remembered_convert)
        self.controller.engine_python = self.launch.engine_box.currentData() or None

    def _on_engine_chosen(self, _index: int) -> None:
        python = self.launch.engine_box.currentData() or ""
        self.controller.engine_python = python or None
        gui_settings().setValue("engine", python)
        if hasattr(self, "capabilities"):  # the form follows the new engine's flags
            del self.capabilities
        self.launch.engine_label.setText("engine: probing…")
        self.launch.set_engine(None)
        self.background().follow(
            lambda: _probe_engine(python),
            tick_s=0.25,
            returned=lambda caps: self._on_engine_ready(caps, python),
        )

    def _on_engine_ready(self, caps: Any, python: str) -> None:
        """The probe's answer for the engine ``python`` ("" ours); an answer for an engine no
        longer chosen is dropped."""
        if python != (self.launch.engine_box.currentData() or ""):
            return
        if isinstance(caps, str):
            self.launch.engine_label.setText(f"engine: {caps}")
            self.launch.set_engine_problem(caps)
            return
        self.capabilities = caps
        self.launch.engine_label.setText(
            f"engine: vLLM {caps.vllm_version} ({caps.platform}), torch {caps.torch_version}"
        )
        self.launch.set_engine(caps)

    def _on_hf_models(self, found: list[tuple[str, ModelInfo]]) -> None:
        for path, info in found:  # inspected in the worker: no file reads on the UI thread
            self.add_model(Path(path), info=info)

    def _on_background_error(self, msg: str) -> None:
        self.logs.add_event(StateEvent("error", reason=msg))
        self.status_label.setText(msg)

    def _restore_last_config(self, settings: QSettings) -> None:
        text = settings.value("last_config")
        if not text:
            return
        from quantdeck.core.launch import from_yaml

        try:
            cfg = from_yaml(str(text), where="last session")
        except QuantdeckError:
            return
        self.launch.set_config(cfg)
        if cfg.model.model and Path(cfg.model.model).is_dir():
            self.add_model(Path(cfg.model.model), select=True)

    @property
    def monitor(self) -> Any:
        """The Monitor's plots (built on first use)."""
        return self.monitor_tab.panel

    @property
    def kv_view(self) -> Any:
        """The Monitor's KV cache page (built on first use, after the plots)."""
        return self.monitor_tab.kv

    @property
    def profile_view(self) -> Any:
        """The Monitor's Trace page (built on first use, after the KV view)."""
        return self.monitor_tab.profile

    @property
    def alerts_view(self) -> Any:
        """The Monitor's Alerts page (built with the plots)."""
        return self.monitor_tab.alerts_view

    @property
    def bench(self) -> Any:
        """The Benchmark tab (built on first use: pyqtgraph)."""
        if self._bench is None:
            from quantdeck.gui.bench import BenchTab

            self._bench = BenchTab(
                lambda: (self.controller.url, self.controller.model_name, self.controller.api_key),
                self.launch.config,
                lambda: self.controller.state not in ("stopped", "crashed"),
                apply_profile=self.launch.select_profile,
                # the Tune page's live mode tunes the fleet the Fleet tab runs, while it serves
                fleet=lambda: self.fleet.fleet if self.fleet.phase == "serving" else None,
            )
            self._bench_lay.addWidget(self._bench)
            # a benchmark run is a marker on the Monitor's timeline
            self._bench.finished.connect(lambda result: self.monitor.mark_bench(result))
        return self._bench

    def _on_tab_changed(self, index: int) -> None:
        if self.tabs.widget(index) is self._bench_box:
            self.bench  # noqa: B018 (builds it)

    # -- library -----------------------------------------------------------------------------
    def add_model(self, path: Path, select: bool = False, info: ModelInfo | None = None) -> None:
        """Add a model folder to the library (``info``: already inspected, e.g. by a scan)."""
        self.library_panel.add_model(path, select, info)

    def selected_model(self) -> ModelFolder | None:
        """The library's current model, if any."""
        return self.library_panel.selected()

    def add_folder(self, folder: str) -> None:
        if folder not in self.folders:
            self.folders.append(folder)
            gui_settings().setValue("folders", self.folders)
        self.library_panel.scan(Path(folder))

    def _on_model_chosen(self, path: str, info: ModelInfo | None) -> None:
        self.launch.set_model(path, info)
        self.convert.source_changed()
        self.model_selected.emit(path)

    def launch_converted(self, path: str) -> None:
        """One click after a conversion: select the new model and start it, unless the advisor
        blocks it here (its reason then shows on the Launch tab)."""
        self.add_model(Path(path), select=True)
        self.tabs.setCurrentWidget(self.launch)
        if self.launch.start_button.isEnabled():
            self.launch.start_button.click()
        else:
            self.launch.message.setText(
                self.launch.start_button.toolTip() or "this model cannot start with these settings"
            )

    def _on_profile_model(self, path: str) -> None:
        self.add_model(Path(path), select=True)

    # -- server ------------------------------------------------------------------------------
    def _on_alerts_changed(self) -> None:
        """The badges: the alerts not yet acknowledged, on the Monitor tab and the status bar
        (whatever tab is shown)."""
        log = self.monitor.alerts
        unseen = log.unacknowledged
        index = self.tabs.indexOf(self.monitor_tab)
        self.tabs.setTabText(index, f"Monitor ⚠ {unseen}" if unseen else "Monitor")
        self.status.show_alerts(len(log.active), unseen)

    def _on_start_requested(self, cfg: Any) -> None:
        """Start (or Restart) is disabled from the click on: a double click starts one server."""
        self.launch.set_server_state("starting")
        self.controller.start(cfg)

    def _on_stop_requested(self) -> None:
        """The Launch tab's Stop: its fleet of one where it serves behind the router, else
        its server (or the attached one)."""
        if self.router.running:
            self.router.stop()
        else:
            self.controller.stop()

    def router_phase(self) -> str | None:
        """The phase of the Launch tab's fleet of one (starting, serving, stopping); None
        where it does not run (or the Fleet tab shows another fleet)."""
        return self.router.phase()

    def _on_try_live_requested(self, cfg: Any) -> None:
        self.tabs.setCurrentWidget(self.fleet)
        self.router.try_live(cfg)

    def deployment(self) -> Deployment:
        """What serves, told once (core/deployment.py): the Launch tab's server, or its fleet
        of one, and the Fleet tab's fleet beside while it runs."""
        d = self.router.deployment() or of_server(self.controller.state, self.controller.url or "")
        return beside(d, self.fleet.phase, self.fleet.health)

    def _on_fleet_event(self, ev: Event) -> None:
        if isinstance(ev, InstanceEvent) and isinstance(ev.event, FallbackEvent | RouteEvent):
            self.monitor.add_event(ev)

    def _waiting_for(self) -> str:
        """Why nothing serves yet, where something is on its way (the Playground says it)."""
        d = self.deployment()
        if d.word not in ("starting", "stopping"):
            return ""
        what = "the fleet of one" if d.behind_router else "the server"
        step = f" ({d.instance})" if d.behind_router and d.instance else ""
        return f"{what} is {d.word}{step}: send once it serves"

    def _show_serving(self) -> None:
        """The status bar says what serves (the deployment model's line)."""
        self.status.show(self.deployment())

    def _on_fleet_phase(self, phase: str) -> None:
        """A fleet that stopped takes the views attached to one of its instances with it
        (Monitor, Logs and Playground would otherwise show a dead instance as attached)."""
        att = self.controller.attached
        rows = self.fleet.rows
        if (
            phase in ("stopped", "no fleet")
            and att is not None
            and rows is not None
            and rows.by_url(att.url) is not None
        ):
            self.controller.stop()
        self._show_serving()

    def _on_fleet_instance_chosen(self, url: str, api_key: str, show: bool) -> None:
        """Monitor, Logs and Playground follow a fleet's instance: the attach path, as the
        Launch tab's attach row takes it (which would stop the Launch tab's own server);
        ``show``: the Monitor tab comes to the front."""
        server = self.controller.server
        if server is not None and server.running:
            self.fleet.message.setText(
                "the Launch tab's server runs: stop it first (Monitor and Playground follow "
                "one server)"
            )
            return
        self.controller.attach(url, api_key or None)
        if show:
            self.tabs.setCurrentWidget(self._monitor_box)

    def open_recording(self, path: str) -> int:
        """Replay a recording (gui/recordings.py): its number of events, 0 where it could not
        be read (the Launch tab says why)."""
        return self.recordings.open(path)

    @property
    def replays(self) -> list[Any]:
        """The replay windows open."""
        return self.recordings.windows

    def closeEvent(self, ev: Any) -> None:
        from quantdeck.core.launch import to_yaml

        settings = gui_settings()
        settings.setValue("geometry", self.saveGeometry())
        try:
            settings.setValue("last_config", to_yaml(self.launch.config()))
        except QuantdeckError:
            pass
        self.recordings.close_all()
        self.monitor_tab.shutdown()
        if self.workers is not None:
            self.workers.quit()
        self.playground.shutdown()
        if self._bench is not None:
            self._bench.shutdown()
        self.convert.shutdown()
        self.fleet.shutdown()
        self.controller.shutdown()
        if self.workers is not None:
            self.workers.wait(10.0)
        super().closeEvent(ev)
