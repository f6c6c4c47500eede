"""The Benchmark tab's Tune page: a search over a space of knobs, run on servers of its own one
point at a time (:class:`quantdeck.core.bench.tune.Tuner`), or live on the Fleet tab's fleet
(its fields: :class:`quantdeck.gui.live_tune.LiveTuneForm`, rows of the same form, so that the
labels line up; its chain: :mod:`quantdeck.gui.bench.live_chain`)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QFormLayout,
    QLineEdit,
    QPlainTextEdit,
    QSpinBox,
    QWidget,
)

from quantdeck.core.bench.results import TuneResult
from quantdeck.core.errors import QuantdeckError
from quantdeck.core.events import Event
from quantdeck.core.launch import LaunchConfig
from quantdeck.gui.bench.columns import TUNE_LIVE, TUNE_OFFLINE, values_text
from quantdeck.gui.bench.load_form import LoadForm
from quantdeck.gui.live_tune import LiveTuneForm

if TYPE_CHECKING:
    from quantdeck.core.bench import Tuner


class TunePage(QWidget):
    """The Tune page: where it runs, the space, the offline fields or the live ones."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.tune_where = QComboBox()
        self.tune_where.addItems([TUNE_OFFLINE, TUNE_LIVE])
        self.tune_where.setToolTip(
            "Own servers: each point started, measured under the load above and stopped in "
            "turn. Live: each candidate tried beside an instance of the Fleet tab's fleet on "
            "its own traffic, promoted or rolled back, without downtime"
        )
        self.space = QPlainTextEdit()
        self.space.setPlainText("max_num_seqs = 2,4,8,16\nenable_chunked_prefill = true,false")
        self.space.setToolTip(
            "One knob a line, its candidates after '=': any knob that changes how the engine "
            "serves (enforce_eager = true,false; performance_mode = balanced,throughput; "
            "speculative = none,ngram:3; cudagraph_mode = PIECEWISE,FULL), or vllm:NAME = V1,V2 "
            "for another option of the engine, as --vllm-arg NAME=VALUE reads it. A knob on "
            "two lines is refused."
        )
        self.tune_ttft = QDoubleSpinBox()
        self.tune_tpot = QDoubleSpinBox()
        for w, v in ((self.tune_ttft, 2000.0), (self.tune_tpot, 200.0)):
            w.setRange(1, 1e7)
            w.setSuffix(" ms")
            w.setValue(v)
        self.max_points = QSpinBox()
        self.max_points.setRange(1, 1000)
        self.max_points.setValue(8)
        self.grid = QCheckBox("Exhaustive grid")
        self.save_profile = QLineEdit()
        self.save_profile.setPlaceholderText("profile for the best point (default: tuned-DATE)")
        # one form, so that the labels line up: the offline rows or the live ones shown
        tl = self.tune_form = QFormLayout(self)
        tl.addRow("Run on", self.tune_where)
        tl.addRow("Space (KNOB = V1,V2)", self.space)
        self.offline_fields = (
            self.tune_ttft,
            self.tune_tpot,
            self.max_points,
            self.grid,
            self.save_profile,
        )
        tl.addRow("p99 TTFT target", self.tune_ttft)
        tl.addRow("p99 TPOT target", self.tune_tpot)
        tl.addRow("Max points", self.max_points)
        tl.addRow("", self.grid)
        tl.addRow("Save best as", self.save_profile)
        self.live = LiveTuneForm(tl)
        self.live.set_visible(False)

    @property
    def where_live(self) -> bool:
        """Set to tune live on the Fleet tab's fleet (the page shown or not)."""
        return self.tune_where.currentText() == TUNE_LIVE

    def show_where(self) -> None:
        """The live form in place of the offline one, or the reverse."""
        live = self.where_live
        for widget in self.offline_fields:
            self.tune_form.setRowVisible(widget, not live)
        self.live.set_visible(live)

    def space_items(self) -> list[str]:
        """The space's lines (``KNOB = V1,V2``), blank ones left out."""
        return [ln for ln in self.space.toPlainText().splitlines() if ln.strip()]

    def save_best(self, result: TuneResult, base: LaunchConfig | None) -> tuple[str, str | None]:
        """Save a tuning run's best point over ``base`` as a profile (the Save best as name,
        else ``tuned-DATE``): the line that says so, and the profile saved (None: none)."""
        from quantdeck.core.bench import apply_point
        from quantdeck.core.launch import profiles

        best = result.best
        if not best or base is None:
            return "No point has a goodput: no profile saved.", None
        name: str | None = self.save_profile.text().strip() or time.strftime("tuned-%Y%m%d-%H%M%S")
        try:
            profiles.save_profile(str(name), apply_point(base, best.values))
            where = f" Saved as profile '{name}'."
        except QuantdeckError as e:
            name, where = None, f" Not saved as a profile: {e}"
        index = next((i for i, p in enumerate(result.points, 1) if p.values == best.values), "?")
        meets = "meets" if best.meets else "misses"
        return (
            f"Best: point {index} ({values_text(best.values)}), goodput "
            f"{best.goodput or 0:.2f} req/s, {meets} the p99 targets.{where}"
        ), name

    def make_job(
        self, base: LaunchConfig, load: LoadForm, on_event: Callable[[Event], None]
    ) -> Tuner:
        """The offline search over ``base`` under ``load``'s load; a bad profile name is
        refused now, not after the run."""
        from quantdeck.core.bench import Tuner, parse_space
        from quantdeck.core.launch import detect_device, profiles

        name = self.save_profile.text().strip()
        if name:
            profiles.profile_path(name)  # a bad name is refused now, not after the run
        items = self.space_items()
        spec = load.load_spec()
        return Tuner(
            base,
            spec,
            ttft_ms=self.tune_ttft.value(),
            tpot_ms=self.tune_tpot.value(),
            space=parse_space(items, detect_device(), spec.concurrency),
            strategy="grid" if self.grid.isChecked() else "coordinate",
            max_points=self.max_points.value(),
            on_event=on_event,
        )
