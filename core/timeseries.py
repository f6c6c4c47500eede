"""Bounded numpy histories of the monitored series, fed by flat ``metrics`` events.

The same store serves live monitoring and replay (both speak the event dicts of
``quantdeck serve --json-events``), the Monitor's plots and its CSV export. The table of series
lives here, once: name, unit, and how to read it from an event.
"""
from __future__ import annotations

import csv
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

GiB = 2**30


@dataclass(frozen=True)
class SeriesSpec:
    name: str  # column name, unit included
    read: Callable[[dict[str, Any]], float | None]


def _key(k: str, scale: float = 1.0) -> Callable[[dict[str, Any]], float | None]:
    def read(ev: dict[str, Any]) -> float | None:
        v = ev.get(k)
        return None if v is None else float(v) * scale
    return read


def _gpu(i: int, k: str, scale: float = 1.0) -> Callable[[dict[str, Any]], float | None]:
    def read(ev: dict[str, Any]) -> float | None:
        gpus = ev.get("gpus") or []
        if i >= len(gpus) or gpus[i].get(k) is None:
            return None
        return float(gpus[i][k]) * scale
    return read


BASE_SERIES: tuple[SeriesSpec, ...] = (
    SeriesSpec("host_cpu_pct", _key("host_cpu_pct")),
    SeriesSpec("host_ram_used_gib", _key("host_ram_used_bytes", 1 / GiB)),
    SeriesSpec("server_rss_gib", _key("server_rss_bytes", 1 / GiB)),
    SeriesSpec("kv_blocks_used", _key("kv_blocks_used")),
    SeriesSpec("kv_blocks_total", _key("kv_blocks_total")),
    SeriesSpec("kv_usage_pct", _key("kv_usage_pct")),
    SeriesSpec("running", _key("running")),
    SeriesSpec("waiting", _key("waiting")),
    SeriesSpec("ttft_p50_ms", _key("ttft_p50_ms")),
    SeriesSpec("ttft_p99_ms", _key("ttft_p99_ms")),
    SeriesSpec("itl_p50_ms", _key("itl_p50_ms")),
    SeriesSpec("itl_p99_ms", _key("itl_p99_ms")),
    SeriesSpec("e2e_p50_ms", _key("e2e_p50_ms")),
    SeriesSpec("e2e_p99_ms", _key("e2e_p99_ms")),
    SeriesSpec("prompt_tokens_per_s", _key("prompt_tokens_per_s")),
    SeriesSpec("generation_tokens_per_s", _key("generation_tokens_per_s")),
    SeriesSpec("preemptions_per_s", _key("preemptions_per_s")),
)


def gpu_series(i: int) -> tuple[SeriesSpec, ...]:
    return (SeriesSpec(f"gpu{i}_util_pct", _gpu(i, "utilization_pct")),
            SeriesSpec(f"gpu{i}_memory_used_gib", _gpu(i, "memory_used_bytes", 1 / GiB)),
            SeriesSpec(f"gpu{i}_power_w", _gpu(i, "power_w")),
            SeriesSpec(f"gpu{i}_temperature_c", _gpu(i, "temperature_c")),
            SeriesSpec(f"gpu{i}_server_memory_gib", _gpu(i, "server_memory_bytes", 1 / GiB)))


def peak_decimate(t: np.ndarray, cols: dict[str, np.ndarray], max_points: int
                  ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Bins of k points -> (min, max) pairs; about ``max_points`` points per series."""
    k = int(np.ceil(len(t) / (max_points // 2)))
    n = (len(t) // k) * k
    head = len(t) - n  # the oldest few points that do not fill a bin are dropped
    tb = t[head:].reshape(-1, k)
    t2 = np.repeat(tb[:, [0, -1]].mean(axis=1), 2)
    out = {}
    for name, v in cols.items():
        vb = v[head:].reshape(-1, k)
        pair = np.empty((vb.shape[0], 2))
        np.fmin.reduce(vb, axis=1, out=pair[:, 0])  # fmin/fmax skip NaN; all-NaN bins stay
        np.fmax.reduce(vb, axis=1, out=pair[:, 1])  # NaN (a gap), without a warning
        out[name] = pair.reshape(-1)
    return t2, out


class TimeSeriesStore:
    """Preallocated ring buffers: one time axis, one float64 column per series (NaN = none).

    ``capacity`` points (default: an hour at 10 Hz). Appends are O(1); ``window(seconds)``
    returns views without copying when the data does not wrap.
    """

    def __init__(self, capacity: int = 36000) -> None:
        self.capacity = capacity
        self._lock = threading.Lock()
        self.specs: list[SeriesSpec] = list(BASE_SERIES)
        self._t = np.full(capacity, np.nan)
        self._cols: dict[str, np.ndarray] = {s.name: np.full(capacity, np.nan)
                                             for s in self.specs}
        self._n = 0  # total appended
        self.num_gpus = 0
        self.version = 0  # bumps on every append: views redraw only when it moved

    def _ensure_gpus(self, n: int) -> None:
        while self.num_gpus < n:
            for s in gpu_series(self.num_gpus):
                self.specs.append(s)
                self._cols[s.name] = np.full(self.capacity, np.nan)
            self.num_gpus += 1

    def append(self, ev: dict[str, Any]) -> None:
        """Add one ``metrics`` event (others are ignored)."""
        if ev.get("event") != "metrics" or "t" not in ev:
            return
        with self._lock:
            self._ensure_gpus(len(ev.get("gpus") or []))
            i = self._n % self.capacity
            self._t[i] = float(ev["t"])
            for s in self.specs:
                v = s.read(ev)
                self._cols[s.name][i] = np.nan if v is None else v
            self._n += 1
            self.version += 1

    def clear(self) -> None:
        with self._lock:
            self._t[:] = np.nan
            for c in self._cols.values():
                c[:] = np.nan
            self._n = 0
            self.version += 1

    def __len__(self) -> int:
        return min(self._n, self.capacity)

    def _ordered(self, a: np.ndarray) -> np.ndarray:
        n = len(self)
        if self._n <= self.capacity:
            return a[:n]
        i = self._n % self.capacity
        return np.concatenate((a[i:], a[:i]))

    def window(self, seconds: float | None = None, names: list[str] | None = None,
               max_points: int | None = None) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Time (s, relative to the newest point) and columns for the last ``seconds``.

        ``max_points``: decimate longer windows to at most that many points per series,
        keeping each bin's minimum and maximum (peak decimation: spikes stay visible).
        """
        with self._lock:
            t = self._ordered(self._t)
            if len(t) == 0:
                return t, {}
            start = 0
            if seconds is not None:
                start = int(np.searchsorted(t - t[-1], -seconds, side="left"))
            t = t[start:]
            cols = {k: self._ordered(v)[start:] for k, v in self._cols.items()
                    if names is None or k in names}
        rel = t - t[-1]
        if max_points is not None and len(rel) > max_points:
            return peak_decimate(rel, cols, max_points)
        return rel, cols

    def latest(self, name: str) -> float | None:
        with self._lock:
            if self._n == 0:
                return None
            v = self._cols[name][(self._n - 1) % self.capacity]
        return None if np.isnan(v) else float(v)

    def to_csv(self, path: str | Path) -> int:
        """Write every point (unix time + all series); returns the number of rows."""
        with self._lock:
            t = self._ordered(self._t)
            cols = [(s.name, self._ordered(self._cols[s.name])) for s in self.specs]
        with open(path, "w", newline="", encoding="utf-8") as f:
            w = csv.writer(f)
            w.writerow(["t_unix_s", *[n for n, _ in cols]])
            for i in range(len(t)):
                w.writerow([f"{t[i]:.3f}", *["" if np.isnan(c[i]) else f"{c[i]:.6g}"
                                             for _, c in cols]])
        return len(t)
