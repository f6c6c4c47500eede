"""The Launch tab: the generated knob form, the live memory planner and the server actions."""

from __future__ import annotations

import html
import time
from pathlib import Path
from typing import Any

from PySide6.QtCore import QFileSystemWatcher, QSignalBlocker, Qt, QTimer, Signal
from PySide6.QtGui import QColor, QPainter
from PySide6.QtWidgets import (
    QApplication,
    QCheckBox,
    QComboBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QProgressBar,
    QPushButton,
    QScrollArea,
    QVBoxLayout,
    QWidget,
)

from quantdeck.core.errors import QuantdeckError
from quantdeck.core.events import Event, FactEvent, PlanEvent, ProgressEvent, StateEvent
from quantdeck.core.http import plain_http_warning
from quantdeck.core.launch import (
    DeviceFacts,
    Finding,
    GiB,
    KvPlan,
    LaunchConfig,
    advise,
    command_line,
    engine_checks,
    fit_to_engine,
    local_vllm_version,
    plan,
    profiles,
    validate,
)
from quantdeck.core.launch.diff import live_changes
from quantdeck.core.models import ModelInfo
from quantdeck.gui.engine_picker import EnginePicker
from quantdeck.gui.knob_form import KnobForm
from quantdeck.gui.labels import error_label, plain_label
from quantdeck.gui.style import ERROR, FREE_MEMORY, QUIET_TEXT, SERIES_COLORS, WARNING

BEHIND_ROUTER_TIP = (
    "Serve as a fleet of one behind vLLM's router on the form's port: the URL clients use "
    "stays the same across live trials, promotions and undo, and knob changes go through "
    "Try live… without downtime. The fleet shows in the Fleet tab. "
    "CLI: quantdeck serve MODEL --behind-router"
)
TRY_LIVE_TIP = (
    "Try the form's knobs on the live traffic: a candidate beside the running server, "
    "promoted or rolled back by the verdict, the URL unchanged (opens the trial in the "
    "Fleet tab). CLI: quantdeck fleet try FILE serve --KNOB VALUE"
)
ROUTER_INSTANCE = "serve"  # the fleet of one's instance (core.fleet.spec.fleet_of_one's)
STATE_NAMES = {
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

SEGMENTS = (
    ("weights", "weights_bytes", SERIES_COLORS[0]),
    ("activations", "activation_bytes", SERIES_COLORS[1]),
    ("CUDA graphs", "cudagraph_bytes", SERIES_COLORS[2]),
    ("non-torch", "non_torch_bytes", SERIES_COLORS[3]),
    ("KV cache", "kv_cache_bytes", SERIES_COLORS[4]),
    ("free", "free_bytes", FREE_MEMORY),
)


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
        self.figures.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.advice = QLabel()
        self.advice.setWordWrap(True)
        # the running server's launch: what the planner said for it beside what the engine
        # reported once it had measured (its log's KV cache size and maximum concurrency)
        self.engine = plain_label()
        self.engine.setWordWrap(True)
        self.engine.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        for w in (
            QLabel("<b>Memory plan</b>"),
            self.bar,
            self.legend,
            self.figures,
            self.advice,
            self.engine,
        ):
            lay.addWidget(w)
        lay.addStretch(1)
        self.legend.setText(
            "  ".join(f"<span style='color:{c}'>■</span> {n}" for n, _, c in SEGMENTS)
        )

    def show_engine(self, planned: dict[str, Any], facts: dict[str, Any], state: str) -> None:
        """The running launch's plan beside the engine's own figures (empty: no server of
        this panel's, or one that has not reported them yet)."""
        checks = engine_checks(planned, facts)
        if not planned or state in ("stopped", "attached"):
            self.engine.setText("")
            return
        head = "Running server" if state == "ready" else f"This launch ({state})"
        lines = [c.describe() for c in checks]
        if not checks:
            lines = ["the engine reports its KV cache size and concurrency once it has measured"]
        at = facts.get("max_model_len")
        if at and checks:
            lines.append(f"concurrency at {int(at):,} tokens a request")
        self.engine.setText(head + " — the plan against the engine:\n" + "\n".join(lines))

    def show_plan(self, p: KvPlan | None, findings: list[Any], error: str | None) -> None:
        self.bar.set_plan(p)
        if error:
            self.figures.setText(f"<span style='color:{ERROR}'>{html.escape(error)}</span>")
            self.advice.setText("")
            return
        assert p is not None
        from quantdeck.core.launch.planner import same_groups

        fits = p.fits and not any(f.level == "error" for f in findings)
        # a hybrid's groups (sliding, full, Mamba...) each take a block per layer: blocks x
        # block size is not its token count, so the tokens are shown on their own
        groups = "".join(
            f"<br>&nbsp;&nbsp;{n} × {html.escape(g.kind)} ({g.layers} layers"
            + (f", window {g.window}" if g.window else "")
            + f", {g.blocks_per_seq} blocks/seq)"
            for n, g in (same_groups(p.groups) if len(p.groups) > 1 else [])
        )
        self.figures.setText(
            f"{html.escape(p.device)}<br>"
            f"weights {p.weights_bytes / GiB:.2f} GiB · KV cache {p.kv_cache_bytes / GiB:.2f} GiB"
            f"<br>KV blocks {p.num_blocks:,} of {p.block_size} tokens; "
            f"{p.kv_cache_tokens:,} tokens{groups}"
            f"<br>max concurrency {p.max_concurrency}× at {p.max_model_len} tokens"
            f"<br><b>{'fits' if fits else 'does not fit'}</b>"
        )
        self.advice.setText(
            "<br>".join(
                f"<span style='color:{ERROR if f.level == 'error' else WARNING}'>{f.level}: "
                f"{html.escape(f.message)}</span>"
                for f in findings
            )
        )


class LaunchTab(QWidget):
    """Form + planner, the eager toggle up front, actions: start / stop / restart, copy the
    ``vllm serve`` command, profiles, attach to a URL."""

    start_requested = Signal(object)  # LaunchConfig
    router_start_requested = Signal(object)  # LaunchConfig, to serve behind the router
    router_restart_requested = Signal()  # the fleet of one's instance is down: start it again
    try_live_requested = Signal(object)  # LaunchConfig: the candidate's knobs
    stop_requested = Signal()
    attach_requested = Signal(str, str)  # url, api key
    profile_model_requested = Signal(str)  # a loaded profile's model folder

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
        self.engine_box = EnginePicker(
            "The Python whose vLLM serves: register others with `quantdeck engines add PATH`"
        )
        self.engine_label = plain_label("engine: probing…")
        self.engine_label.setStyleSheet(f"color:{QUIET_TEXT}")
        self.eager = QCheckBox("Eager mode (no CUDA graphs / torch.compile)")
        self.eager.setStyleSheet("font-size: 13pt; font-weight: bold")
        self.eager_note = QLabel()
        self.eager_note.setWordWrap(True)
        self.advanced = QCheckBox("Show advanced knobs")
        # every other option of the chosen engine's parser (once it is probed)
        self.engine_caps: Any = None
        self.all_options = QPushButton("All engine options…")
        self.all_options.setEnabled(False)
        # the form's settings against the chosen engine, as `quantdeck serve --profile F
        # --engine NAME` checks them (core.launch.migrate): the vLLM version they were made
        # for (a profile's record, then the engine they were last fit for), the last
        # migration's notes, and the engine's refusal (Start is refused with it)
        self._settings_for: str | None = None
        self._profile_name: str | None = None  # a loaded profile's, not yet fit for an engine
        self._probing = False  # the chosen engine is being probed: nothing checked yet
        self._refusal: str | None = None
        self._notes: tuple[str, ...] = ()
        self._notes_head = ""
        self.engine_note = plain_label()
        self.engine_note.setWordWrap(True)
        self.engine_note.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.engine_note.setVisible(False)
        self.engine_error = error_label()
        self.engine_error.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.engine_error.setVisible(False)
        self.start_button = QPushButton("Start")
        self.behind_router = QCheckBox("Behind the router")
        self.behind_router.setToolTip(BEHIND_ROUTER_TIP)
        self.stop_button = QPushButton("Stop")
        self.restart_button = QPushButton("Restart")
        self.try_live_button = QPushButton("Try live…")
        self.try_live_button.setEnabled(False)
        # behind the router: the phase of the Launch tab's fleet of one (None: a plain server
        # or none), its state line, and the instance's running launch Try live… compares the
        # form with (None: why not, in _live_why)
        self._router: str | None = None
        self._router_text = ""
        self._live_running: LaunchConfig | None = None
        self._live_why = "check Behind the router and Start: Try live… changes its knobs"
        self.router_error = error_label()
        self.router_error.setVisible(False)
        self.copy_button = QPushButton("Copy `vllm serve` command")
        self.stage = plain_label("stopped")
        # wrapped: a long line takes two lines rather than widening the window
        self.stage.setWordWrap(True)
        # a start shows its sub-stage and the time since the click, ticking once a second (a
        # CPU engine spends most of a minute importing before its first stage)
        self._stage_text = "stopped"
        self._started_at: float | None = None
        self._elapsed = QTimer(self)
        self._elapsed.setInterval(1000)
        self._elapsed.timeout.connect(self._show_stage)
        self.progress = QProgressBar()
        self.progress.setRange(0, 100)
        self.profiles = QComboBox()
        self.profiles.setEditable(True)
        self.profiles.setPlaceholderText("profile name")
        self.save_profile = QPushButton("Save")
        self.load_profile = QPushButton("Load")
        self.delete_profile = QPushButton("Delete")
        self.remember_key = QCheckBox("Remember API key")
        self.remember_key.setToolTip("Keep the key in the system keyring (never in the profile)")
        self.attach_url = QLineEdit()
        self.attach_url.setPlaceholderText("http://host:8000 — monitor a server you do not own")
        self.attach_key = QLineEdit()
        self.attach_key.setPlaceholderText("API key (optional)")
        self.attach_key.setEchoMode(QLineEdit.EchoMode.Password)
        self.attach_button = QPushButton("Attach")
        self.message = plain_label()
        self.message.setWordWrap(True)

        top = QVBoxLayout()
        top.addWidget(self.model_label)
        engine_row = QHBoxLayout()
        engine_row.addWidget(QLabel("Engine"))
        engine_row.addWidget(self.engine_box)
        engine_row.addWidget(self.engine_label, 1)
        top.addLayout(engine_row)
        top.addWidget(self.eager)
        top.addWidget(self.eager_note)
        scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setWidget(self.form)
        left = QVBoxLayout()
        left.addLayout(top)
        knob_row = QHBoxLayout()
        knob_row.addWidget(self.advanced)
        knob_row.addStretch(1)
        knob_row.addWidget(self.all_options)
        left.addLayout(knob_row)
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
            self.remember_key,
        ):
            prof.addWidget(w)
        right.addLayout(prof)
        att = QHBoxLayout()
        for aw in (self.attach_url, self.attach_key, self.attach_button):
            att.addWidget(aw)
        right.addLayout(att)
        actions = QHBoxLayout()
        for w in (
            self.start_button,
            self.behind_router,
            self.stop_button,
            self.restart_button,
            self.try_live_button,
        ):
            actions.addWidget(w)
        actions.addWidget(self.stage, 1)
        actions.addWidget(self.progress, 1)
        actions.addWidget(self.copy_button)
        body = QHBoxLayout()
        body.addLayout(left, 3)
        body.addLayout(right, 2)
        lay = QVBoxLayout(self)
        lay.addLayout(body, 1)
        lay.addWidget(self.engine_note)
        lay.addWidget(self.engine_error)
        lay.addWidget(self.router_error)
        lay.addWidget(self.message)
        lay.addLayout(actions)

        self.form.changed.connect(self._on_form_changed)
        self.eager.toggled.connect(self._on_eager_changed)
        self.advanced.toggled.connect(self.form.set_advanced_visible)
        self.form.set_advanced_visible(False)
        self.start_button.clicked.connect(self._on_start_clicked)
        self.restart_button.clicked.connect(self._on_restart_clicked)
        self.stop_button.clicked.connect(self.stop_requested.emit)
        self.try_live_button.clicked.connect(self._on_try_live_clicked)
        self.behind_router.toggled.connect(lambda _on: self.refuse(""))
        self.copy_button.clicked.connect(self._on_copy_clicked)
        self.all_options.clicked.connect(self._on_all_options)
        self.save_profile.clicked.connect(self._on_save_profile)
        self.load_profile.clicked.connect(self._on_load_profile)
        self.delete_profile.clicked.connect(self._on_delete_profile)
        self.attach_button.clicked.connect(self._on_attach_clicked)
        # the list follows the profiles folder: a profile saved elsewhere (the Benchmark tab's
        # tuning, the CLI) shows up without a relay
        self._profiles_watch = QFileSystemWatcher(self)
        self._profiles_watch.directoryChanged.connect(self._on_profiles_folder_changed)
        self._on_profiles_folder_changed()
        self._planned: dict[str, Any] = {}  # the running launch's plan (its PlanEvent)
        self._facts: dict[str, Any] = {}  # what its engine reported (FactEvents)
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

    def set_config(
        self, cfg: LaunchConfig, *, saved_with: str | None = None, profile: str | None = None
    ) -> None:
        """Put ``cfg`` in the form: settings made for vLLM ``saved_with`` (None: not known),
        from the profile named ``profile`` (None: from none). They are fit for the chosen
        engine at once where it is probed, else once it is (:meth:`set_engine`)."""
        self._settings_for, self._profile_name = saved_with, profile
        self._notes, self._notes_head = (), ""
        self.form.set_config(cfg)
        self._show_extra_count()
        self._on_form_changed()

    def set_engine(self, caps: Any) -> None:
        """The chosen engine's probe (None while it is probed; Start waits for it): its flags
        grey out the knobs it lacks, its parser fills the All engine options page, and the
        form's settings are fit for its vLLM version (migrated with a note, or refused)."""
        self.engine_caps = caps
        self._probing = caps is None
        self._notes, self._notes_head = (), ""  # the last engine's: a new check follows
        self._refusal = None
        if caps is None:
            self.form.set_supported(None)
        else:
            self.form.set_supported(caps.flags, caps.label)
        self.all_options.setEnabled(caps is not None and bool(getattr(caps, "options", None)))
        self._show_extra_count()
        self._on_form_changed()

    def set_engine_problem(self, reason: str) -> None:
        """The chosen engine could not be probed (``reason``, which the engine line shows):
        nothing to wait for; a start says the same, before any server."""
        self.engine_caps = None
        self._probing = False
        self.form.set_supported(None)
        self.all_options.setEnabled(False)
        self._on_form_changed()

    def _fit_to_engine(self) -> None:
        """The form's settings against the chosen engine's own parser, from the vLLM version
        they were made for (:func:`~quantdeck.core.launch.migrate.fit_to_engine`, as the CLI
        before a launch): renamed options take the engine's names and options removed without
        effect go, the form taking the result and a note saying what moved; what the engine
        cannot take is its one-line refusal, the form left as it was."""
        caps = self.engine_caps
        if caps is None:
            self._show_fit()
            return
        try:
            cfg = self.config()
        except QuantdeckError:  # a value the form cannot read: the planner names it
            return
        saved, profile = self._settings_for, self._profile_name
        try:
            fitted, notes = fit_to_engine(
                cfg, saved_with=saved, target=caps, profile=profile is not None
            )
        except QuantdeckError as e:
            self._refusal = str(e)
            self._notes, self._notes_head = (), ""
        else:
            self._refusal = None
            if saved != caps.vllm_version or profile is not None:  # (not an edit's recheck)
                # the head names the engine; each note then says its version, not its label
                target = f"vLLM {caps.vllm_version}"
                self._notes = tuple(n.replace(caps.label, target) for n in notes)
                made_for = f"saved with vLLM {saved}" if saved else "its vLLM not recorded"
                made = (
                    f"Profile '{profile}' ({made_for})"
                    if profile is not None
                    else (f"Settings made for vLLM {saved}" if saved else "The settings")
                )
                name = f" (engine '{caps.name}')" if caps.name else ""
                self._notes_head = f"{made} migrated to {target}{name}:"
            if fitted != cfg:
                self.form.set_config(fitted)
                self._show_extra_count()
            self._settings_for, self._profile_name = caps.vllm_version, None
        self.form.set_supported(caps.flags, caps.label)  # a knob set back greys out
        self._show_fit()

    def _show_fit(self) -> None:
        notes = "\n".join(f"• {n}" for n in self._notes)
        self.engine_note.setText(f"{self._notes_head}\n{notes}" if notes else "")
        self.engine_note.setVisible(bool(notes))
        self.engine_error.setText(self._refusal or "")
        self.engine_error.setVisible(bool(self._refusal))

    def _show_extra_count(self) -> None:
        n = len(self.form.extra_args())
        self.all_options.setText("All engine options…" + (f" ({n} set)" if n else ""))

    def engine_options_dialog(self) -> Any:
        from quantdeck.gui.engine_options import EngineOptionsDialog

        return EngineOptionsDialog(self.engine_caps, self.form.extra_args(), self)

    def _on_all_options(self) -> None:
        dialog = self.engine_options_dialog()
        if dialog.exec():
            self.form.set_extra_args(dialog.values())
            self._show_extra_count()

    def _on_eager_changed(self, on: bool) -> None:
        ed = self.form.editors["enforce_eager"]
        if ed.value() != on:
            ed.set_value(on)
            self._on_form_changed()

    def _on_form_changed(self) -> None:
        self._fit_to_engine()
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
            p = plan(cfg, self.info, self.device, vllm_version=local_vllm_version())
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
    def follow(self, controller: Any) -> None:
        """Take a :class:`~quantdeck.gui.server_control.QtServerController`'s states, progress,
        plan and facts (the tab subscribes itself: the window does not relay)."""
        controller.event.connect(self._on_server_event)

    def _on_server_event(self, ev: Event) -> None:
        match ev:
            case PlanEvent(plan=planned):  # a start: its plan, the engine's figures to come
                self._planned, self._facts = dict(planned), {}
            case FactEvent(name=name, value=value):
                self._facts[name] = value
            case ProgressEvent(stage=stage, pct=pct):
                self.set_progress(stage, pct)
            case StateEvent(state=state, reason=reason):
                why = reason if isinstance(reason, str) else ""
                self.set_server_state(state, why if state == "crashed" else "")
                if state == "crashed":
                    self.message.setText(
                        f"The server crashed: {why}. Its last log lines are in the Logs tab."
                    )
            case _:
                return
        self.planner.show_engine(self._planned, self._facts, self._state)

    def _blocking(self) -> list[str]:
        out = [f.message for f in self.findings if f.level == "error"]
        if self._refusal:
            out.insert(0, self._refusal)
        elif self._probing:
            out.append("the settings are checked against the chosen engine once it is probed")
        return out

    def _update_start(self) -> None:
        blocked = self._blocking()
        idle = self._state in ("stopped", "crashed")
        routed = self._router is not None  # the fleet of one runs: Stop stops it
        self.start_button.setEnabled(idle and not routed and self.info is not None and not blocked)
        self.restart_button.setEnabled(
            (not idle and not routed and self.info is not None and not blocked)
            or self._router == "down"  # the fleet of one's instance down: started again
        )
        self.stop_button.setEnabled(
            self._router not in (None, "stopping") or (not routed and not idle)
        )
        self.behind_router.setEnabled(idle and not routed)
        self.start_button.setToolTip(blocked[0] if blocked else "")
        self.restart_button.setToolTip(
            "Start the fleet of one's instance again, as it was launched"
            if self._router == "down"
            else "Behind the router a knob change goes through Try live…, without downtime "
            "(Stop then Start restarts the fleet of one)"
            if routed
            else ""
        )
        self._update_try_live()

    def set_server_state(self, state: str, detail: str = "") -> None:
        self._state = state
        text = STATE_NAMES.get(state, state) + (f" — {detail}" if detail else "")
        if self._router is None:  # (behind the router, the fleet's phase is the state line)
            if state == "starting" and self._started_at is None:
                self._started_at = time.monotonic()
                self._elapsed.start()
            if state == "ready" and self._started_at is not None:
                text += f" in {time.monotonic() - self._started_at:.0f} s"
            if state in ("ready", "stopped", "crashed", "attached", "stopping"):
                self._started_at = None
                self._elapsed.stop()
            # the server's package is loaded by the time it reports a state
            from quantdeck.core.runtime import START_ORDER as order

            if state in order:
                self.progress.setValue(int(100 * order.index(state) / (len(order) - 1)))
            elif state in ("stopped", "crashed"):
                self.progress.setValue(0)
        self._show_stage(text)
        self._update_start()

    # -- behind the router -----------------------------------------------------------------------
    def set_router_state(
        self, phase: str | None, url: str = "", instance: str = "", why: str = ""
    ) -> None:
        """The Launch tab's fleet of one (``serve --behind-router``): its ``phase`` (starting,
        serving, stopping, or while it runs its health: degraded, down; None or another: it
        does not run), the router's ``url`` (the one clients use), its instance's state while
        it starts, and ``why`` it is degraded or down (core/fleet/health.py)."""
        was = self._router
        running = ("starting", "serving", "degraded", "down", "stopping")
        self._router = phase if phase in running else None
        if self._router == "starting":
            if self._started_at is None:
                self._started_at = time.monotonic()
                self._elapsed.start()
            step = f": {ROUTER_INSTANCE} {STATE_NAMES.get(instance, instance)}" if instance else ""
            self._router_text = f"starting behind the router{step}"
            from quantdeck.core.runtime import START_ORDER as order

            if instance in order:
                self.progress.setValue(int(90 * order.index(instance) / (len(order) - 1)))
        elif self._router == "serving":
            self._router_text = f"serving behind the router at {url}\nits fleet of one: Fleet tab"
            self.progress.setValue(100)
        elif self._router in ("degraded", "down"):
            self._router_text = (
                f"{self._router} behind the router at {url}: {why}\n"
                "its fleet of one: Fleet tab (Start the instance there, or Stop here)"
            )
        elif self._router == "stopping":
            self._router_text = "stopping the fleet of one"
        else:
            self._router_text = ""
            if was is not None:
                self.progress.setValue(0)
        if self._router != "starting":
            self._started_at = None
            self._elapsed.stop()
        self.progress.setVisible(self._router in ("starting", "stopping"))  # else: room
        self._show_stage()
        self._update_start()

    def refuse(self, line: str) -> None:
        """A start behind the router refused (or "": none): one red line."""
        self.router_error.setText(line)
        self.router_error.setVisible(bool(line))

    def set_live_target(self, running: LaunchConfig | None, why: str = "") -> None:
        """The running launch of the fleet of one's instance, which Try live… compares the
        form with (None: Try live… is off, ``why`` says why in its tooltip)."""
        if running is self._live_running and why == self._live_why:
            return
        self._live_running, self._live_why = running, why
        self._update_try_live()

    def live_blocker(self) -> str:
        """Why Try live… is off now ("": it is on)."""
        running = self._live_running
        if running is None:
            return self._live_why or "the fleet of one does not serve"
        try:
            cfg = self.config()
        except QuantdeckError as e:
            return str(e)
        if Path(cfg.model.model).resolve() != Path(running.model.model).resolve():
            return (
                f"the form's model is not the one served ({Path(running.model.model).name}): "
                "a live trial changes knobs; Stop, then Start serves another model"
            )
        if not live_changes(running, cfg):  # the knobs a trial would change
            return "the form's knobs are the running launch's: change one to try it live"
        return ""

    def _update_try_live(self) -> None:
        why = self.live_blocker()
        self.try_live_button.setEnabled(not why)
        self.try_live_button.setToolTip(TRY_LIVE_TIP if not why else f"{why}.\n\n{TRY_LIVE_TIP}")

    def _on_try_live_clicked(self) -> None:
        why = self.live_blocker()
        if why:
            self.message.setText(why)
            return
        self.try_live_requested.emit(self.config())

    def set_progress(self, stage: str, pct: float) -> None:
        if stage == "loading_weights":
            self._show_stage(f"loading weights {pct:.0f}%")
            self.progress.setValue(int(20 * (1 + pct / 100)))

    def _show_stage(self, text: str | None = None) -> None:
        """The stage line: the sub-stage, and while starting the seconds since the click."""
        if text is not None:
            self._stage_text = text
        elapsed = ""
        if self._started_at is not None:
            elapsed = f" · {time.monotonic() - self._started_at:.0f} s"
        self.stage.setText((self._router_text or self._stage_text) + elapsed)

    def _on_restart_clicked(self) -> None:
        if self._router == "down":  # the fleet of one's instance, as it was launched
            self.router_restart_requested.emit()
        else:
            self._on_start_clicked()

    def _on_start_clicked(self) -> None:
        blocked = self._blocking()
        if blocked:  # (the button is off then; a click that got through says why)
            self.message.setText(blocked[0])
            return
        try:
            cfg = validate(self.config())
        except QuantdeckError as e:
            self.message.setText(str(e))
            return
        self.message.setText("")
        self.refuse("")
        if self.behind_router.isChecked():
            self.router_start_requested.emit(cfg)
        else:
            self.start_requested.emit(cfg)

    def _on_copy_clicked(self) -> None:
        try:
            text = command_line(validate(self.config()))  # the key shows as ***
        except QuantdeckError as e:
            self.message.setText(str(e))
            return
        QApplication.clipboard().setText(text)
        self.message.setText(f"copied: {text}")

    # -- profiles ----------------------------------------------------------------------------
    def refresh_profiles(self) -> None:
        """Read the list of saved profiles again (the name typed or chosen stays)."""
        names = profiles.list_profiles()
        if names == [self.profiles.itemText(i) for i in range(self.profiles.count())]:
            return  # unchanged: leave what is being typed alone
        current = self.profiles.currentText()
        self.profiles.clear()
        self.profiles.addItems(names)
        self.profiles.setCurrentText(current)

    def select_profile(self, name: str) -> None:
        """Choose the saved profile ``name`` and load it into the form (as Load does)."""
        self.refresh_profiles()
        self.profiles.setCurrentText(name)
        self._on_load_profile()

    def _on_profiles_folder_changed(self, *_: str) -> None:
        # watch the profiles folder, or while it does not exist the nearest folder above it
        # that does (its creation is a change there); then read the list
        folder = profiles.profiles_dir()
        watch = next((p for p in (folder, *folder.parents) if p.is_dir()), None)
        if watch is not None and str(watch) not in self._profiles_watch.directories():
            stale = self._profiles_watch.directories()
            if stale:
                self._profiles_watch.removePaths(stale)
            self._profiles_watch.addPath(str(watch))
        self.refresh_profiles()

    def _on_attach_clicked(self) -> None:
        url, key = self.attach_url.text().strip(), self.attach_key.text().strip()
        self.message.setText(plain_http_warning(url, key) or "")
        self.attach_requested.emit(url, key)

    def _on_save_profile(self) -> None:
        name = self.profiles.currentText().strip()
        try:
            cfg = self.config()
            # the vLLM the settings are made for: the engine they were last fit for (or the
            # loaded profile's record; None: the vLLM installed beside Quantdeck)
            path = profiles.save_profile(name, cfg, vllm_version=self._settings_for)
            self.message.setText(f"saved {path} (without the API key)")
        except QuantdeckError as e:
            self.message.setText(str(e))
            return
        finally:
            self.refresh_profiles()
        if self.remember_key.isChecked() and cfg.server.api_key:
            problem = profiles.remember_key(name, cfg.server.api_key)
            if problem:  # said once: the box goes off and stays off
                self.remember_key.setChecked(False)
                self.remember_key.setEnabled(False)
                self.remember_key.setToolTip(problem)
                self.message.setText(f"saved {path}; {problem}")

    def _on_load_profile(self) -> None:
        name = self.profiles.currentText().strip()
        try:
            cfg, saved_with = profiles.read_profile(name)
        except QuantdeckError as e:
            self.message.setText(str(e))
            return
        if cfg.server.api_key is None:  # none remembered: keep the one typed in
            cfg.server.api_key = self.form.editors["api_key"].value()
        self.set_config(cfg, saved_with=saved_with, profile=name)
        if cfg.model.model and cfg.model.model != self.model_path:
            self.profile_model_requested.emit(cfg.model.model)
        self.message.setText(f"loaded profile {self.profiles.currentText()}")

    def _on_delete_profile(self) -> None:
        try:
            profiles.delete_profile(self.profiles.currentText().strip())
            self.message.setText("deleted")
        except QuantdeckError as e:
            self.message.setText(str(e))
        self.refresh_profiles()
