"""A live trial's candidate (Try live…): the instance's launch in the knob form, the diff
against it as it is edited, and the trial's options."""

from __future__ import annotations

from typing import TYPE_CHECKING

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QDoubleSpinBox,
    QFormLayout,
    QLineEdit,
    QScrollArea,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from quantdeck.core.errors import QuantdeckError
from quantdeck.gui.labels import error_label, plain_label
from quantdeck.gui.style import HINT_SHEET, PURPLE

if TYPE_CHECKING:
    from quantdeck.core.fleet.trial import TrialOptions
    from quantdeck.core.launch import LaunchConfig


class TryLiveDialog(QDialog):
    """The candidate of a live trial: the instance's launch in the knob form (the diff against
    it shown as it is edited), the goal, an SLO, how it is decided, the minimum requests and the
    time limit. OK sends ``submitted(cfg, opts)`` and waits: a refusal is shown here in one red
    line (the dialog stays open), a started trial closes it."""

    submitted = Signal(object, object)  # LaunchConfig, TrialOptions

    def __init__(
        self,
        name: str,
        running: LaunchConfig,
        parent: QWidget | None = None,
        *,
        candidate: LaunchConfig | None = None,
    ) -> None:
        """``candidate``: the knobs to start from (the Launch tab's form; its model, host,
        port and key are the instance's), else the running launch's."""
        from quantdeck.core.fleet.trial import DECIDE, GOALS
        from quantdeck.core.launch.diff import live_candidate
        from quantdeck.gui.knob_form import KnobForm

        super().__init__(parent)
        self.setWindowTitle(f"Try live: {name}")
        self.running = running.copy()
        self.form = KnobForm(skip=("model", "host", "port", "api_key"))  # the fleet's to give
        self.form.set_config(
            self.running if candidate is None else live_candidate(self.running, candidate)
        )
        scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setWidget(self.form)
        self.diff = plain_label()
        self.diff.setWordWrap(True)
        self.diff.setStyleSheet(f"color: {PURPLE}")
        self.goal = QComboBox()
        self.goal.addItems(list(GOALS))
        self.goal.setCurrentText("ttft_p99")
        self.slo = QLineEdit()
        self.slo.setPlaceholderText("none (e.g. ttft_p99<=500ms,itl_p99<=50ms)")
        self.slo.setToolTip("A breach by the candidate rolls it back at once; goodput's limits")
        self.decide = QComboBox()
        self.decide.addItems(list(DECIDE))
        self.decide.setToolTip("auto: the verdict decides; ask: you press Promote or Roll back")
        self.min_requests = QSpinBox()
        self.min_requests.setRange(5, 1_000_000)
        self.min_requests.setValue(30)
        self.min_requests.setSuffix(" per arm")
        self.max_duration = QDoubleSpinBox()
        self.max_duration.setRange(1, 86_400)
        self.max_duration.setDecimals(0)
        self.max_duration.setValue(300)
        self.max_duration.setSuffix(" s")
        self.probe = QCheckBox("send the same prompts to both arms (paired probe)")
        self.probe.setToolTip(
            "Each prompt to both arms, one right after the other, beside the live traffic: "
            "its pairs decide, so the router's split cannot sway the verdict. Off, it starts "
            "by itself when the live traffic is too thin to decide"
        )
        self.error = error_label()
        buttons = QDialogButtonBox(
            QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel
        )
        self.ok_button = buttons.button(QDialogButtonBox.StandardButton.Ok)
        self.ok_button.setText("Start trial")
        options = QFormLayout()
        options.addRow("Goal", self.goal)
        options.addRow("SLO", self.slo)
        options.addRow("Decide", self.decide)
        options.addRow("Min requests", self.min_requests)
        options.addRow("Max duration", self.max_duration)
        options.addRow("Probe", self.probe)
        note = plain_label(
            "The candidate starts on a port of its own beside the running instance and shares "
            "its traffic; nothing about the instance changes until the decision."
        )
        note.setWordWrap(True)
        note.setStyleSheet(HINT_SHEET)
        lay = QVBoxLayout(self)
        lay.addWidget(plain_label(f"The candidate's knobs (now: {name}'s launch)"))
        lay.addWidget(scroll, 1)
        lay.addWidget(self.diff)
        lay.addLayout(options)
        lay.addWidget(note)
        lay.addWidget(self.error)
        lay.addWidget(buttons)
        self.form.changed.connect(self._on_form_changed)
        buttons.accepted.connect(self.submit)
        buttons.rejected.connect(self.reject)
        self._on_form_changed()
        self.resize(640, 820)

    def _on_form_changed(self) -> None:
        try:
            self.diff.setText(diff_text(self.running, self.form.config()))
        except QuantdeckError as e:
            self.diff.setText(str(e))

    def options(self) -> TrialOptions:
        """The trial's options as the form says them; ConfigError names a bad one."""
        from quantdeck.core.fleet.trial import TrialOptions, parse_slo

        slo = self.slo.text().strip()
        return TrialOptions(
            goal=self.goal.currentText(),
            slo=parse_slo(slo) if slo else {},
            min_requests=self.min_requests.value(),
            max_duration_s=float(self.max_duration.value()),
            decide=self.decide.currentText(),
            probe=self.probe.isChecked(),
        )

    def submit(self) -> None:
        """Check the form; send the candidate and the options (the dialog waits)."""
        self.error.setText("")
        try:
            cfg, opts = self.form.config(), self.options()
        except QuantdeckError as e:
            self.error.setText(str(e))
            return
        self.set_busy(True)
        self.submitted.emit(cfg, opts)

    def set_busy(self, busy: bool) -> None:
        self.ok_button.setEnabled(not busy)
        self.ok_button.setText("Starting…" if busy else "Start trial")

    def refused(self, line: str) -> None:
        """The fleet refused the trial (nothing started): its one line, in red."""
        self.set_busy(False)
        self.error.setText(line)


def diff_text(running: LaunchConfig, cfg: LaunchConfig) -> str:
    """The candidate's knobs against the running launch, in one line."""
    from quantdeck.core.launch.diff import change_text, live_changes

    changed = live_changes(running, cfg)
    if not changed:
        return "no knob changed: the candidate is the running launch (an A/A trial)"
    return "changed: " + change_text(changed)
