"""The main window: model library on the left, the launch form and live planner on the right."""

from __future__ import annotations

import html
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QEvent, QSettings, Qt, QTimer, Signal
from PySide6.QtWidgets import (
    QLabel,
    QListView,
    QMainWindow,
    QMessageBox,
    QProgressBar,
    QPushButton,
    QSplitter,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from quantdeck.core.errors import QuantdeckError
from quantdeck.core.events import (
    Event,
    FallbackEvent,
    InstanceEvent,
    MetricsEvent,
    RouteEvent,
    StateEvent,
)
from quantdeck.core.launch import DeviceFacts, detect_device
from quantdeck.core.models import AdapterInfo, ModelInfo, inspect_model, read_adapter
from quantdeck.core.models.adapters import is_adapter_dir
from quantdeck.core.paths import config_dir
from quantdeck.gui.fleet_view import FleetView
from quantdeck.gui.labels import plain_label
from quantdeck.gui.launch_tab import ROUTER_INSTANCE, LaunchTab
from quantdeck.gui.logs import LogsPanel
from quantdeck.gui.playground import PlaygroundPanel
from quantdeck.gui.server_control import QtServerController
from quantdeck.gui.style import ALERT_TEXT, GREEN, ORANGE, RED, STOPPED
from quantdeck.gui.table_model import Column, ObjectTableModel

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


def _reading(v: Any, spec: str) -> str:
    """A telemetry reading, or "?" where the driver gave none."""
    return format(v, spec) if isinstance(v, int | float) else "?"


def _scan_hf_cache() -> list[tuple[str, ModelInfo]]:
    """The readable models of the Hugging Face cache (inspected here, not on the UI thread)."""
    from quantdeck.core.models import scan_hf_cache

    return [(e.path, e.info) for e in scan_hf_cache() if e.info is not None]


@dataclass(frozen=True)
class ModelFolder:
    """A model folder of the library and what the inspector says of it (None: unreadable);
    a LoRA adapter folder has ``adapter`` instead, shown with its base model."""

    path: str
    info: ModelInfo | None
    adapter: AdapterInfo | None = None
    error: str | None = None  # why the inspector could not read it (info None)

    @property
    def title(self) -> str:
        name = Path(self.path).name
        if self.adapter:
            base = Path(self.adapter.base_model or "?").name
            return f"{name}   [{self.adapter.badge} on {base}]"
        return f"{name}   [{self.info.badge}]" if self.info else f"{name}   (unreadable)"


LIBRARY_COLUMNS: tuple[Column[ModelFolder], ...] = (
    Column("model", lambda m: m.title, tooltip=lambda m: m.path),
)


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
        self.library_model: ObjectTableModel[ModelFolder] = ObjectTableModel(LIBRARY_COLUMNS, self)
        self.library = QListView()  # shows the model's first column
        self.library.setObjectName("library")
        self.library.setModel(self.library_model)
        self.library_info = plain_label()
        self.library_info.setWordWrap(True)
        self.library_info.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.add_folder_button = QPushButton("Add folder…")
        self.tabs = QTabWidget()
        self.launch = LaunchTab(self.device)
        # pyqtgraph takes most of the start-up time: the Monitor is built right after the
        # window's first paint (or on first use), inside this container
        self._monitor: Any = None
        self._kv_view: Any = None  # the KV view (gui/monitor/kv.py), a page beside the plots
        self._profile_view: Any = None  # the Trace page (gui/monitor/profile.py)
        self.leftovers_box: QMessageBox | None = None  # servers left by an earlier run (app.py)
        self.alerts_view: Any = None  # the Alerts page (gui/monitor/alerts.py), with the plots
        self._monitor_box = QWidget()
        monitor_lay = QVBoxLayout(self._monitor_box)
        monitor_lay.setContentsMargins(0, 0, 0, 0)
        self.monitor_pages = QTabWidget()  # inside the Monitor tab: plots, KV cache
        self.monitor_pages.setDocumentMode(True)
        monitor_lay.addWidget(self.monitor_pages)
        self.logs = LogsPanel()
        self.playground = PlaygroundPanel(
            lambda: (self.controller.url, self.controller.model_name, self.controller.api_key)
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
        self.fleet.instance_event.connect(self.logs.add_event)
        self.fleet.instances_changed.connect(lambda stores: self.monitor.set_instances(stores))
        # a fleet's fallback switches are markers on the Monitor's timeline (a bound method:
        # queued onto the UI thread, as the Fleet tab's own slot is)
        self.fleet._fleet_event.connect(self._on_fleet_event)
        self.fleet.phase_changed.connect(self._on_fleet_phase)
        # the Launch tab's fleet of one (Start behind the router): the file written for it,
        # whether its start is under way (written, read, not yet starting), and what the
        # Launch tab was last told of it
        self._router_file: str | None = None
        self._router_pending = False
        self._router_shown: tuple[Any, ...] = ()
        self.fleet.changed.connect(self._on_fleet_changed)
        self.fleet.serve_refused.connect(self._on_router_refused)
        self.tabs.currentChanged.connect(self._on_tab_changed)
        side = QWidget()
        sl = QVBoxLayout(side)
        sl.setContentsMargins(0, 0, 0, 0)
        sl.addWidget(QLabel("<b>Models</b>"))
        sl.addWidget(self.library, 1)
        sl.addWidget(self.library_info)
        sl.addWidget(self.add_folder_button)
        split = QSplitter()
        split.addWidget(side)
        split.addWidget(self.tabs)
        split.setStretchFactor(1, 4)
        split.setSizes([300, 1100])
        self.setCentralWidget(split)
        self.progress = QProgressBar()
        self.progress.setMaximumWidth(240)
        self.progress.hide()
        self._server_state = "● stopped"
        self.state_label = QLabel(self._server_state)
        self.url_label = QLabel("")
        self.status_label = plain_label(self.device.label)
        self.alert_label = QLabel("")  # the alerts not yet acknowledged (a badge)
        self.alert_label.setStyleSheet(f"color:{ALERT_TEXT}; font-weight:bold;")
        self.alert_label.hide()
        for w in (self.state_label, self.url_label, self.alert_label):
            self.statusBar().addWidget(w)
        self.statusBar().addWidget(self.status_label, 1)
        self.statusBar().addPermanentWidget(self.progress)
        self.system_check: Any = None  # Help ▸ System check… (gui/system_check.py)
        self.menuBar().addMenu("&Help").addAction("System check…", self._on_system_check)
        self.library.selectionModel().currentChanged.connect(self._on_library_changed)
        self.add_folder_button.clicked.connect(self._on_add_folder_clicked)
        self.launch.start_requested.connect(self._on_start_requested)
        self.launch.router_start_requested.connect(self._on_router_start_requested)
        self.launch.router_restart_requested.connect(
            lambda: self.fleet.act_on(ROUTER_INSTANCE, "restart_instance")
        )
        self.launch.try_live_requested.connect(self._on_try_live_requested)
        self.launch.stop_requested.connect(self._on_stop_requested)
        self.launch.attach_requested.connect(
            lambda url, key: self.controller.attach(url, key or None)
        )
        self.launch.profile_model_requested.connect(self._on_profile_model)
        self.controller.event.connect(self._on_server_event)
        self.launch.follow(self.controller)
        self.controller.metrics.connect(self._on_metrics)
        self.controller.kv.connect(self._on_kv)
        self.controller.error.connect(self._on_server_error)
        self.controller.idle.connect(self._on_controller_idle)
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
        # the recordings open, each in its window (gui/monitor/replay.py)
        self.replays: list[Any] = []
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
            self._scan_folder(Path(f))
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
        """The Monitor panel (built on first use)."""
        if self._monitor is None:
            from quantdeck.gui.monitor import AlertsView, MonitorPanel

            self._monitor = MonitorPanel()
            self._monitor.follow(self.controller)
            self._monitor.set_source_state(self.controller.state)
            self.monitor_pages.addTab(self._monitor, "Plots")
            self._monitor.alert.connect(
                lambda msg: self.logs.add_event(StateEvent("alert", reason=msg))
            )
            self.alerts_view = AlertsView(self._monitor)
            self.monitor_pages.addTab(self.alerts_view, "Alerts")
            self._monitor.alerts_changed.connect(self._on_alerts_changed)
            self._monitor.open_button.clicked.connect(self._on_open_recording)
            self._monitor.slo_changed.connect(self.controller.set_slo)
        return self._monitor

    @property
    def kv_view(self) -> Any:
        """The KV view, the Monitor tab's second page (built on first use, after the plots)."""
        if self._kv_view is None:
            self.monitor  # noqa: B018 (the plots' page first)
            from quantdeck.gui.monitor import KvView

            self._kv_view = KvView()
            self.monitor_pages.addTab(self._kv_view, "KV cache")
        return self._kv_view

    @property
    def profile_view(self) -> Any:
        """The Trace page of the Monitor tab (vLLM's profiler; built on first use, after the KV
        view): "profile" names a saved launch config on the Launch tab."""
        if self._profile_view is None:
            self.kv_view  # noqa: B018 (the pages in order)
            from quantdeck.gui.monitor import ProfilePanel

            self._profile_view = ProfilePanel(self.controller)
            self.monitor_pages.addTab(self._profile_view, "Trace")
        return self._profile_view

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
        i = self.library_model.find(lambda m: m.path == str(path))
        if i < 0:
            adapter, error = None, None
            if info is None:
                try:
                    if is_adapter_dir(path):
                        adapter = read_adapter(path)
                    else:
                        info = inspect_model(path)
                except QuantdeckError as e:
                    error = str(e)
                    self.library_info.setText(error)
            i = self.library_model.append(ModelFolder(str(path), info, adapter, error))
        if select:
            self.library.setCurrentIndex(self.library_model.index(i, 0))

    def selected_model(self) -> ModelFolder | None:
        """The library's current model, if any."""
        index = self.library.currentIndex()
        return self.library_model.row(index.row()) if index.isValid() else None

    def _scan_folder(self, folder: Path) -> None:
        from quantdeck.core.models import scan_folders

        try:
            found = scan_folders([folder])
        except QuantdeckError as e:
            self.library_info.setText(str(e))
            return
        for entry in found:
            self.add_model(Path(entry.path), info=entry.info)  # an adapter is read by add_model
        if not found:  # said, not added in silence
            self.library_info.setText(
                f"No model found in {folder}: a model is a folder with a config.json (or a "
                "LoRA adapter's adapter_config.json), there or up to three folders down"
            )

    def _on_add_folder_clicked(self) -> None:
        from PySide6.QtWidgets import QFileDialog

        d = QFileDialog.getExistingDirectory(self, "Add a folder of models")
        if d:
            self.add_folder(d)

    def add_folder(self, folder: str) -> None:
        if folder not in self.folders:
            self.folders.append(folder)
            gui_settings().setValue("folders", self.folders)
        self._scan_folder(Path(folder))

    def _on_library_changed(self, *_: Any) -> None:
        selected = self.selected_model()
        if selected is None:
            return
        path, info = selected.path, selected.info
        if selected.adapter is not None:  # served on top of its base: nothing to launch alone
            a = selected.adapter
            self.library_info.setText(
                f"LoRA adapter · rank {a.rank} · alpha {a.alpha:g} · "
                f"{', '.join(a.target_modules)} · base {a.base_model or 'not named'} · "
                "load it into a server started with LoRA (quantdeck lora load)"
            )
            return
        if info is None:  # unreadable: why, where the operator looks (not a tooltip)
            why = selected.error or "the inspector could not read it"
            self.library_info.setText(f"{Path(path).name} cannot be launched: {why}")
        if info is not None:
            q = info.quantization
            self.library_info.setText(
                f"{info.architecture} · {info.num_parameters / 1e6:,.1f} M params · "
                f"{info.weights_bytes / 2**20:,.1f} MiB · {info.num_layers} layers · "
                f"kv heads {info.num_kv_heads}" + (f" · {q.method} {q.scheme}" if q else "")
            )
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
    def _on_server_event(self, ev: Event) -> None:
        self.logs.add_event(ev)
        if self._monitor is None:  # built now, it follows the controller from the next event
            self.monitor._on_server_event(ev)
        if not isinstance(ev, StateEvent):
            return
        st = ev.state
        colors = {"ready": GREEN, "crashed": RED, "stopped": STOPPED, "attached": GREEN}
        self._server_state = f"<span style='color:{colors.get(st, ORANGE)}'>●</span> {st}"
        self._show_serving()
        if st in ("ready", "attached"):
            router = self.router_phase() is not None and self.fleet.spec is not None
            # behind the router the URL clients use is the router's
            url = f"{self.fleet.spec.router.url} (router)" if self.fleet.spec and router else ""
            self.url_label.setText(url or self.controller.url or "")
            if st == "attached":  # the Monitor follows it as a source of its own
                self.kv_view.clear()
        elif st == "starting":  # the plots go on: the timeline's marker shows the restart
            self.kv_view.clear()
            server = self.controller.server
            self.kv_view.set_model(server.cfg.model.model if server is not None else None)
            if server is not None:  # an engine option: the page asks for it only while off
                flag = server.cfg.extra_args.get("kv-cache-metrics")
                self.kv_view.kv_cache_metrics = flag not in (None, False, "false")
        elif st in ("stopped", "crashed"):
            self.url_label.setText("")

    def _on_metrics(self, ev: MetricsEvent) -> None:
        self.kv_view.add_metrics(ev)
        tel = ev.telemetry
        if tel is None:  # telemetry could not be read this tick: the problem line says why
            return
        if tel.gpus:
            g = tel.gpus[0]
            used = g.memory_used_bytes if isinstance(g.memory_used_bytes, int) else 0
            self.status_label.setText(
                f"{self.device.label} · util {_reading(g.utilization_pct, '.0f')}% · "
                f"{used / 2**30:.1f} GiB · {_reading(g.power_w, '.0f')} W"
            )
        else:
            self.status_label.setText(
                f"{self.device.label} · CPU {tel.host_cpu_pct:.0f}% · RAM "
                f"{tel.host_ram_used_bytes / 2**30:.1f} GiB"
            )

    def _on_alerts_changed(self) -> None:
        """The badges: the alerts not yet acknowledged, on the Monitor tab, its Alerts page and
        the status bar (whatever tab is shown)."""
        log = self.monitor.alerts
        unseen, active = log.unacknowledged, len(log.active)
        index = self.tabs.indexOf(self._monitor_box)
        self.tabs.setTabText(index, f"Monitor ⚠ {unseen}" if unseen else "Monitor")
        page = self.monitor_pages.indexOf(self.alerts_view)
        self.monitor_pages.setTabText(page, f"Alerts ({unseen})" if unseen else "Alerts")
        text = ""
        if unseen or active:
            text = f"⚠ {active} alert{'s' * (active != 1)} active" + (
                f", {unseen} not acknowledged" if unseen else ""
            )
        self.alert_label.setText(text)
        self.alert_label.setVisible(bool(text))

    def _on_kv(self, ev: Event) -> None:
        self.kv_view.add_event(ev)

    def _on_start_requested(self, cfg: Any) -> None:
        """Start (or Restart) is disabled from the click on: a double click starts one server."""
        self.launch.set_server_state("starting")
        self.controller.start(cfg)

    def _on_stop_requested(self) -> None:
        """The Launch tab's Stop: its fleet of one where it serves behind the router, else
        its server (or the attached one)."""
        if self.router_phase() is not None or self._router_pending:
            self.fleet.stop_fleet()
        else:
            self.controller.stop()

    # -- behind the router (serve --behind-router) -----------------------------------------------
    def router_phase(self) -> str | None:
        """The phase of the Launch tab's fleet of one (starting, serving, stopping); None
        where it does not run (or the Fleet tab shows another fleet)."""
        fleet = self.fleet
        if self._router_file is None or fleet.path != self._router_file:
            return None
        return fleet.phase if fleet.phase in ("starting", "serving", "stopping") else None

    def _on_router_start_requested(self, cfg: Any) -> None:
        """Start behind the router, as ``quantdeck serve --behind-router``: a fleet file of
        one (the router on the form's host and port, the instance "serve" on a free port,
        served by the Launch tab's engine) that the Fleet tab reads and starts. A fleet of the
        user's that runs there is not replaced: one red line says so."""
        from quantdeck.core.fleet.spec import fleet_of_one
        from quantdeck.core.paths import cache_dir

        fleet = self.fleet
        if fleet.job is not None or self._router_pending:
            name = Path(fleet.path).name if fleet.path else "a fleet"
            self.launch.refuse(
                f"Not started: the Fleet tab runs {name}; stop it there first (behind the "
                "router the Launch tab serves a fleet of one of its own, and one fleet runs "
                "at a time)"
            )
            return
        try:
            path = fleet_of_one(
                cfg, cache_dir() / "fleet", engine=self.launch.engine_box.currentData() or None
            )
        except (QuantdeckError, OSError) as e:
            self.launch.refuse(f"Not started: {e}")
            return
        self._router_file, self._router_pending = str(path), True
        self.launch.set_router_state("starting")
        fleet.serve_file(str(path))

    def _on_router_refused(self, path: str, why: str) -> None:
        if path != self._router_file:
            return
        self._router_pending = False
        self.launch.set_router_state(None)
        self.launch.refuse(f"Not started behind the router: {why}")

    def _on_try_live_requested(self, cfg: Any) -> None:
        """The Launch tab's Try live…: the Fleet tab's dialog for its instance, the form's
        knobs already the candidate's (the diff against the running launch shown)."""
        self.tabs.setCurrentWidget(self.fleet)
        self.fleet.select(ROUTER_INSTANCE)
        self.fleet.try_live(candidate=cfg)

    def _on_fleet_changed(self) -> None:
        """The Launch tab follows its fleet of one: the state line, Stop, Try live… (on while
        it serves, no trial is under way and the form differs from the running launch), and
        Monitor, Logs and Playground pointed at its instance once it serves."""
        fleet, phase = self.fleet, self.router_phase()
        if phase is not None:
            self._router_pending = False
        elif self._router_pending:
            phase = "starting"  # written and being read: the fleet has not started yet
        rows = fleet.rows if phase is not None else None
        row = rows.row(ROUTER_INSTANCE) if rows is not None and ROUTER_INSTANCE in rows else None
        url = fleet.spec.router.url if fleet.spec is not None else ""
        running, why = None, "check Behind the router and Start: Try live… changes its knobs"
        if phase is not None and phase != "serving":
            why = f"the fleet of one is {phase}"
        elif phase == "serving" and fleet.trial_busy:
            why = "a trial is under way (its view is in the Fleet tab): one at a time"
        elif phase == "serving" and (row is None or not row.serving):
            why = f"instance '{ROUTER_INSTANCE}' is {row.state if row else 'gone'}"
        elif phase == "serving":
            running, why = fleet.running_launch(ROUTER_INSTANCE), ""
        self.launch.set_live_target(running, why)
        health = fleet.health if phase == "serving" else None
        if health is not None:  # serving, degraded or down: the instance's word, not the job's
            phase = health.word
        shown = (phase, url, row.state if row is not None else "", health.why if health else "")
        if shown == self._router_shown:
            return
        was = self._router_shown[0] if self._router_shown else None
        self._router_shown = shown
        self.launch.set_router_state(*shown)
        if phase == "serving" and was not in ("serving", "degraded", "down"):
            fleet.choose(ROUTER_INSTANCE, show=False)  # Monitor, Logs, Playground follow it
        if was is not None and phase is None and fleet.message.text():
            self.launch.message.setText(f"The fleet of one stopped: {fleet.message.text()}")
        self._show_serving()

    def _on_controller_idle(self) -> None:
        """Its actions done: the Launch tab shows its state (a start that failed before the
        server said anything leaves it stopped, Start enabled again)."""
        self.launch.set_server_state(self.controller.state)

    def _on_server_error(self, msg: str) -> None:
        self.launch.message.setText(msg)
        self.logs.add_event(StateEvent("error", reason=msg))

    def _on_fleet_event(self, ev: Event) -> None:
        if isinstance(ev, InstanceEvent) and isinstance(ev.event, FallbackEvent | RouteEvent):
            self.monitor.add_event(ev)

    def _show_serving(self) -> None:
        """The status bar says what serves: the Launch tab's server (or the attached one) and
        a fleet while one runs."""
        fleet = self.fleet.phase
        text = self._server_state
        router = self.router_phase()
        health = self.fleet.health  # serving, degraded or down while the fleet serves
        color = {"serving": GREEN, "down": RED}.get(health.word, ORANGE)
        dot = f"<span style='color:{color}'>●</span>"
        if router is not None:
            text = f"{dot} {health.word} behind the router" + (
                f": {html.escape(health.why)}" if health.why else ""
            )
        elif fleet in ("starting", "serving", "stopping"):
            text += f" · {dot} fleet {html.escape(health.line())}"
        self.state_label.setText(text)

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

    def _on_open_recording(self) -> None:
        from PySide6.QtWidgets import QFileDialog

        path, _ = QFileDialog.getOpenFileName(
            self, "Open a recording", "", "Recordings (*.jsonl *.jsonl.gz);;All files (*)"
        )
        if path:
            self.open_recording(path)

    def open_recording(self, path: str) -> int:
        """Replay a recording in a window of its own, read-only: the live Monitor, its samples,
        markers and alerts are untouched (a fleet's recording goes to the Fleet tab, as
        before). Returns its number of events (0: it could not be read, and the Launch tab
        says why)."""
        from quantdeck.core.monitor import read_recording
        from quantdeck.gui.monitor import ReplayWindow

        try:
            rec = read_recording(path)
        except QuantdeckError as e:
            self.launch.message.setText(str(e))
            return 0
        if rec.header.info.get("source") == "fleet":  # a fleet's: the Fleet tab replays it
            self.fleet.show_recording(path, rec)
            self.tabs.setCurrentWidget(self.fleet)
            self.status_label.setText(f"fleet replay: {Path(path).name} ({rec.duration_s:.0f} s)")
            return len(rec.events)
        title = rec.header.info.get("title") or rec.header.info.get("model") or Path(path).name
        window = ReplayWindow(rec, Path(str(title)).name if title else Path(path).name, self)
        window.setWindowTitle(f"Quantdeck replay: {Path(path).name}")
        window.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        window.destroyed.connect(lambda *_: self._forget_replay(window))
        self.replays.append(window)
        window.resize(self.size())
        if self.isVisible():
            window.show()
        window.refresh()
        return len(rec.events)

    def _forget_replay(self, window: Any) -> None:
        if window in self.replays:
            self.replays.remove(window)

    def closeEvent(self, ev: Any) -> None:
        from quantdeck.core.launch import to_yaml

        settings = gui_settings()
        settings.setValue("geometry", self.saveGeometry())
        try:
            settings.setValue("last_config", to_yaml(self.launch.config()))
        except QuantdeckError:
            pass
        for replay in list(self.replays):
            replay.close()
        if self._monitor is not None:
            self._monitor.timer.stop()
        if self._kv_view is not None:
            self._kv_view.shutdown()
        if self._profile_view is not None:
            self._profile_view.shutdown()
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
