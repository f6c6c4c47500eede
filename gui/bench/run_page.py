"""The Benchmark tab's Run page: a load against the server that runs now
(:class:`quantdeck.core.bench.client.Bench`), under a label of the user's."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from PySide6.QtWidgets import QLineEdit, QVBoxLayout, QWidget

from quantdeck.core.errors import QuantdeckError
from quantdeck.core.events import BenchProgress, Event
from quantdeck.gui.bench.columns import wrapped
from quantdeck.gui.bench.load_form import LoadForm

if TYPE_CHECKING:
    from quantdeck.core.bench import Bench

NO_SERVER = "no server: start or attach one first"


class RunPage(QWidget):
    """The Run page; ``label`` names the next run's file (the A/B and tuning runs' too)."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.label = QLineEdit()
        self.label.setPlaceholderText("run label (optional)")
        rl = QVBoxLayout(self)
        rl.addWidget(wrapped("Measures the server that runs now (Launch tab or attached)."))
        rl.addWidget(self.label)
        rl.addStretch(1)

    @staticmethod
    def make_job(
        target: tuple[str | None, str | None, str | None],
        load: LoadForm,
        on_event: Callable[[Event], None],
    ) -> Bench:
        """The run of ``load``'s load against ``target`` (url, model, api_key): each request's
        TTFT an event."""
        from quantdeck.core.bench import Bench

        url, model, key = target
        if not url or not model:
            raise QuantdeckError(NO_SERVER)
        return Bench(
            url,
            model,
            load.load_spec(),
            api_key=key,
            slo=load.slo(),
            on_record=lambda rec, done, total: on_event(
                BenchProgress(done, total, ttft_ms=rec.ttft * 1000 if rec.success else None)
            ),
        )
