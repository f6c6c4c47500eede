"""HTML report of saved runs with PNG charts (``quantdeck report``), drawn with pyqtgraph, and
the tuning timeline's span comparison where there is one (the Monitor's Export).

Charts: output throughput per run (bars), TTFT and end-to-end latency CDFs from the per-request
records, the batch-1 decode roofline where the device's bandwidth is known, and for a tune run
goodput per point. Renders off screen when there is no display.

A run file is data from anywhere (a shared result, a hand-edited file): every value reaches the
page escaped, and a value that should be a number but is not is shown as its text, never drawn.
The report folder is written whole or not at all (:func:`quantdeck.core.paths.atomic_dir`).
"""

from __future__ import annotations

import gc
import html
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from quantdeck.core.bench.results import (
    ABResult,
    BenchResult,
    Roofline,
    RunResult,
    SloMs,
    TuneResult,
)
from quantdeck.core.events import MarkerEvent
from quantdeck.core.monitor.timeline import SpanComparison, diff_text, plain_number
from quantdeck.core.paths import atomic_dir
from quantdeck.gui.style import (
    DROPPED_BAR,
    GREEN,
    MEETS_POINT,
    MISSES_POINT,
    PLOT_BACKGROUND,
    PLOT_TEXT,
    RED,
    REPORT_TABLE_BORDER,
    ROOFLINE_BAR,
    SERIES_COLORS,
)


@dataclass(frozen=True)
class ReportItem:
    """One measured config of the report: its label, its run, its roofline and its server's
    kernel (an A/B arm's; a bench run has neither)."""

    label: str
    result: BenchResult
    roofline: Roofline | None = None
    kernel: str = ""


def flatten(runs: list[RunResult]) -> list[ReportItem]:
    """One entry per measured config: a bench run, or each arm of an A/B run."""
    out = []
    for r in runs:
        if isinstance(r, ABResult):
            out += [
                ReportItem(a.label, a.result, a.roofline, a.kernel)
                for a in r.arms
                if a.result is not None
            ]
        elif isinstance(r, BenchResult):
            out.append(ReportItem(r.name or str(r.model_id), r))
    return out


def number(v: Any) -> float | None:
    """``v`` when it is a finite number (not a bool), else None."""
    if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
        return float(v)
    return None


def _app() -> Any:
    if not os.environ.get("DISPLAY") and not os.environ.get("WAYLAND_DISPLAY"):
        os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtWidgets import QApplication

    return QApplication.instance() or QApplication([])


def _save(widget: Any, path: Path) -> None:
    app = _app()
    widget.resize(720, 420)
    widget.show()
    app.processEvents()
    # Earlier charts' widgets are collected here, at a quiet point, and not by a collection
    # that a Python allocation starts in the middle of this one's paint (a segfault in grab()
    # seen once on a clean-clone run)
    gc.collect()
    gc.disable()
    try:
        widget.grab().save(str(path))
    finally:
        gc.enable()
    widget.close()


def _plot(title: str, xlabel: str, ylabel: str) -> Any:
    import pyqtgraph as pg

    w = pg.PlotWidget(background=PLOT_BACKGROUND)
    w.setTitle(title, color=PLOT_TEXT)
    w.setLabel("bottom", xlabel)
    w.setLabel("left", ylabel)
    w.showGrid(x=True, y=True, alpha=0.2)
    return w


def throughput_chart(items: list[ReportItem], path: Path) -> None:
    import pyqtgraph as pg

    w = _plot("Output throughput", "", "tokens/s")
    ys = [number(it.result.output_throughput) or 0.0 for it in items]
    w.addItem(
        pg.BarGraphItem(
            x=np.arange(len(ys)),
            height=ys,
            width=0.6,
            brushes=[SERIES_COLORS[i % len(SERIES_COLORS)] for i in range(len(ys))],
        )
    )
    ax = w.getAxis("bottom")
    ax.setTicks([[(i, it.label) for i, it in enumerate(items)]])
    _save(w, path)


def cdf_chart(items: list[ReportItem], field: str, title: str, path: Path) -> None:
    import pyqtgraph as pg

    w = _plot(title, "ms", "fraction of requests")
    w.addLegend(offset=(-10, 10))
    for i, it in enumerate(items):
        vals = sorted(v * 1000 for v in it.result.request_times(field))
        if not vals:
            continue
        ys = np.arange(1, len(vals) + 1) / len(vals)
        w.plot(
            vals,
            ys,
            pen=pg.mkPen(SERIES_COLORS[i % len(SERIES_COLORS)], width=2),
            stepMode=None,
            name=it.label,
        )
    _save(w, path)


def roofline_chart(items: list[ReportItem], path: Path) -> bool:
    import pyqtgraph as pg

    rows = [
        (i, it, roof)
        for i, it in enumerate(items)
        if (roof := it.roofline) is not None and number(roof.roofline_tok_s)
    ]
    if not rows:
        return False
    w = _plot("Decode per sequence vs batch-1 roofline", "", "tokens/s per sequence")
    for k, (i, _it, roof) in enumerate(rows):
        w.addItem(
            pg.BarGraphItem(
                x=[k - 0.15], height=[roof.roofline_tok_s], width=0.3, brush=ROOFLINE_BAR
            )
        )
        w.addItem(
            pg.BarGraphItem(
                x=[k + 0.15],
                height=[number(roof.decode_tok_s_per_seq) or 0.0],
                width=0.3,
                brush=SERIES_COLORS[i % len(SERIES_COLORS)],
            )
        )
    w.getAxis("bottom").setTicks([[(k, it.label) for k, (_i, it, _r) in enumerate(rows)]])
    _save(w, path)
    return True


def tune_chart(run: TuneResult, path: Path) -> None:
    import pyqtgraph as pg

    w = _plot("Goodput per tuning point (in order measured)", "point", "requests/s")
    pts = run.points
    ys = [number(p.goodput) or 0.0 for p in pts]
    brushes = [
        MEETS_POINT if p.meets else (DROPPED_BAR if p.dropped else MISSES_POINT) for p in pts
    ]
    w.addItem(pg.BarGraphItem(x=np.arange(1, len(ys) + 1), height=ys, width=0.6, brushes=brushes))
    _save(w, path)


_COLS = (
    ("output_throughput", "out tok/s", ".1f"),
    ("request_throughput", "req/s", ".2f"),
    ("request_goodput", "goodput", ".2f"),
    ("median_ttft_ms", "TTFT p50", ".1f"),
    ("p99_ttft_ms", "TTFT p99", ".1f"),
    ("median_tpot_ms", "TPOT p50", ".2f"),
    ("p99_tpot_ms", "TPOT p99", ".2f"),
    ("median_e2el_ms", "E2E p50", ".0f"),
    ("completed", "done", "d"),
    ("failed", "failed", "d"),
)


def fmt(v: Any, spec: str) -> str:
    """A table cell: '-' for none, a number formatted, anything else as its text."""
    if v is None:
        return "-"
    if number(v) is None:
        return str(v)
    try:
        return format(v, spec)
    except (TypeError, ValueError):  # e.g. a float given for an integer column
        return str(v)


def cell(v: Any, spec: str) -> str:
    """:func:`fmt`, escaped for HTML."""
    return html.escape(fmt(v, spec))


def percent(v: Any) -> str:
    """A fraction as an escaped percentage cell; a non-number as its escaped text."""
    f = number(v)
    return cell(v, "") if f is None else f"{f * 100:.0f}%"


def write_report(
    runs: list[RunResult],
    out: Path,
    *,
    comparison: SpanComparison | None = None,
    markers: list[MarkerEvent] | None = None,
) -> Path:
    """Write the report folder ``out`` (index.html and its PNGs); returns its index.html.
    A previous report there is replaced; any other file or folder there is refused.
    ``comparison``: the tuning timeline's span comparison (the Monitor's Export,
    ``quantdeck timeline --report``, ``report --recording``), with the timeline's ``markers``."""
    _app()
    with atomic_dir(out, "report", overwrite=True) as tmp:
        _write_report(runs, tmp, comparison, markers or [])
    return out.expanduser().absolute() / "index.html"


VERDICT_COLORS = {"better": GREEN, "worse": RED}


def comparison_html(cmp: SpanComparison, markers: list[MarkerEvent]) -> list[str]:
    """The timeline section: its markers, then the two spans side by side (escaped)."""
    parts = ["<h2>Tuning timeline</h2>"]
    if markers:
        parts.append("<table><tr><th>at</th><th>marker</th><th>what changed</th></tr>")
        for m in markers:
            parts.append(
                f"<tr><td>{time.strftime('%H:%M:%S', time.localtime(m.t))}</td>"
                f"<td>{html.escape(m.label)}</td>"
                f"<td>{html.escape(diff_text(m.diff))}</td></tr>"
            )
        parts.append("</table>")
    parts.append(
        f"<h3>Before {html.escape(cmp.before.text())} · after "
        f"{html.escape(cmp.after.text())}</h3>"
        f"<p>Separated by: {html.escape(cmp.separated_by())}</p>"
        + (f"<p><b>Note:</b> {html.escape(cmp.load_note())}</p>" if cmp.load_note() else "")
        + "<table><tr><th>metric</th><th>before</th><th>after</th><th>change</th></tr>"
        f"<tr><td>samples</td><td>{cmp.samples[0]}</td><td>{cmp.samples[1]}</td><td></td></tr>"
    )
    for r in cmp.rows:
        color = VERDICT_COLORS.get(r.verdict)
        style = f" style='color:{color}'" if color else ""
        parts.append(
            f"<tr><td>{html.escape(r.name)}</td><td>{plain_number(r.before)}</td>"
            f"<td>{plain_number(r.after)}</td>"
            f"<td{style}>{html.escape(r.change_text())} {html.escape(r.verdict)}</td></tr>"
        )
    parts.append("</table>")
    return parts


def _write_report(
    runs: list[RunResult],
    out: Path,
    comparison: SpanComparison | None = None,
    markers: list[MarkerEvent] | tuple[()] = (),
) -> None:
    items = flatten(runs)
    parts = [
        "<!doctype html><meta charset='utf-8'><title>Quantdeck report</title>",
        "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
        f"td,th{{border:1px solid {REPORT_TABLE_BORDER};padding:3px 8px;text-align:right}}"
        "td:first-child,th:first-child{text-align:left}</style>",
        "<h1>Quantdeck benchmark report</h1>",
    ]
    if comparison is not None:
        parts += comparison_html(comparison, list(markers))
    if items:
        parts.append(
            "<table><tr><th>run</th>"
            + "".join(f"<th>{h}</th>" for _, h, _ in _COLS)
            + "<th>kernel</th><th>roofline</th></tr>"
        )
        for it in items:
            frac = it.roofline.fraction_of_roofline if it.roofline else None
            parts.append(
                "<tr><td>"
                + html.escape(str(it.label))
                + "</td>"
                + "".join(f"<td>{cell(it.result.figure(k), s)}</td>" for k, _, s in _COLS)
                + f"<td>{html.escape(it.kernel)}"
                + f"</td><td>{percent(frac)}</td></tr>"
            )
        parts.append("</table>")
        throughput_chart(items, out / "throughput.png")
        cdf_chart(items, "ttft", "TTFT distribution", out / "ttft_cdf.png")
        cdf_chart(items, "latency", "End-to-end latency distribution", out / "e2el_cdf.png")
        parts += [
            "<h2>Charts</h2>",
            "<img src='throughput.png'>",
            "<img src='ttft_cdf.png'>",
            "<img src='e2el_cdf.png'>",
        ]
        if roofline_chart(items, out / "roofline.png"):
            parts.append("<img src='roofline.png'>")
    for n, run in enumerate(r for r in runs if isinstance(r, TuneResult)):
        name = f"tune_{n}.png"
        tune_chart(run, out / name)
        best = run.best.values if run.best else None
        slo = run.slo_ms or SloMs()
        parts.append(
            f"<h2>Tuning ({html.escape(str(run.strategy))}, targets p99 TTFT "
            f"{cell(slo.ttft, 'g')} ms, p99 TPOT {cell(slo.tpot, 'g')} ms)</h2>"
        )
        parts.append(
            "<table><tr><th>point</th><th>values</th><th>goodput</th><th>meets</th>"
            "<th>TTFT p99</th><th>TPOT p99</th><th>note</th></tr>"
        )
        for i, p in enumerate(run.points, 1):
            vals = ", ".join(f"{k}={v}" for k, v in p.values.items())
            mark = " (best)" if p.values == best else ""
            parts.append(
                f"<tr><td>{i}{mark}</td><td>{html.escape(vals)}</td>"
                f"<td>{cell(p.goodput, '.2f')}</td><td>{cell(p.meets, '')}</td>"
                f"<td>{cell(p.p99_ttft_ms, '.0f')}</td>"
                f"<td>{cell(p.p99_tpot_ms, '.1f')}</td>"
                f"<td>{html.escape(str(p.dropped or p.error or ''))}</td>"
                "</tr>"
            )
        parts.append(f"</table><img src='{name}'>")
    env = next((r.env for r in runs if r.env), None)
    if env:
        parts.append(
            "<h2>Environment</h2><pre>"
            + html.escape("\n".join(f"{k}: {v}" for k, v in env.items()))
            + "</pre>"
        )
    (out / "index.html").write_text("\n".join(parts), encoding="utf-8")
