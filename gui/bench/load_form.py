"""The Benchmark tab's load: a row per field of the load and of the SLO limits (walked from
their declarations, :func:`quantdeck.core.bench.load_fields`), the rarer ones behind More load
options."""

from __future__ import annotations

from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QFormLayout,
    QSpinBox,
    QWidget,
)

from quantdeck.core.bench import LoadSpec, SloLimits, load_fields, parse_slo
from quantdeck.gui.bench.columns import PANEL_LOAD
from quantdeck.gui.knob_form import SettingRows


class LoadForm(QWidget):
    """The load the Run, A/B and Tune pages send (hidden in live tuning: the fleet's own
    traffic is the load)."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        load = QFormLayout(self)
        load.setContentsMargins(0, 0, 0, 0)
        self.load_rows = SettingRows(load, load_fields())
        self.slo_rows = SettingRows(load, load_fields(SloLimits))
        self.load_rows.set_values(PANEL_LOAD)
        self.slo_rows.set_values(SloLimits())
        self.concurrency = self.load_rows.widget("concurrency", QSpinBox)
        self.rate = self.load_rows.widget("request_rate", QDoubleSpinBox)
        self.num_prompts = self.load_rows.widget("num_prompts", QSpinBox)
        self.input_len = self.load_rows.widget("input_len", QSpinBox)
        self.output_len = self.load_rows.widget("output_len", QSpinBox)
        self.dataset = self.load_rows.widget("dataset", QComboBox)
        self.slo_ttft = self.slo_rows.widget("ttft", QDoubleSpinBox)
        self.slo_tpot = self.slo_rows.widget("tpot", QDoubleSpinBox)
        self.more_load = QCheckBox("More load options")
        self.more_load.setToolTip(
            "Arrival burstiness, prompt files, warm-up, sampling, seed, timeout, E2E SLO"
        )
        self.more_load.toggled.connect(self._on_more_load_changed)
        load.addRow("", self.more_load)
        self._on_more_load_changed(False)

    def load_spec(self) -> LoadSpec:
        """The load the form asks for (checked when the job starts); ConfigError names a bad
        field."""
        return LoadSpec(**self.load_rows.values())

    def slo(self) -> dict[str, float]:
        return parse_slo(None, **self.slo_rows.values())

    def _on_more_load_changed(self, shown: bool) -> None:
        self.load_rows.set_advanced_visible(shown)
        self.slo_rows.set_advanced_visible(shown)
