"""The GUI's colours, in one place: the plots' palette, what a state or a verdict reads as, and
the few tinted lines and backgrounds (style sheets).

Plain strings and numbers, as Qt, pyqtgraph, style sheets and HTML take them. This module
imports nothing, from Quantdeck or Qt: every view, chart and report can take its colours from
here without an import circle (an import-linter contract in pyproject.toml keeps it at the bottom
of the GUI's layers). A view that maps its own states to colours (a fleet row, the status bar)
keeps the mapping and takes the colours from here.
"""

from __future__ import annotations

# -- the palette -----------------------------------------------------------------------------
# Tableau 10's first seven: a plot's i-th curve, a report's i-th run, the memory plan's parts
SERIES_COLORS = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1")

# status colours (Material's 800 shades): states, timeline markers and verdicts
GREEN = "#2e7d32"  # ready, serving; a launch; a better figure
RED = "#c62828"  # crashed, failed; a worse figure
ORANGE = "#ef6c00"  # starting, stopping; a fleet's switch
PURPLE = "#6a1b9a"  # knobs changed; what separates two spans
BLUE = "#1565c0"  # a benchmark run
GREY = "#757575"  # a restart
STOPPED = "#777"  # a stopped server; a dropped or failed tuning point

# -- plots -----------------------------------------------------------------------------------
PLOT_BACKGROUND = "w"  # pyqtgraph's white, every plot's background
PLOT_TEXT = "#333"  # titles set by hand; the best tuning point's outline
P99_SHADE = 110 / 255  # a p99 curve is its p50 colour at this alpha over the background
SPAN_COLORS = (SERIES_COLORS[0], SERIES_COLORS[1])  # the compared spans: before, after
SPAN_ALPHA = 40  # a span's fill, of 255
SPAN_HOVER_ALPHA = 90  # a span's fill under the mouse
LIMIT_LINE = "#c00"  # an alert's limit, dotted on its plot
MARKER_COLORS = {
    "launch": GREEN,
    "restart": GREY,
    "failed": RED,
    "knobs": PURPLE,
    "fleet": ORANGE,
    "bench": BLUE,
}
OTHER_MARKER = "#555"  # a marker of any other kind
FREE_MEMORY = "#d0d0d0"  # the memory plan's free part
# benchmark and tuning points (the Benchmark tab's plot, the report's bars)
POINT = SERIES_COLORS[0]
BEST_POINT = SERIES_COLORS[2]
MEETS_POINT = SERIES_COLORS[4]  # meets the targets
MISSES_POINT = SERIES_COLORS[2]
DROPPED_POINT = STOPPED  # dropped or failed, on the Benchmark tab
DROPPED_BAR = "#bbbbbb"  # dropped, in the report
ROOFLINE_BAR = "#dddddd"  # the batch-1 roofline beside the measured decode
REPORT_TABLE_BORDER = "#ccc"

# the KV block map (RGB): a free block, a block never reused; resident blocks are coloured
# from pyqtgraph's colour maps, by age (young bright) or by reuse (more reuse warmer)
KV_FREE_RGB = (236, 236, 236)
KV_NOT_REUSED_RGB = (150, 170, 200)
KV_AGE_COLORMAP = "viridis"
KV_REUSE_COLORMAP = "plasma"

# -- text ------------------------------------------------------------------------------------
ERROR = "#c00"  # a refusal beside the form that caused it; a plan that failed
WARNING = "#a60"  # an advisor's warning
ALERT_TEXT = "#8a1c1c"  # an alert, a crash summary, why a sample lacks figures
ALERT_BACKGROUND = "#fde2e1"  # the Monitor's alert banner
CRASH_TAIL_BACKGROUND = "#fdf3f2"  # a crashed run's last log lines
CAVEAT_TEXT = "#8a4b00"  # why a figure may mislead (spans at different load, no profiler)
HINT_TEXT = "#666"
QUIET_TEXT = "#555"  # a secondary line (the engine under the model)
CUE_TEXT = "#37474f"  # the Monitor's source cue (stopped, starting, stale)
CUE_BACKGROUND = "#eceff1"
FORM_ERROR = "#b71c1c"  # a form's error line
# Logs: the colour of each kind of line (None: the default)
LOG_COLORS: dict[str, str | None] = {
    "fact": "#1b5e20",
    "state": "#0d47a1",
    "run": CUE_TEXT,
    "WARNING": "#a65e00",
    "ERROR": FORM_ERROR,
    "CRITICAL": FORM_ERROR,
    "INFO": None,
    "DEBUG": "#777777",
}

# style sheets of the tinted lines
ALERT_BANNER_SHEET = f"background:{ALERT_BACKGROUND}; color:{ALERT_TEXT}; padding:4px;"
CUE_SHEET = f"background:{CUE_BACKGROUND}; color:{CUE_TEXT}; padding:4px;"
PROBLEM_SHEET = f"color:{ALERT_TEXT}; padding:2px;"
CAVEAT_SHEET = f"color:{CAVEAT_TEXT};"
HINT_SHEET = f"color:{HINT_TEXT};"
