"""The time-series store behind the Monitor: ring, windows, decimation, GPU series, CSV."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
from conftest import metrics_event

from quantdeck.core.monitor import TimeSeriesStore


def test_store_ring_and_window() -> None:
    s = TimeSeriesStore(capacity=100)
    for i in range(250):
        s.append(metrics_event(1000.0 + i * 0.1, running=i))
    assert len(s) == 100
    t, cols = s.window(2.0, ["running"])
    assert t[-1] == 0 and t[0] >= -2.0 - 1e-9 and len(t) in (20, 21)
    assert list(cols["running"][-3:]) == [247, 248, 249]
    t_all, cols_all = s.window(None, ["running"])
    assert cols_all["running"][0] == 150 and np.all(np.diff(t_all) > 0)
    assert s.latest("ttft_p99_ms") is None and s.latest("running") == 249


def test_decimated_window_keeps_peaks_and_the_newest_point() -> None:
    """Long windows come from the stored (min, max) blocks, bins aligned to the first point
    ever appended: each bin's min and max equal those of its raw points, a single spike
    survives, the newest point is drawn, and a later frame reuses the same full bins."""
    rng = np.random.default_rng(0)
    s = TimeSeriesStore()
    n = 40_000  # wraps the 36,000-point ring
    values = rng.normal(size=n)
    values[rng.random(n) < 0.05] = np.nan  # gaps
    values[39_000] = 50.0  # one spike
    values[-1] = 3.25
    for i in range(n):
        s.append(metrics_event(1000.0 + i / 10, running=None if np.isnan(values[i]) else values[i]))
    t, cols = s.window(3600.0, ["running"], max_points=900)
    y = cols["running"]
    assert 800 <= len(t) <= 902 and t[-1] <= 0 and np.all(np.diff(t) >= 0)
    assert np.nanmax(y) == 50.0 and min(y[-2:]) <= 3.25 <= max(y[-2:])
    # the raw points of the window, bins of k starting at multiples of k
    raw = values[n - 36_000 :]
    k = 80  # 36,000 points into 450 bins of whole 8-point blocks
    head = (-(n - 36_000)) % k
    full = raw[head : head + (len(raw) - head) // k * k].reshape(-1, k)
    pairs = y[: 2 * len(full)].reshape(-1, 2)
    with np.errstate(invalid="ignore"):
        assert np.array_equal(
            np.fmin.reduce(pairs, axis=1), np.fmin.reduce(full, axis=1), equal_nan=True
        )
        assert np.array_equal(
            np.fmax.reduce(pairs, axis=1), np.fmax.reduce(full, axis=1), equal_nan=True
        )
        # each pair starts at the extreme nearer the bin before: the line does not go back
        # across the whole next column between bins
        mid = pairs.sum(axis=1) / 2
        gap = np.abs(pairs[1:, 0] - mid[:-1]) <= np.abs(pairs[1:, 1] - mid[:-1])
        assert np.all(gap | np.isnan(mid[:-1]) | np.isnan(pairs[1:, 0]))
        assert not np.all(pairs[:, 0] <= pairs[:, 1])  # not all drawn min-then-max
    s.append(metrics_event(1000.0 + n / 10, running=-7.0))
    t2, cols2 = s.window(3600.0, ["running"], max_points=900)
    assert cols2["running"][-2:].tolist() == [-7.0, -7.0]  # a new, partial bin
    # the oldest bin lost a point to the ring: dropped; the other full bins are unchanged
    assert np.array_equal(cols2["running"][:-2], y[2:], equal_nan=True)


def test_gpu_series_appear(tmp_path: Path) -> None:
    s = TimeSeriesStore()
    gpu = {
        "utilization_pct": 87.0,
        "memory_used_bytes": 100 * 2**30,
        "power_w": 512.0,
        "temperature_c": 50.0,
        "server_memory_bytes": None,
    }
    s.append(metrics_event(1.0, gpus=[gpu, dict(gpu, utilization_pct=12.0)]))
    assert s.num_gpus == 2 and s.latest("gpu1_util_pct") == 12.0
    assert s.latest("gpu0_memory_used_gib") == 100.0 and s.latest("gpu0_server_memory_gib") is None
    n = s.to_csv(tmp_path / "m.csv")
    rows = list(csv.DictReader((tmp_path / "m.csv").read_text().splitlines()))
    assert n == 1 and rows[0]["gpu0_power_w"] == "512" and rows[0]["gpu0_server_memory_gib"] == ""
