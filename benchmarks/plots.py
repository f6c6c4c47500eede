"""Time per Monitor frame with every series x 1 h of 10 Hz points (goal: <= 5 ms).

    QT_QPA_PLATFORM=offscreen python benchmarks/plots.py

Fills the store with 36,000 points, then times `refresh()` (setData of every curve, peak
downsampling, clip to view) plus the paint Qt then does, for each window (1 min, 10 min, 1 h),
while new points keep arriving; then, in the 1 h window, frames at 10 Hz while samples arrive at
2 Hz as a live server's do (a frame without a new sample draws nothing).
"""

from __future__ import annotations

import os
import statistics
import time

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import numpy as np
from PySide6.QtWidgets import QApplication

from quantdeck.core.events import MetricsEvent, from_json
from quantdeck.gui.monitor import MonitorPanel

_walk = np.full(12, 0.5)


def event(t: float, rng: np.random.Generator) -> MetricsEvent:
    """Monitored series move like real ones: a bounded random walk, not white noise."""
    _walk[:] = np.clip(_walk + rng.normal(0, 0.02, 12), 0, 1)
    v = _walk
    return from_json(
        {
            "event": "metrics",
            "t": t,
            "host_cpu_pct": 100 * v[0],
            "host_ram_used_bytes": 2**30 * (8 + v[1]),
            "server_rss_bytes": 2**30 * 2,
            "kv_blocks_used": 500 * v[2],
            "kv_blocks_total": 512,
            "kv_usage_pct": 100 * v[2],
            "running": 10 * v[3],
            "waiting": 5 * v[4],
            "ttft_p50_ms": 50 * v[5],
            "ttft_p99_ms": 90 * v[6],
            "itl_p50_ms": 5 * v[7],
            "itl_p99_ms": 9 * v[8],
            "e2e_p50_ms": 500 * v[9],
            "e2e_p99_ms": 900 * v[10],
            "prompt_tokens_per_s": 1000 * v[11],
            "generation_tokens_per_s": 800 * v[0],
            "preemptions_per_s": 0.0,
            "gpus": [],
        }
    )


def main() -> None:
    app = QApplication.instance() or QApplication([])
    m = MonitorPanel(fps=1)  # we drive refresh() ourselves
    m.timer.stop()
    m.resize(1600, 1000)
    m.show()
    rng = np.random.default_rng(0)
    t0 = 1.7e9
    n = 36000
    t_fill = time.perf_counter()
    for i in range(n):
        m.add_event(event(t0 + i / 10, rng))
    fill = time.perf_counter() - t_fill
    series = sum(1 for c in m.curves)
    print(
        f"filled {n} points x {series} series in {fill:.2f} s ({fill / n * 1e6:.1f} us per event)"
    )
    i = n
    for label in ("1 min", "10 min", "1 h"):
        m.window_box.setCurrentText(label)
        times, upd = [], []
        for _ in range(40):
            m.add_event(event(t0 + i / 10, rng))
            i += 1
            t = time.perf_counter()
            m.refresh()  # setData of every curve, as the 10 Hz QTimer does
            t1 = time.perf_counter()
            app.processEvents()  # Qt paints what changed
            times.append((time.perf_counter() - t) * 1000)
            upd.append((t1 - t) * 1000)
        print(
            f"window {label:>6}: frame median {statistics.median(times):.2f} ms, "
            f"p90 {sorted(times)[int(0.9 * len(times))]:.2f} ms (goal <= 5 ms); of which "
            f"data update {statistics.median(upd):.2f} ms, paint "
            f"{statistics.median(times) - statistics.median(upd):.2f} ms"
        )
    # live: 10 Hz frames, a sample every 5th (the 1 h window is still chosen)
    times = []
    for f in range(100):
        if f % 5 == 0:
            m.add_event(event(t0 + i / 10, rng))
            i += 5  # 0.5 s apart: no gap
        t = time.perf_counter()
        m.refresh()
        app.processEvents()
        times.append((time.perf_counter() - t) * 1000)
    print(
        f"1 h, samples at 2 Hz: frame mean {statistics.mean(times):.2f} ms; with a new sample "
        f"median {statistics.median(times[::5]):.2f} ms, without "
        f"{statistics.median(x for f, x in enumerate(times) if f % 5):.2f} ms"
    )


if __name__ == "__main__":
    main()
