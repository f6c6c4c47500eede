"""The Benchmark tab's A/B page: arms, each the Launch tab's config with options on top,
started, warmed, measured and stopped in turn (:class:`quantdeck.core.bench.ab.ABRun`). What
each arm changes against the Launch tab is shown before they run; arms that cannot be told
apart are refused in plain view (:func:`quantdeck.core.bench.check_arms`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QPlainTextEdit, QVBoxLayout, QWidget

from quantdeck.core.errors import QuantdeckError
from quantdeck.core.events import Event
from quantdeck.core.launch import LaunchConfig
from quantdeck.gui.bench.columns import DEFAULT_ARMS, diff_text, wrapped
from quantdeck.gui.bench.load_form import LoadForm
from quantdeck.gui.labels import plain_label
from quantdeck.gui.style import ERROR

if TYPE_CHECKING:
    from quantdeck.core.bench import ABRun


class ABPage(QWidget):
    """The A/B page; ``launch_config()`` gives the Launch tab's config, the arms' base."""

    checked = Signal()  # the arms were checked again (arm_warning says why they cannot run)

    def __init__(
        self, launch_config: Callable[[], LaunchConfig], parent: QWidget | None = None
    ) -> None:
        super().__init__(parent)
        self._launch_config = launch_config
        self.diffs: dict[str, str] = {}  # the last A/B run's arms: what each changes
        self.arms = QPlainTextEdit()
        self.arms.setPlaceholderText(
            "one arm per line: LABEL = OPTIONS\neager = --enforce-eager\n"
            "graphs = --no-enforce-eager"
        )
        self.arms.setPlainText(DEFAULT_ARMS)
        # what each arm changes against the Launch tab, and a refusal in plain view
        self.arm_diffs = plain_label()
        self.arm_diffs.setWordWrap(True)
        self.arm_warning = plain_label()
        self.arm_warning.setWordWrap(True)
        self.arm_warning.setStyleSheet(f"color:{ERROR}; font-weight:bold")
        al = QVBoxLayout(self)
        al.addWidget(
            wrapped(
                "Each arm: the Launch tab's config with these options on top "
                "(a model path, --profile NAME, knobs); started, warmed, measured, "
                "stopped in turn."
            )
        )
        al.addWidget(self.arms, 1)
        al.addWidget(self.arm_diffs)
        al.addWidget(self.arm_warning)
        self.arms.textChanged.connect(self.refresh_diffs)

    def make_job(
        self,
        base: LaunchConfig,
        load: LoadForm,
        on_event: Callable[[Event], None],
    ) -> ABRun:
        """The A/B run of the arms over ``base`` under ``load``'s load; :attr:`diffs` says what
        each arm changes."""
        from quantdeck.core.bench import ABRun, knob_diff

        arms = self._parse_arms(base)
        ab = ABRun(arms, load.load_spec(), slo=load.slo(), on_event=on_event)
        self.diffs = {
            a.label: diff_text(knob_diff(base, a.config)) or "same as the Launch tab" for a in arms
        }
        return ab

    def _parse_arms(self, base: LaunchConfig) -> list[Any]:
        from quantdeck.core.bench import parse_arm

        lines = [ln for ln in self.arms.toPlainText().splitlines() if ln.strip()]
        return [parse_arm(ln, base) for ln in lines]

    def refresh_diffs(self, *_: Any) -> None:
        """Show what each arm changes against the Launch tab's config, and refuse (in plain
        view) arms that cannot be told apart."""
        from quantdeck.core.bench import check_arms, knob_diff, parse_arm

        try:
            base = self._launch_config()
        except QuantdeckError as e:
            self.arm_diffs.setText("")
            self.arm_warning.setText(f"Run refuses: the Launch tab's config: {e}")
            self.arm_warning.show()
            self.checked.emit()
            return
        notes, arms = [], []
        for line in self.arms.toPlainText().splitlines():
            if not line.strip():
                continue
            try:
                arm = parse_arm(line, base)
            except QuantdeckError as e:
                notes.append(str(e))
                continue
            arms.append(arm)
            notes.append(
                f"{arm.label}: {diff_text(knob_diff(base, arm.config)) or 'same as the Launch tab'}"
            )
        warning = ""
        try:
            check_arms(arms)
        except QuantdeckError as e:
            warning = f"Run refuses: {e}"
        if len(arms) < 2 and not warning:
            warning = "Run refuses: an A/B comparison needs at least two arms"
        self.arm_diffs.setText("vs the Launch tab:\n" + "\n".join(notes) if notes else "")
        self.arm_warning.setText(warning)
        self.arm_warning.setVisible(bool(warning))
        self.checked.emit()
