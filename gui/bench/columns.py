"""What the Benchmark tab's pages share: the results table's rows and columns (item-model
columns over :data:`METRICS`, a tuning run's :class:`TunePoint` rows, a comparison's rows, the
run history's files), the form's load at start, and the lines the status and the pages say."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from PySide6.QtWidgets import QLabel

from quantdeck.core.bench import LoadSpec
from quantdeck.core.bench.results import BenchResult, PointFigures
from quantdeck.core.bench.runs import CompareRow
from quantdeck.core.launch.diff import change_text, knobs_text
from quantdeck.gui.labels import plain_label
from quantdeck.gui.report import fmt as _fmt
from quantdeck.gui.table_model import Column


@dataclass(frozen=True)
class Metric:
    """A row of the results table: a key of the result, its title and number format."""

    key: str
    title: str
    fmt: str


METRICS = (
    Metric("completed", "completed", "d"),
    Metric("failed", "failed", "d"),
    Metric("duration", "duration s", ".2f"),
    Metric("output_throughput", "output tok/s", ".1f"),
    Metric("request_throughput", "requests/s", ".2f"),
    Metric("request_goodput", "goodput req/s", ".2f"),
    Metric("median_ttft_ms", "TTFT p50 ms", ".1f"),
    Metric("p99_ttft_ms", "TTFT p99 ms", ".1f"),
    Metric("median_tpot_ms", "TPOT p50 ms", ".2f"),
    Metric("p99_tpot_ms", "TPOT p99 ms", ".2f"),
    Metric("median_itl_ms", "ITL p50 ms", ".2f"),
    Metric("median_e2el_ms", "E2E p50 ms", ".0f"),
    Metric("p99_e2el_ms", "E2E p99 ms", ".0f"),
    Metric("ended_early", "ended early", "s"),
)

METRIC_COLUMN: Column[Metric] = Column("metric", lambda m: m.title)

# An A/B run's rows: what each arm changes against the Launch tab, its figures, why it has none.
AB_METRICS = (
    Metric("vs_launch", "vs Launch tab", "s"),
    *METRICS,
    Metric("error", "arm error", "s"),
)

# Eager against CUDA graphs, whatever the Launch tab says: the arms always differ.
DEFAULT_ARMS = "eager = --enforce-eager\ngraphs = --no-enforce-eager"


def diff_text(diff: Mapping[str, Sequence[Any]]) -> str:
    """``knob before → after`` per changed knob (``quantdeck.core.bench.knob_diff``'s)."""
    return change_text(diff)


@dataclass(frozen=True)
class TunePoint:
    """A row of a tuning run's table: point ``index`` (1-based, in measuring order), its knob
    values and figures (a ``point`` event's result, or an entry of the run's ``points``)."""

    index: int
    values: Mapping[str, Any]
    result: PointFigures
    best: bool = False

    @property
    def goodput(self) -> float | None:
        r = self.result
        return None if r.dropped or r.error else r.goodput


def best_point(points: Sequence[TunePoint]) -> int | None:
    """The index of the best point so far, as the tuner picks it: the most goodput, the
    earlier point on a tie; dropped and failed points never."""
    best: TunePoint | None = None
    for p in points:
        if p.goodput is not None and (best is None or p.goodput > (best.goodput or 0)):
            best = p
    return best.index if best else None


def _header(name: str, width: int = 14) -> str:
    """A long knob name broken at an underscore into two header lines."""
    if len(name) <= width or "_" not in name:
        return name
    cut = min((i for i, c in enumerate(name) if c == "_"), key=lambda i: abs(i - len(name) / 2))
    return name[: cut + 1] + "\n" + name[cut + 1 :]


def _outcome_cell(p: TunePoint) -> str:
    """What became of the point; its goodput has its own column."""
    from quantdeck.core.bench import point_outcome

    if p.goodput is None:
        return point_outcome(p.result)
    return "meets the p99 targets" if p.result.meets else "misses the p99 targets"


def tune_columns(knobs: Sequence[str]) -> tuple[Column[TunePoint], ...]:
    """The columns of a tuning run's table: the point, one per knob, its figures, and what
    became of it (why a point has no goodput: dropped early, an error)."""
    from quantdeck.core.bench import point_outcome

    def _point_name(p: TunePoint) -> str:
        return f"{p.index} ★ best" if p.best else str(p.index)

    def _knob(k: str) -> Column[TunePoint]:
        return Column(_header(k), lambda p: _fmt(p.values.get(k), "s"))

    return (
        Column("point", _point_name),
        *(_knob(k) for k in knobs),
        Column("goodput\nreq/s", lambda p: _fmt(p.goodput, ".2f"), align_right=True),
        Column("TTFT p99\nms", lambda p: _fmt(p.result.p99_ttft_ms, ".1f")),
        Column("TPOT p99\nms", lambda p: _fmt(p.result.p99_tpot_ms, ".2f")),
        Column("completed", lambda p: _fmt(p.result.completed, "d")),
        # a dropped point's unsent requests count as failed: its outcome says why instead
        Column("failed", lambda p: "-" if p.result.dropped else _fmt(p.result.failed, "d")),
        Column("outcome", _outcome_cell, tooltip=lambda p: point_outcome(p.result)),
    )


def series_column(
    name: str, result: BenchResult | None, own: Mapping[str, Any] | None = None
) -> Column[Metric]:
    """A column of the results table: one run or arm (``result``'s figures; None: none), with
    the rows that are the column's ``own`` (an arm's ``vs_launch`` and ``error``)."""
    extra = dict(own or {})

    def value(m: Metric) -> str:
        if m.key in extra:
            return _fmt(extra[m.key], m.fmt)
        return _fmt(result.figure(m.key) if result is not None else None, m.fmt)

    return Column(name, value)


def _ratio_text(row: CompareRow) -> str:
    if row.ratio is None:
        return "-"
    return f"{row.ratio:.3f}" + {True: " better", False: " worse", None: ""}[row.b_better]


def compare_columns(label_a: str, label_b: str) -> tuple[Column[CompareRow], ...]:
    """The columns of a comparison of two runs (rows: quantdeck.core.bench.compare's)."""
    return (
        Column("metric", lambda r: r.metric),
        Column(label_a, lambda r: _fmt(r.a, ".2f")),
        Column(label_b, lambda r: _fmt(r.b, ".2f")),
        Column("B / A", _ratio_text),
    )


RUN_COLUMNS: tuple[Column[Path], ...] = (Column("run", lambda p: p.name, tooltip=str),)

# The form's load at start: the CLI's defaults but eight in flight, fewer and shorter requests,
# so that a first Run answers within seconds.
PANEL_LOAD = LoadSpec(concurrency=8, num_prompts=32, output_len=64)

# Requests the live TTFT plot shows: the newest (a 100 000-prompt run stays light to draw).
MAX_LIVE_POINTS = 10000

# The Tune page's two ways of running: servers of its own, or live trials on the Fleet tab's fleet
TUNE_OFFLINE = "own servers, one point at a time"
TUNE_LIVE = "live, on the Fleet tab's fleet"


def values_text(values: Mapping[str, Any]) -> str:
    """``knob=value, …``: a tuning point's values as the status line says them."""
    return knobs_text(values)


def stage_text(stage: str, error: str | None | Any) -> str:
    """An arm's (or tuning point's) stage as the status line says it."""
    if stage == "starting":
        return "starting its server"
    if stage == "done" and isinstance(error, str) and error:
        return f"no result: {error}"
    return stage


def wrapped(text: str) -> QLabel:
    """A page's plain-text note, wrapped to the page's width."""
    label = plain_label(text)
    label.setWordWrap(True)
    return label
