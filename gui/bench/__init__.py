"""The Benchmark tab (:class:`BenchTab`): a load against the running server, A/B runs,
auto-tuning on servers of its own or live on the Fleet tab's fleet, run history.

One module a part: ``tab`` assembles the pages and runs the job the chosen mode makes;
``run_page``, ``ab_page``, ``tune_page`` (with ``live_chain``, its live mode's trials) and
``history_page`` are the modes' pages; ``load_form`` the load they send; ``results`` the plot
and the table; ``columns`` what they share (the table's rows and columns, the status's
lines)."""

from quantdeck.gui.bench.columns import (
    AB_METRICS,
    DEFAULT_ARMS,
    MAX_LIVE_POINTS,
    METRIC_COLUMN,
    METRICS,
    PANEL_LOAD,
    RUN_COLUMNS,
    TUNE_LIVE,
    TUNE_OFFLINE,
    Metric,
    TunePoint,
    best_point,
    compare_columns,
    diff_text,
    series_column,
    tune_columns,
)
from quantdeck.gui.bench.tab import BenchTab

__all__ = [
    "AB_METRICS",
    "DEFAULT_ARMS",
    "MAX_LIVE_POINTS",
    "METRICS",
    "METRIC_COLUMN",
    "PANEL_LOAD",
    "RUN_COLUMNS",
    "TUNE_LIVE",
    "TUNE_OFFLINE",
    "BenchTab",
    "Metric",
    "TunePoint",
    "best_point",
    "compare_columns",
    "diff_text",
    "series_column",
    "tune_columns",
]
