"""The main window: model library on the left, the launch form and live planner on the right."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from PySide6.QtCore import QEvent, QSettings, QSignalBlocker, Qt, QTimer, Signal
from PySide6.QtGui import QColor, QPainter
from PySide6.QtWidgets import (
    QApplication,
    QCheckBox,
    QComboBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QMainWindow,
    QProgressBar,
    QPushButton,
    QScrollArea,
    QSplitter,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from quantdeck.core.errors import QuantdeckError
from quantdeck.core.events import Event, MetricsEvent, StateEvent
from quantdeck.core.launch import (
    DeviceFacts,
    Finding,
    GiB,
    KvPlan,
    LaunchConfig,
    advise,
    detect_device,
    plan,
    profiles,
    serve_command,
    validate,
)
from quantdeck.core.models import ModelInfo, inspect_model
from quantdeck.core.paths import config_dir
from quantdeck.gui.knob_form import KnobForm
from quantdeck.gui.logs import LogsPanel
from quantdeck.gui.playground import PlaygroundPanel
from quantdeck.gui.server_control import QtServerController

SEGMENTS = (
    ("weights", "weights_bytes", "#4e79a7"),
    ("activations", "activation_bytes", "#f28e2b"),
    ("CUDA graphs", "cudagraph_bytes", "#e15759"),
    ("non-torch", "non_torch_bytes", "#76b7b2"),
    ("KV cache", "kv_cache_bytes", "#59a14f"),
    ("free", "free_bytes", "#d0d0d0"),
)


def _warm_imports() -> None:
    """Import in a worker what the first clicks need (Start, Send: ~0.2 s of imports here), so
    that the UI thread does not stall on them then; a thread yields the GIL every few ms."""
    import importlib

    for name in (
        "superqt.utils",
        "quantdeck.core.runtime.server",
        "quantdeck.core.runtime.chat",
        "quantdeck.core.monitor.metrics",
        "quantdeck.core.monitor.telemetry",
    ):
        importlib.import_module(name)


def gui_settings() -> QSettings:
    """Window state, in Quantdeck's config folder (kept out of tests by QUANTDECK_CONFIG_DIR)."""
    return QSettings(str(config_dir() / "gui.ini"), QSettings.IniFormat)


class MemoryBar(QWidget):
    """A stacked bar of the planner's memory split."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setMinimumHeight(28)
        self._parts: list[tuple[float, str]] = []

    def set_plan(self, p: KvPlan | None) -> None:
        self._parts = []
        if p is not None:
            d = p.to_json()
            total = max(1, p.total_bytes)
            self._parts = [(d[key] / total, color) for _, key, color in SEGMENTS if d[key] > 0]
        self.update()

    def paintEvent(self, _ev: Any) -> None:
        qp = QPainter(self)
        x = 0.0
        w, h = self.width(), self.height()
        for frac, color in self._parts:
            qp.fillRect(int(x), 0, max(1, int(round(frac * w))), h, QColor(color))
            x += frac * w
        qp.end()


class PlannerPanel(QWidget):
    """The planner's figures and the advisor's findings for the form's current values."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        lay = QVBoxLayout(self)
        self.bar = MemoryBar()
        self.legend = QLabel()
        self.figures = QLabel()
        self.figures.setTextInteractionFlags(Qt.TextSelectableByMouse)
        self.advice = QLabel()
        self.advice.setWordWrap(True)
        for w in (QLabel("<b>Memory plan</b>"), self.bar, self.legend, self.figures, self.advice):
            lay.addWidget(w)
        lay.addStretch(1)
        self.legend.setText(
            "  ".join(f"<span style='color:{c}'>■</span> {n}" for n, _, c in SEGMENTS)
        )

    def show_plan(self, p: KvPlan | None, findings: list[Any], error: str | None) -> None:
        self.bar.set_plan(p)
        if error:
            self.figures.setText(f"<span style='color:#c00'>{error}</span>")
            self.advice.setText("")
            return
        assert p is not None
        fits = p.fits and not any(f.level == "error" for f in findings)
        self.figures.setText(
            f"{p.device}<br>"
            f"weights {p.weights_bytes / GiB:.2f} GiB · KV cache {p.kv_cache_bytes / GiB:.2f} GiB"
            f"<br>KV blocks {p.num_blocks:,} × {p.block_size} = {p.kv_cache_tokens:,} tokens"
            f"<br>max concurrency {p.max_concurrency}× at {p.max_model_len} tokens"
            f"<br><b>{'fits' if fits else 'does not fit'}</b>"
        )
        self.advice.setText(
            "<br>".join(
                f"<span style='color:{'#c00' if f.level == 'error' else '#a60'}'>{f.level}: "
                f"{f.message}</span>"
                for f in findings
            )
        )


class LaunchTab(QWidget):
    """Form + planner, the eager toggle up front, actions: start / stop / restart, copy the
    ``vllm serve`` command, profiles, attach to a URL."""

    start_requested = Signal(object)  # LaunchConfig
    stop_requested = Signal()
    attach_requested = Signal(str, str)  # url, api key

    def __init__(self, device: DeviceFacts, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.device = device
        self.info: ModelInfo | None = None
        self.findings: list[Any] = []
        self.form = KnobForm()
        self.planner = PlannerPanel()
        self.model_path = ""
        self.model_label = QLabel("no model")
        self.model_label.setStyleSheet("font-weight:bold")
        self.engine_label = QLabel("engine: probing…")
        self.engine_label.setStyleSheet("color:#555")
        self.eager = QCheckBox("Eager mode (no CUDA graphs / torch.compile)")
        self.eager.setStyleSheet("font-size: 13pt; font-weight: bold")
        self.eager_note = QLabel()
        self.eager_note.setWordWrap(True)
        self.advanced = QCheckBox("Show advanced knobs")
        self.start_button = QPushButton("Start")
        self.stop_button = QPushButton("Stop")
        self.restart_button = QPushButton("Restart")
        self.copy_button = QPushButton("Copy `vllm serve` command")
        self.stage = QLabel("stopped")
        self.progress = QProgressBar()
        self.progress.setRange(0, 100)
        self.profiles = QComboBox()
        self.profiles.setEditable(True)
        self.profiles.setPlaceholderText("profile name")
        self.save_profile = QPushButton("Save")
        self.load_profile = QPushButton("Load")
        self.delete_profile = QPushButton("Delete")
        self.attach_url = QLineEdit()
        self.attach_url.setPlaceholderText("http://host:8000 — monitor a server you do not own")
        self.attach_key = QLineEdit()
        self.attach_key.setPlaceholderText("API key (optional)")
        self.attach_key.setEchoMode(QLineEdit.Password)
        self.attach_button = QPushButton("Attach")
        self.message = QLabel()
        self.message.setWordWrap(True)

        top = QVBoxLayout()
        top.addWidget(self.model_label)
        top.addWidget(self.engine_label)
        top.addWidget(self.eager)
        top.addWidget(self.eager_note)
        scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setWidget(self.form)
        left = QVBoxLayout()
        left.addLayout(top)
        left.addWidget(self.advanced)
        left.addWidget(scroll, 1)
        right = QVBoxLayout()
        right.addWidget(self.planner, 1)
        prof = QHBoxLayout()
        for w in (
            QLabel("Profile"),
            self.profiles,
            self.save_profile,
            self.load_profile,
            self.delete_profile,
        ):
            prof.addWidget(w)
        right.addLayout(prof)
        att = QHBoxLayout()
        for w in (self.attach_url, self.attach_key, self.attach_button):
            att.addWidget(w)
        right.addLayout(att)
        actions = QHBoxLayout()
        for w in (self.start_button, self.stop_button, self.restart_button, self.stage):
            actions.addWidget(w)
        actions.addWidget(self.progress, 1)
        actions.addWidget(self.copy_button)
        body = QHBoxLayout()
        body.addLayout(left, 3)
        body.addLayout(right, 2)
        lay = QVBoxLayout(self)
        lay.addLayout(body, 1)
        lay.addWidget(self.message)
        lay.addLayout(actions)

        self.form.changed.connect(self._on_form_changed)
        self.eager.toggled.connect(self._on_eager_changed)
        self.advanced.toggled.connect(self.form.set_advanced_visible)
        self.form.set_advanced_visible(False)
        self.start_button.clicked.connect(self._on_start_clicked)
        self.restart_button.clicked.connect(self._on_start_clicked)
        self.stop_button.clicked.connect(self.stop_requested.emit)
        self.copy_button.clicked.connect(self._on_copy_clicked)
        self.save_profile.clicked.connect(self._on_save_profile)
        self.load_profile.clicked.connect(self._on_load_profile)
        self.delete_profile.clicked.connect(self._on_delete_profile)
        self.attach_button.clicked.connect(
            lambda: self.attach_requested.emit(
                self.attach_url.text().strip(), self.attach_key.text().strip()
            )
        )
        self._refresh_profiles()
        self.set_server_state("stopped")

    # -- model and knobs ---------------------------------------------------------------------
    def set_model(self, path: str, info: ModelInfo | None) -> None:
        self.model_path, self.info = path, info
        self.model_label.setText(
            f"{Path(path).name} — {info.badge if info else '?'}"
            + (f", {info.num_parameters / 1e6:,.1f} M parameters" if info else "")
        )
        self._on_form_changed()

    def config(self) -> LaunchConfig:
        cfg = self.form.config()
        cfg.model.model = self.model_path
        return cfg

    def set_config(self, cfg: LaunchConfig) -> None:
        self.form.set_config(cfg)
        self._on_form_changed()

    def _on_eager_changed(self, on: bool) -> None:
        ed = self.form.editors["enforce_eager"]
        if ed.value() != on:
            ed.set_value(on)
            self._on_form_changed()

    def _on_form_changed(self) -> None:
        ed = self.form.editors["enforce_eager"]
        with QSignalBlocker(self.eager):
            self.eager.setChecked(bool(ed.value()))
        if self.info is None:
            self.planner.show_plan(None, [], "choose a model in the library")
            self.findings = []
            self._update_start()
            return
        try:
            cfg = validate(self.config())
            p = plan(cfg, self.info, self.device)
            self.findings = advise(cfg, self.info, self.device, p)
            self.planner.show_plan(p, self.findings, None)
        except QuantdeckError as e:
            self.findings = [Finding("error", "", str(e))]
            self.planner.show_plan(None, [], str(e))
        notes = [f.message for f in self.findings if f.knob == "enforce_eager"]
        self.eager_note.setText(
            notes[0]
            if notes
            else (
                "Eager starts fastest; CUDA graphs decode up to 4-8x faster at batch 1 on a GPU."
                if self.device.is_cuda
                else "On CPU, eager skips torch.compile: it starts fastest."
            )
        )
        self._update_start()

    # -- server state ------------------------------------------------------------------------
    def _blocking(self) -> list[str]:
        return [f.message for f in self.findings if f.level == "error"]

    def _update_start(self) -> None:
        blocked = self._blocking()
        idle = self._state in ("stopped", "crashed")
        self.start_button.setEnabled(idle and self.info is not None and not blocked)
        self.restart_button.setEnabled(not idle and self.info is not None and not blocked)
        self.stop_button.setEnabled(not idle)
        self.start_button.setToolTip(blocked[0] if blocked else "")

    def set_server_state(self, state: str, detail: str = "") -> None:
        self._state = state
        names = {
            "starting": "starting",
            "loading_weights": "loading weights",
            "profiling": "profiling memory",
            "compiling": "compiling",
            "capturing_cuda_graphs": "capturing CUDA graphs",
            "ready": "ready",
            "stopping": "stopping",
            "stopped": "stopped",
            "crashed": "crashed",
            "attached": "attached",
        }
        self.stage.setText(names.get(state, state) + (f" — {detail}" if detail else ""))
        order = (
            "starting",
            "loading_weights",
            "profiling",
            "compiling",
            "capturing_cuda_graphs",
            "ready",
        )
        if state in order:
            self.progress.setValue(int(100 * order.index(state) / (len(order) - 1)))
        elif state in ("stopped", "crashed"):
            self.progress.setValue(0)
        self._update_start()

    def set_progress(self, stage: str, pct: float) -> None:
        if stage == "loading_weights":
            self.stage.setText(f"loading weights {pct:.0f}%")
            self.progress.setValue(int(20 * (1 + pct / 100)))

    def _on_start_clicked(self) -> None:
        try:
            cfg = validate(self.config())
        except QuantdeckError as e:
            self.message.setText(str(e))
            return
        self.message.setText("")
        self.start_requested.emit(cfg)

    def _on_copy_clicked(self) -> None:
        import shlex

        try:
            text = shlex.join(serve_command(validate(self.config())))
        except QuantdeckError as e:
            self.message.setText(str(e))
            return
        QApplication.clipboard().setText(text)
        self.message.setText(f"copied: {text}")

    # -- profiles ----------------------------------------------------------------------------
    def _refresh_profiles(self) -> None:
        current = self.profiles.currentText()
        self.profiles.clear()
        self.profiles.addItems(profiles.list_profiles())
        self.profiles.setCurrentText(current)

    def _on_save_profile(self) -> None:
        try:
            path = profiles.save_profile(self.profiles.currentText().strip(), self.config())
            self.message.setText(f"saved {path}")
        except QuantdeckError as e:
            self.message.setText(str(e))
        self._refresh_profiles()

    def _on_load_profile(self) -> None:
        try:
            cfg = profiles.load_profile(self.profiles.currentText().strip())
        except QuantdeckError as e:
            self.message.setText(str(e))
            return
        self.set_config(cfg)
        if cfg.model.model and cfg.model.model != self.model_path:
            self.profile_model_requested.emit(cfg.model.model)
        self.message.setText(f"loaded profile {self.profiles.currentText()}")

    profile_model_requested = Signal(str)

    def _on_delete_profile(self) -> None:
        try:
            profiles.delete_profile(self.profiles.currentText().strip())
            self.message.setText("deleted")
        except QuantdeckError as e:
            self.message.setText(str(e))
        self._refresh_profiles()


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
        self.library = QListWidget()
        self.library.setObjectName("library")
        self.library_info = QLabel()
        self.library_info.setWordWrap(True)
        self.library_info.setTextInteractionFlags(Qt.TextSelectableByMouse)
        self.add_folder_button = QPushButton("Add folder…")
        self.tabs = QTabWidget()
        self.launch = LaunchTab(self.device)
        # pyqtgraph takes most of the start-up time: the Monitor is built right after the
        # window's first paint (or on first use), inside this container
        self._monitor: Any = None
        self._monitor_box = QWidget()
        QVBoxLayout(self._monitor_box).setContentsMargins(0, 0, 0, 0)
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
        QVBoxLayout(self._bench_box).setContentsMargins(0, 0, 0, 0)
        self.tabs.addTab(self._bench_box, "Benchmark")
        from quantdeck.gui.convert_tab import ConvertTab

        self.convert = ConvertTab(lambda: self.launch.model_path or None, self.device)
        self.tabs.addTab(self.convert, "Convert")
        self.convert.launch_requested.connect(self.launch_converted)
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
        self.state_label = QLabel("● stopped")
        self.url_label = QLabel("")
        self.status_label = QLabel(self.device.label)
        for w in (self.state_label, self.url_label):
            self.statusBar().addWidget(w)
        self.statusBar().addWidget(self.status_label, 1)
        self.statusBar().addPermanentWidget(self.progress)
        self.library.currentItemChanged.connect(self._on_library_changed)
        self.add_folder_button.clicked.connect(self._on_add_folder_clicked)
        self.launch.start_requested.connect(self.controller.start)
        self.launch.stop_requested.connect(self.controller.stop)
        self.launch.attach_requested.connect(
            lambda url, key: self.controller.attach(url, key or None)
        )
        self.launch.profile_model_requested.connect(self._on_profile_model)
        self.controller.event.connect(self._on_server_event)
        self.controller.metrics.connect(self._on_metrics)
        self.controller.error.connect(self._on_server_error)
        self.resize(1400, 900)
        settings = gui_settings()
        geo = settings.value("geometry")
        if geo is not None:
            self.restoreGeometry(geo)
        self.folders: list[str] = [f for f in (settings.value("folders") or []) if f]
        self._restore_last_config(settings)
        self.engine_ready.connect(self._on_engine_ready)
        self.hf_models.connect(self._on_hf_models)
        self._probe = probe
        self._painted = False
        self._background_started = False
        # the window paints first; then the Monitor is built (pyqtgraph takes most of the
        # start-up time) and the engine probe and cache scan start (they compete for the CPU)
        self.installEventFilter(self)
        QTimer.singleShot(0, self, self._start_unless_painting)

    engine_ready = Signal(object)  # quantdeck.core.runtime.engine.Capabilities or an error string
    hf_models = Signal(list)

    def eventFilter(self, obj: Any, ev: Any) -> bool:
        if obj is self and ev.type() == QEvent.Paint and not self._painted:
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
        if self._probe:
            for fn in (self._probe_engine, self._scan_hf_cache):
                threading.Thread(target=fn, name=f"quantdeck{fn.__name__}", daemon=True).start()
        threading.Thread(target=_warm_imports, name="quantdeck-imports", daemon=True).start()
        if self.isVisible():
            QTimer.singleShot(0, self, lambda: self.monitor)

    def _probe_engine(self) -> None:
        from quantdeck.core.runtime import EngineEnv

        try:
            result: Any = EngineEnv().capabilities()
        except QuantdeckError as e:
            result = str(e)
        try:
            self.engine_ready.emit(result)
        except RuntimeError:  # the window closed meanwhile
            pass

    def _on_engine_ready(self, caps: Any) -> None:
        if isinstance(caps, str):
            self.launch.engine_label.setText(f"engine: {caps}")
            return
        self.capabilities = caps
        self.launch.engine_label.setText(
            f"engine: vLLM {caps.vllm_version} ({caps.platform}), torch {caps.torch_version}"
        )
        self.launch.form.set_supported(caps.flags)

    def _scan_hf_cache(self) -> None:
        from quantdeck.core.models import scan_hf_cache

        found = [(e.path, e.info) for e in scan_hf_cache() if e.info is not None]
        try:
            self.hf_models.emit(found)
        except RuntimeError:  # the window closed meanwhile
            pass

    def _on_hf_models(self, found: list[tuple[str, ModelInfo]]) -> None:
        for path, info in found:  # inspected in the worker: no file reads on the UI thread
            self.add_model(Path(path), info=info)

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
            from quantdeck.gui.monitor import MonitorPanel

            self._monitor = MonitorPanel()
            self._monitor_box.layout().addWidget(self._monitor)
            self._monitor.alert.connect(
                lambda msg: self.logs.add_event(StateEvent("alert", reason=msg))
            )
            self._monitor.open_button.clicked.connect(self._on_open_recording)
        return self._monitor

    @property
    def bench(self) -> Any:
        """The Benchmark tab (built on first use: pyqtgraph)."""
        if self._bench is None:
            from quantdeck.gui.bench_tab import BenchTab

            self._bench = BenchTab(
                lambda: (self.controller.url, self.controller.model_name, self.controller.api_key),
                self.launch.config,
                lambda: self.controller.state not in ("stopped", "crashed"),
            )
            self._bench_box.layout().addWidget(self._bench)
        return self._bench

    def _on_tab_changed(self, index: int) -> None:
        if self.tabs.widget(index) is self._bench_box:
            self.bench  # noqa: B018 (builds it)

    # -- library -----------------------------------------------------------------------------
    def add_model(self, path: Path, select: bool = False, info: ModelInfo | None = None) -> None:
        """Add a model folder to the library (``info``: already inspected, e.g. by a scan)."""
        for i in range(self.library.count()):
            if self.library.item(i).data(Qt.UserRole)[0] == str(path):
                if select:
                    self.library.setCurrentRow(i)
                return
        try:
            info = info or inspect_model(path)
            text = f"{path.name}   [{info.badge}]"
        except QuantdeckError as e:
            info, text = None, f"{path.name}   (unreadable)"
            self.library_info.setText(str(e))
        item = QListWidgetItem(text)
        item.setData(Qt.UserRole, (str(path), info))
        item.setToolTip(str(path))
        self.library.addItem(item)
        if select:
            self.library.setCurrentItem(item)

    def _scan_folder(self, folder: Path) -> None:
        from quantdeck.core.models import scan_folders

        try:
            for e in scan_folders([folder]):
                self.add_model(Path(e.path), info=e.info)
        except QuantdeckError as e:
            self.library_info.setText(str(e))

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

    def _on_library_changed(self, item: QListWidgetItem | None, _prev: Any) -> None:
        if item is None:
            return
        path, info = item.data(Qt.UserRole)
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
        kind = ev.kind
        if kind == "state":
            st = ev.get("state")
            colors = {
                "ready": "#2e7d32",
                "crashed": "#c62828",
                "stopped": "#777",
                "attached": "#2e7d32",
            }
            self.state_label.setText(
                f"<span style='color:{colors.get(st, '#ef6c00')}'>●</span> {st}"
            )
            if st in ("ready", "attached"):
                self.url_label.setText(self.controller.url or "")
                if st == "attached":
                    self.monitor.store.clear()
            elif st == "starting":
                self.monitor.store.clear()
            elif st in ("stopped", "crashed"):
                self.url_label.setText("")
            detail = ev.get("reason", "") if st == "crashed" else ""
            self.launch.set_server_state(st, detail)
            if st == "crashed":
                self.launch.message.setText(
                    f"The server crashed: {ev.get('reason', '')}. "
                    "Its last log lines are in the Logs tab."
                )
        elif kind == "progress":
            self.launch.set_progress(ev.get("stage"), ev.get("pct"))

    def _on_metrics(self, ev: MetricsEvent) -> None:
        self.monitor.add_event(ev)
        gpus = ev.get("gpus") or []
        if gpus:
            g = gpus[0]
            self.status_label.setText(
                f"{self.device.label} · util {g.get('utilization_pct')}% · "
                f"{(g.get('memory_used_bytes') or 0) / 2**30:.1f} GiB · {g.get('power_w')} W"
            )
        else:
            self.status_label.setText(
                f"{self.device.label} · CPU {ev.get('host_cpu_pct', 0):.0f}% · RAM "
                f"{ev.get('host_ram_used_bytes', 0) / 2**30:.1f} GiB"
            )

    def _on_server_error(self, msg: str) -> None:
        self.launch.message.setText(msg)
        self.logs.add_event(StateEvent("error", reason=msg))

    def _on_open_recording(self) -> None:
        from PySide6.QtWidgets import QFileDialog

        path, _ = QFileDialog.getOpenFileName(
            self, "Open a recording", "", "Recordings (*.jsonl *.jsonl.gz);;All files (*)"
        )
        if path:
            self.open_recording(path)

    def open_recording(self, path: str) -> int:
        """Replay a recording into the Monitor (and its facts into Logs); returns events."""
        from quantdeck.core.monitor import read_recording

        try:
            rec = read_recording(path)
        except QuantdeckError as e:
            self.launch.message.setText(str(e))
            return 0
        self.monitor.store.clear()
        for ev in rec.events:
            if ev.kind == "metrics":
                self.monitor.add_event(ev)
            elif ev.kind in ("state", "fact"):
                self.logs.add_event(ev)
        self.tabs.setCurrentWidget(self._monitor_box)
        self.monitor.refresh(force=True)
        self.status_label.setText(f"replay: {Path(path).name} ({rec.duration_s:.0f} s)")
        return len(rec.events)

    def closeEvent(self, ev: Any) -> None:
        from quantdeck.core.launch import to_yaml

        settings = gui_settings()
        settings.setValue("geometry", self.saveGeometry())
        try:
            settings.setValue("last_config", to_yaml(self.launch.config()))
        except QuantdeckError:
            pass
        if self._monitor is not None:
            self._monitor.timer.stop()
        self.convert.shutdown()
        if self._bench is not None and self._bench.job is not None:
            self._bench.job.cancel()
        self.controller.shutdown()
        super().closeEvent(ev)
