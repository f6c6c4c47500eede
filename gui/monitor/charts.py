"""What the Monitor's Plots page draws: each plot's series, legend labels and colours (an index
into :data:`quantdeck.gui.style.SERIES_COLORS`), the time windows, and the gaps that break a
curve where samples stopped."""

from __future__ import annotations

import numpy as np

from quantdeck.gui.style import SERIES_COLORS

# the plots' time windows; a replay opens at the smallest that holds its recording (a
# quarter-hour session fills half of "30 min", a third of "1 h")
WINDOWS = {"1 min": 60.0, "10 min": 600.0, "30 min": 1800.0, "1 h": 3600.0}

# plot title -> [(series, label, color index, light)]; GPU series are added per GPU.
# p99 curves are drawn in the p50 colour, lighter.
PLOTS: dict[str, list[tuple[str, str, int, bool]]] = {
    "Host CPU %": [("host_cpu_pct", "CPU %", 0, False)],
    "Memory (GiB)": [
        ("host_ram_used_gib", "host RAM", 0, False),
        ("server_rss_gib", "server RSS", 1, False),
    ],
    "KV-cache blocks": [
        ("kv_blocks_used", "used", 4, False),
        ("kv_blocks_total", "total", 4, True),
    ],
    "KV-cache usage %": [("kv_usage_pct", "usage %", 4, False)],
    "Requests": [("running", "running", 0, False), ("waiting", "waiting", 1, False)],
    "Latency (ms)": [
        ("ttft_p50_ms", "TTFT p50", 0, False),
        ("ttft_p99_ms", "TTFT p99", 0, True),
        ("itl_p50_ms", "ITL p50", 1, False),
        ("itl_p99_ms", "ITL p99", 1, True),
        ("e2e_p50_ms", "E2E p50", 2, False),
        ("e2e_p99_ms", "E2E p99", 2, True),
    ],
    "Tokens / s": [
        ("prompt_tokens_per_s", "prompt", 0, False),
        ("generation_tokens_per_s", "generation", 4, False),
    ],
    "Preemptions / s": [("preemptions_per_s", "preemptions", 2, False)],
    # the operator's panels, as vLLM's own dashboards show them
    "Request phases (ms)": [
        ("queue_p50_ms", "queue p50", 0, False),
        ("queue_p99_ms", "queue p99", 0, True),
        ("prefill_p50_ms", "prefill p50", 1, False),
        ("prefill_p99_ms", "prefill p99", 1, True),
        ("decode_p50_ms", "decode p50", 2, False),
        ("decode_p99_ms", "decode p99", 2, True),
    ],
    "Finished / s": [
        ("finished_stop_per_s", "stop", 4, False),
        ("finished_length_per_s", "length", 0, False),
        ("finished_abort_per_s", "abort", 1, False),
        ("finished_error_per_s", "error", 2, False),
    ],
    "Hits · SLO attainment (%)": [
        ("prefix_hit_pct", "prefix-cache hits", 4, False),
        ("ttft_slo_pct", "TTFT within SLO", 0, False),
        ("itl_slo_pct", "ITL within SLO", 1, False),
        ("e2e_slo_pct", "E2E within SLO", 2, False),
        ("spec_accept_pct", "spec. accepted", 6, False),
    ],
}


# a fleet's instances overlaid, one curve per instance: plot title -> series
INSTANCE_PLOTS = {
    "p99 TTFT by instance (ms)": "ttft_p99_ms",
    "KV-cache % by instance": "kv_usage_pct",
    "Generated tok/s by instance": "generation_tokens_per_s",
    "Running by instance": "running",
}


def unknown_series(
    plots: dict[str, list[tuple[str, str, int, bool]]], names: set[str]
) -> list[str]:
    """The series ``plots`` names that are none of ``names`` (the store's columns, declared
    once with their readers in core/monitor/timeseries.py's ``BASE_SERIES``)."""
    return sorted({series for curves in plots.values() for series, *_ in curves} - names)


def _check_series() -> None:
    """Every series a plot names is a column the store keeps: a misspelt one would draw an
    empty curve in silence (issue 44), so the Monitor refuses to load instead."""
    from quantdeck.core.monitor.timeseries import BASE_SERIES

    names = {s.name for s in BASE_SERIES}
    overlays = {t: [(series, t, 0, False)] for t, series in INSTANCE_PLOTS.items()}
    unknown = unknown_series(PLOTS, names) + unknown_series(overlays, names)
    if unknown:
        raise RuntimeError(f"the Monitor's plots name series the store lacks: {unknown}")


_check_series()


# Samples further apart than this (and than 3 times their usual spacing) are a gap: the curve
# breaks there instead of drawing a line across time with no data (a stop, a stalled scrape).
GAP_S = 5.0


def with_gaps(
    t: np.ndarray, cols: dict[str, np.ndarray], gap_s: float = GAP_S
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """``t`` and ``cols`` with a NaN row inserted wherever consecutive times are more than
    ``gap_s`` apart (and more than 3 times the median spacing: a decimated long window's
    bins are wider than a sample), so that a curve drawn with ``connect="finite"`` breaks."""
    if len(t) < 2:
        return t, cols
    dt = np.diff(t)
    positive = dt[dt > 0]
    limit = max(gap_s, 3 * float(np.median(positive))) if len(positive) else gap_s
    at = np.flatnonzero(dt > limit) + 1
    if not len(at):
        return t, cols
    mids = (t[at - 1] + t[at]) / 2
    return np.insert(t, at, mids), {k: np.insert(v, at, np.nan) for k, v in cols.items()}


def gpu_plots(n: int) -> dict[str, list[tuple[str, str, int, bool]]]:
    """The per-GPU plots of ``n`` GPUs (they replace the host's CPU plot)."""
    return {
        "GPU utilisation %": [
            (f"gpu{i}_util_pct", f"GPU {i}", i % len(SERIES_COLORS), False) for i in range(n)
        ],
        "GPU memory (GiB)": [
            (f"gpu{i}_memory_used_gib", f"GPU {i}", i % len(SERIES_COLORS), False) for i in range(n)
        ],
        "GPU power (W)": [
            (f"gpu{i}_power_w", f"GPU {i}", i % len(SERIES_COLORS), False) for i in range(n)
        ],
    }
