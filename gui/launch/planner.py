"""The Launch tab's memory plan: the planner's split as a stacked bar, its figures and the
advisor's findings, and the running launch's plan beside what its engine measured."""

from __future__ import annotations

import html
from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QPainter
from PySide6.QtWidgets import QLabel, QVBoxLayout, QWidget

from quantdeck.core.launch import GiB, KvPlan, engine_checks
from quantdeck.gui.labels import plain_label
from quantdeck.gui.style import ERROR, FREE_MEMORY, SERIES_COLORS, WARNING

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
