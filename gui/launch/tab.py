"""The Launch tab: the generated knob form, the live memory planner and the server actions.

Its parts: the memory plan (:mod:`.planner`), the saved profiles (:mod:`.profiles`) and the
server actions with their state line (:mod:`.state`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from PySide6.QtCore import QSignalBlocker, Qt, Signal
from PySide6.QtWidgets import (
    QApplication,
    QCheckBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
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
    LaunchConfig,
    advise,
    fit_to_engine,
    launch_plan,
    local_vllm_version,
    plan,
    validate,
)
from quantdeck.core.models import ModelInfo
from quantdeck.gui.engine_picker import EnginePicker
from quantdeck.gui.knob_form import KnobForm
from quantdeck.gui.labels import error_label, plain_label
from quantdeck.gui.launch.planner import PlannerPanel
from quantdeck.gui.launch.profiles import ProfilesBar
from quantdeck.gui.launch.state import ServerActions
from quantdeck.gui.style import QUIET_TEXT


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
        # the action buttons and the state line (their state is the server's, or behind the
        # router its fleet of one's), then the saved profiles
        has_model = lambda: self.info is not None
        a = self.server_actions = ServerActions(self.config, self._blocking, has_model, self)
        self.start_button, self.behind_router = a.start_button, a.behind_router
        self.stop_button, self.restart_button = a.stop_button, a.restart_button
        self.try_live_button = a.try_live_button
        self.stage, self.progress, self.router_error = a.stage, a.progress, a.router_error
        self.copy_button = QPushButton("Copy launch command")
        self.copy_button.setToolTip(
            "The command Start runs for this form, word for word: Quantdeck's launcher around "
            "vLLM's `vllm serve` options, the environment it adds (a secret as ***), the values "
            "the start chooses (ports, the run folder) as placeholders. The same line: "
            "`quantdeck command MODEL [knobs] --as-run`"
        )
        pb = self.profile_bar = ProfilesBar(self.config, lambda: self._settings_for)
        self.profiles, self.remember_key = pb.profiles, pb.remember_key
        self.save_profile, self.load_profile = pb.save_profile, pb.load_profile
        self.delete_profile = pb.delete_profile
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
        right.addWidget(self.profile_bar)
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
        self.copy_button.clicked.connect(self._on_copy_clicked)
        self.all_options.clicked.connect(self._on_all_options)
        self.profile_bar.loaded.connect(self._on_profile_loaded)
        self.profile_bar.said.connect(self.message.setText)
        self.attach_button.clicked.connect(self._on_attach_clicked)
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
            self.server_actions.update_buttons()
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
        self.server_actions.update_buttons()

    # -- server state ------------------------------------------------------------------------
    def follow(self, controller: Any) -> None:
        """Take a :class:`~quantdeck.gui.server_control.QtServerController`'s states, progress,
        plan and facts, its errors (the message line) and the end of its actions (a start that
        failed before the server said anything leaves it stopped, Start enabled again): the
        tab subscribes itself, the window does not relay."""
        controller.event.connect(self._on_server_event)
        controller.error.connect(self.message.setText)
        controller.idle.connect(lambda: self.set_server_state(controller.state))

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
        if self.server_actions.router is None:  # behind the router: its instance's, below
            self.planner.show_engine(self._planned, self._facts, self.server_actions.state)

    def show_instance_engine(
        self, planned: dict[str, Any], facts: dict[str, Any], state: str
    ) -> None:
        """Behind the router: the instance's plan against its engine's figures, the block a
        plain start shows (``state``: the instance's; stopped clears it)."""
        self.planner.show_engine(planned, facts, state)

    def _blocking(self) -> list[str]:
        out = [f.message for f in self.findings if f.level == "error"]
        if self._refusal:
            out.insert(0, self._refusal)
        elif self._probing:
            out.append("the settings are checked against the chosen engine once it is probed")
        return out

    # -- server state (the actions' own: :class:`~quantdeck.gui.launch.state.ServerActions`) ----
    def set_server_state(self, state: str, detail: str = "") -> None:
        self.server_actions.set_server_state(state, detail)

    def set_router_state(
        self, phase: str | None, url: str = "", instance: str = "", why: str = ""
    ) -> None:
        """The Launch tab's fleet of one: :meth:`ServerActions.set_router_state`."""
        self.server_actions.set_router_state(phase, url, instance, why)

    def refuse(self, line: str) -> None:
        """A start behind the router refused (or "": none): one red line."""
        self.server_actions.refuse(line)

    def set_live_target(self, running: LaunchConfig | None, why: str = "") -> None:
        """The running launch Try live… compares the form with (None: off, ``why``)."""
        self.server_actions.set_live_target(running, why)

    def live_blocker(self) -> str:
        """Why Try live… is off now ("": it is on)."""
        return self.server_actions.live_blocker()

    def set_progress(self, stage: str, pct: float) -> None:
        self.server_actions.set_progress(stage, pct)

    def _on_try_live_clicked(self) -> None:
        why = self.live_blocker()
        if why:
            self.message.setText(why)
            return
        self.try_live_requested.emit(self.config())

    def _on_restart_clicked(self) -> None:
        if self.server_actions.router == "down":  # the fleet of one's instance, as it was launched
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
        """Copy the server's launch as Start would run it (its launch plan): the key shows as
        ``***``, the values the start chooses (ports, the run folder) as placeholders."""
        caps = self.engine_caps
        if caps is None:  # the command line follows the engine's options
            self.message.setText("the engine is not probed yet: copy once it is")
            return
        try:
            from quantdeck.core.runtime import EngineEnv

            chosen = self.engine_box.python()  # as the controller starts it
            python = (EngineEnv(chosen) if chosen else EngineEnv()).python
            text = launch_plan(self.config(), caps, self.device, python=python).shell_line()
        except QuantdeckError as e:
            self.message.setText(str(e))
            return
        QApplication.clipboard().setText(text)
        self.message.setText(f"copied: {text}")

    # -- profiles (the bar's own: :class:`~quantdeck.gui.launch.profiles.ProfilesBar`) -------
    def select_profile(self, name: str) -> None:
        """Choose the saved profile ``name`` and load it into the form (as Load does)."""
        self.profile_bar.select_profile(name)

    def _on_profile_loaded(self, cfg: LaunchConfig, saved_with: str | None, name: str) -> None:
        if cfg.server.api_key is None:  # none remembered: keep the one typed in
            cfg.server.api_key = self.form.editors["api_key"].value()
        self.set_config(cfg, saved_with=saved_with, profile=name)
        if cfg.model.model and cfg.model.model != self.model_path:
            self.profile_model_requested.emit(cfg.model.model)

    def _on_attach_clicked(self) -> None:
        url, key = self.attach_url.text().strip(), self.attach_key.text().strip()
        self.message.setText(plain_http_warning(url, key) or "")
        self.attach_requested.emit(url, key)
