"""Bounded numpy histories of the monitored series, fed by flat ``metrics`` events.

The same store serves live monitoring and replay (both speak the event dicts of
``quantdeck serve --json-events``), the Monitor's plots and its CSV export. The table of series
lives here, once: name, unit, and how to read it from an event.
"""

from __future__ import annotations

import csv
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from quantdeck.core.events import Event, MetricsEvent
from quantdeck.core.snapshots import GpuSnapshot, MetricsSnapshot, TelemetrySnapshot

GiB = 2**30
# GPUs a store keeps series for (each costs 5 columns of ``capacity`` points, 1.4 MiB at the
# default): the first ones of an event that lists more are kept, so that a recording cannot
# make the store allocate without bound.
MAX_GPUS = 16


@dataclass(frozen=True)
class SeriesSpec:
    name: str  # column name, unit included
    read: Callable[[MetricsEvent], float | None]  # its value in one metrics event


def _number(v: Any, scale: float) -> float | None:
    """A reading as a finite float, scaled; None for anything else (a gap in the plot)."""
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    x = float(v) * scale
    return x if math.isfinite(x) else None


def _m(
    get: Callable[[MetricsSnapshot], Any], scale: float = 1.0
) -> Callable[[MetricsEvent], float | None]:
    """A figure of the event's /metrics scrape."""

    def read(ev: MetricsEvent) -> float | None:
        return None if ev.metrics is None else _number(get(ev.metrics), scale)

    return read


def _host(
    get: Callable[[TelemetrySnapshot], Any], scale: float = 1.0
) -> Callable[[MetricsEvent], float | None]:
    """A figure of the event's host telemetry."""

    def read(ev: MetricsEvent) -> float | None:
        return None if ev.telemetry is None else _number(get(ev.telemetry), scale)

    return read


def _gpus(ev: MetricsEvent) -> tuple[GpuSnapshot, ...]:
    return () if ev.telemetry is None else ev.telemetry.gpus


def _gpu(
    i: int, get: Callable[[GpuSnapshot], Any], scale: float = 1.0
) -> Callable[[MetricsEvent], float | None]:
    def read(ev: MetricsEvent) -> float | None:
        gpus = _gpus(ev)
        return _number(get(gpus[i]), scale) if i < len(gpus) else None

    return read


BASE_SERIES: tuple[SeriesSpec, ...] = (
    SeriesSpec("host_cpu_pct", _host(lambda h: h.host_cpu_pct)),
    SeriesSpec("host_ram_used_gib", _host(lambda h: h.host_ram_used_bytes, 1 / GiB)),
    SeriesSpec("server_rss_gib", _host(lambda h: h.server_rss_bytes, 1 / GiB)),
    SeriesSpec("kv_blocks_used", _m(lambda m: m.kv_blocks_used)),
    SeriesSpec("kv_blocks_total", _m(lambda m: m.kv_blocks_total)),
    SeriesSpec("kv_usage_pct", _m(lambda m: m.kv_usage_pct)),
    SeriesSpec("running", _m(lambda m: m.running)),
    SeriesSpec("waiting", _m(lambda m: m.waiting)),
    SeriesSpec("ttft_p50_ms", _m(lambda m: m.ttft_p50_ms)),
    SeriesSpec("ttft_p99_ms", _m(lambda m: m.ttft_p99_ms)),
    SeriesSpec("itl_p50_ms", _m(lambda m: m.itl_p50_ms)),
    SeriesSpec("itl_p99_ms", _m(lambda m: m.itl_p99_ms)),
    SeriesSpec("e2e_p50_ms", _m(lambda m: m.e2e_p50_ms)),
    SeriesSpec("e2e_p99_ms", _m(lambda m: m.e2e_p99_ms)),
    SeriesSpec("prompt_tokens_per_s", _m(lambda m: m.prompt_tokens_per_s)),
    SeriesSpec("generation_tokens_per_s", _m(lambda m: m.generation_tokens_per_s)),
    SeriesSpec("preemptions_per_s", _m(lambda m: m.preemptions_per_s)),
    # the operator's panels (vLLM's own dashboards): request phases, outcomes, rates
    SeriesSpec("queue_p50_ms", _m(lambda m: m.queue_p50_ms)),
    SeriesSpec("queue_p99_ms", _m(lambda m: m.queue_p99_ms)),
    SeriesSpec("prefill_p50_ms", _m(lambda m: m.prefill_p50_ms)),
    SeriesSpec("prefill_p99_ms", _m(lambda m: m.prefill_p99_ms)),
    SeriesSpec("decode_p50_ms", _m(lambda m: m.decode_p50_ms)),
    SeriesSpec("decode_p99_ms", _m(lambda m: m.decode_p99_ms)),
    SeriesSpec("finished_stop_per_s", _m(lambda m: m.finished_stop_per_s)),
    SeriesSpec("finished_length_per_s", _m(lambda m: m.finished_length_per_s)),
    SeriesSpec("finished_abort_per_s", _m(lambda m: m.finished_abort_per_s)),
    SeriesSpec("finished_error_per_s", _m(lambda m: m.finished_error_per_s)),
    SeriesSpec("prefix_hit_pct", _m(lambda m: m.prefix_cache_hit_rate, 100.0)),
    SeriesSpec("ttft_slo_pct", _m(lambda m: m.ttft_slo_attainment, 100.0)),
    SeriesSpec("itl_slo_pct", _m(lambda m: m.itl_slo_attainment, 100.0)),
    SeriesSpec("e2e_slo_pct", _m(lambda m: m.e2e_slo_attainment, 100.0)),
    SeriesSpec("spec_accept_pct", _m(lambda m: m.spec_acceptance_rate, 100.0)),
    SeriesSpec("lora_running", _m(lambda m: m.lora_running)),
    SeriesSpec("lora_waiting", _m(lambda m: m.lora_waiting)),
    SeriesSpec("kv_block_lifetime_p50_s", _m(lambda m: m.kv_block_lifetime_p50_ms, 1 / 1000)),
    SeriesSpec("kv_block_lifetime_p99_s", _m(lambda m: m.kv_block_lifetime_p99_ms, 1 / 1000)),
    SeriesSpec("kv_block_idle_p50_s", _m(lambda m: m.kv_block_idle_p50_ms, 1 / 1000)),
    SeriesSpec("kv_block_idle_p99_s", _m(lambda m: m.kv_block_idle_p99_ms, 1 / 1000)),
    SeriesSpec("kv_block_reuse_gap_p50_s", _m(lambda m: m.kv_block_reuse_gap_p50_ms, 1 / 1000)),
    SeriesSpec("kv_block_reuse_gap_p99_s", _m(lambda m: m.kv_block_reuse_gap_p99_ms, 1 / 1000)),
)


def gpu_series(i: int) -> tuple[SeriesSpec, ...]:
    return (
        SeriesSpec(f"gpu{i}_util_pct", _gpu(i, lambda g: g.utilization_pct)),
        SeriesSpec(f"gpu{i}_memory_used_gib", _gpu(i, lambda g: g.memory_used_bytes, 1 / GiB)),
        SeriesSpec(f"gpu{i}_power_w", _gpu(i, lambda g: g.power_w)),
        SeriesSpec(f"gpu{i}_temperature_c", _gpu(i, lambda g: g.temperature_c)),
        SeriesSpec(f"gpu{i}_server_memory_gib", _gpu(i, lambda g: g.server_memory_bytes, 1 / GiB)),
    )


def _orient(pairs: np.ndarray, prev_mid: float = np.nan) -> np.ndarray:
    """Order each (min, max) row of ``pairs`` to start at the end nearer the previous row's
    midpoint (``prev_mid`` for the first row), in place. Which of a bin's two extremes came
    first is not kept, and either order shows the same column of pixels; but drawn always
    min-then-max, the line goes back down across the whole next column between every two
    bins, which doubles the pixels a long window strokes. NaN rows stay as they are."""
    if not len(pairs):
        return pairs
    mid = pairs.sum(axis=1) / 2
    before = np.concatenate(([prev_mid], mid[:-1]))
    with np.errstate(invalid="ignore"):
        flip = np.abs(pairs[:, 1] - before) < np.abs(pairs[:, 0] - before)
    pairs[flip] = pairs[flip, ::-1]
    return pairs


def _aligned_bins(
    t: np.ndarray, cols: dict[str, np.ndarray], k: int
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """(min, max) pairs of consecutive bins of ``k`` points from the first; the last bin may
    be partial."""
    full = (len(t) // k) * k
    t_bins = (t[:full:k] + t[k - 1 : full : k]) / 2
    if full < len(t):
        t_bins = np.append(t_bins, (t[full] + t[-1]) / 2)
    out = {}
    with np.errstate(invalid="ignore"):
        for name, v in cols.items():
            pair = np.empty((len(t_bins), 2))
            vb = v[:full].reshape(-1, k)
            np.fmin.reduce(vb, axis=1, out=pair[: len(vb), 0])  # fmin/fmax skip NaN; all-NaN
            np.fmax.reduce(vb, axis=1, out=pair[: len(vb), 1])  # bins stay NaN (a gap)
            if full < len(t):
                pair[-1] = np.fmin.reduce(v[full:]), np.fmax.reduce(v[full:])
            out[name] = _orient(pair).reshape(-1)
    return np.repeat(t_bins, 2), out


BLOCK = 8  # points per stored (min, max) block: long windows are decimated from these


class TimeSeriesStore:
    """Preallocated ring buffers: one time axis, one float64 column per series (NaN = none).

    ``capacity`` points (default: an hour at 10 Hz). Appends are O(1); ``window(seconds)``
    returns views without copying when the data does not wrap. Every ``BLOCK`` appends the
    block's minimum and maximum per series are kept too, so that a long window's peak
    decimation costs O(blocks), not O(points).
    """

    def __init__(self, capacity: int = 36000) -> None:
        self.capacity = capacity
        self._lock = threading.Lock()
        self.specs: list[SeriesSpec] = list(BASE_SERIES)
        self._t = np.full(capacity, np.nan)
        self._cols: dict[str, np.ndarray] = {s.name: np.full(capacity, np.nan) for s in self.specs}
        # blocks need the ring to hold whole blocks (capacity a multiple of BLOCK)
        self._nb = capacity // BLOCK if capacity % BLOCK == 0 else 0
        self._bt = np.full((self._nb, 2), np.nan)  # first and last time of each block
        self._bmin: dict[str, np.ndarray] = {s.name: np.full(self._nb, np.nan) for s in self.specs}
        self._bmax: dict[str, np.ndarray] = {s.name: np.full(self._nb, np.nan) for s in self.specs}
        self._bins: dict[Any, Any] = {}  # the last full bins _decimate_blocks made
        self._n = 0  # total appended
        self.num_gpus = 0
        self.version = 0  # bumps on every append: views redraw only when it moved

    def _ensure_gpus(self, n: int) -> None:
        while self.num_gpus < n:
            for s in gpu_series(self.num_gpus):
                self.specs.append(s)
                self._cols[s.name] = np.full(self.capacity, np.nan)
                self._bmin[s.name] = np.full(self._nb, np.nan)
                self._bmax[s.name] = np.full(self._nb, np.nan)
            self.num_gpus += 1

    def append(self, ev: Event) -> None:
        """Add one :class:`MetricsEvent` (other events, and one without a time, are ignored)."""
        if not isinstance(ev, MetricsEvent):
            return
        t = _number(ev.t, 1.0)
        if t is None:
            return
        with self._lock:
            self._ensure_gpus(min(len(_gpus(ev)), MAX_GPUS))
            i = self._n % self.capacity
            self._t[i] = t
            for s in self.specs:
                v = s.read(ev)
                self._cols[s.name][i] = np.nan if v is None else v
            self._n += 1
            if self._nb and self._n % BLOCK == 0:
                self._close_block(i + 1 - BLOCK)
            self.version += 1

    def _close_block(self, i0: int) -> None:
        """Summarise the block of ring positions ``i0 .. i0 + BLOCK - 1``."""
        b = i0 // BLOCK
        self._bt[b] = self._t[i0], self._t[i0 + BLOCK - 1]
        with np.errstate(invalid="ignore"):
            for name, c in self._cols.items():
                seg = c[i0 : i0 + BLOCK]
                self._bmin[name][b] = np.fmin.reduce(seg)
                self._bmax[name][b] = np.fmax.reduce(seg)

    def clear(self) -> None:
        with self._lock:
            self._t[:] = np.nan
            for c in self._cols.values():
                c[:] = np.nan
            self._bt[:] = np.nan
            self._bins = {}
            self._n = 0
            self.version += 1

    def __len__(self) -> int:
        return min(self._n, self.capacity)

    @property
    def last_t(self) -> float | None:
        """The newest point's time (None: empty)."""
        with self._lock:
            return float(self._t[(self._n - 1) % self.capacity]) if self._n else None

    def _ordered(self, a: np.ndarray) -> np.ndarray:
        n = len(self)
        if self._n <= self.capacity:
            return a[:n]
        i = self._n % self.capacity
        return np.concatenate((a[i:], a[:i]))

    def _span(self, a: np.ndarray, lo: int, hi: int, ring: int) -> np.ndarray:
        """Absolute indices ``lo .. hi - 1`` of ring ``a`` (of length ``ring``), in order."""
        i, j = lo % ring, hi % ring or ring
        if hi - lo <= 0:
            return a[:0]
        if i < j:
            return a[i:j]
        return np.concatenate((a[i:], a[:j]))

    def _first_at_or_after(self, lo: int, hi: int, t: float) -> int:
        """The first absolute index in ``lo .. hi - 1`` whose time is >= ``t`` (times grow)."""
        while lo < hi:
            mid = (lo + hi) // 2
            if self._t[mid % self.capacity] < t:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def window(
        self,
        seconds: float | None = None,
        names: list[str] | None = None,
        max_points: int | None = None,
    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Time (s, relative to the newest point) and columns for the last ``seconds``.

        ``max_points``: decimate longer windows to at most that many points per series,
        keeping each bin's minimum and maximum (peak decimation: spikes stay visible), as a
        pair at the bin's time in the order :func:`_orient` gives. Bins start at multiples of
        their size counted from the first point ever appended, so a bin, once full, looks the
        same on every later frame; the oldest points that do not fill a bin are dropped and the
        newest, not yet full bin is drawn as it stands.
        """
        with self._lock:
            n, cap = self._n, self.capacity
            wanted = [k for k in self._cols if names is None or k in names]
            if n == 0:
                return np.empty(0), {}
            oldest = n - min(n, cap)
            t_last = float(self._t[(n - 1) % cap])
            start = oldest
            if seconds is not None:
                start = self._first_at_or_after(oldest, n, t_last - seconds)
            count = n - start
            if max_points is None or count <= max_points:
                rel = self._span(self._t, start, n, cap) - t_last
                return rel, {k: self._span(self._cols[k], start, n, cap) for k in wanted}
            k = int(np.ceil(count / (max_points // 2)))
            if self._nb and k >= BLOCK:
                k = -(-k // BLOCK) * BLOCK
                return self._decimate_blocks(start, n, k, wanted, t_last)
            rel = self._span(self._t, start, n, cap) - t_last
            cols = {name: self._span(self._cols[name], start, n, cap) for name in wanted}
        head = (-start) % k  # align bins to absolute indices
        return _aligned_bins(rel[head:], {name: c[head:] for name, c in cols.items()}, k)

    def _decimate_blocks(
        self, start: int, n: int, k: int, names: list[str], t_last: float
    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Peak decimation of absolute indices ``start .. n - 1`` in bins of ``k`` points (a
        multiple of BLOCK) from the stored blocks; the newest, partial bin from the points.
        Full bins never change: those of the previous call are kept, only new ones computed."""
        first, end = -(-start // k), n // k  # full bins: numbers first .. end - 1
        key = (k, tuple(names))
        cached = self._bins.get(key)
        if cached is not None and cached[0] <= first <= cached[1]:
            c_first, c_end, c_t, c_cols = cached
            t_bins, cols = (
                c_t[first - c_first :],
                {name: c_cols[name][first - c_first :] for name in names},
            )
            if end > c_end:  # bins completed since: computed, after the cached ones
                prev = {name: c[-1].sum() / 2 for name, c in c_cols.items()} if len(c_t) else None
                new_t, new_cols = self._block_bins(c_end, end, k, names, prev)
                t_bins = np.concatenate((t_bins, new_t))
                cols = {name: np.concatenate((cols[name], new_cols[name])) for name in names}
        else:
            t_bins, cols = self._block_bins(first, end, k, names)
        self._bins = {key: (first, end, t_bins, cols)}  # one window shown at a time
        out = {name: c.reshape(-1) for name, c in cols.items()}
        tail = max(start, end * k)  # the newest points, not a full bin yet
        if tail < n:
            tt = self._span(self._t, tail, n, self.capacity)
            t_bins = np.append(t_bins, (tt[0] + tt[-1]) / 2)
            with np.errstate(invalid="ignore"):
                for name in names:
                    seg = self._span(self._cols[name], tail, n, self.capacity)
                    lo, hi = float(np.fmin.reduce(seg)), float(np.fmax.reduce(seg))
                    if len(cols[name]):  # as _orient does, after the last full bin
                        before = cols[name][-1]
                        mid = (float(before[0]) + float(before[1])) / 2
                        if abs(hi - mid) < abs(lo - mid):
                            lo, hi = hi, lo
                    out[name] = np.append(out[name], (lo, hi))
        return np.repeat(t_bins - t_last, 2), out

    def _block_bins(
        self, first: int, end: int, k: int, names: list[str], prev: dict[str, float] | None = None
    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Bins ``first .. end - 1`` of ``k`` points from the blocks: mid times (absolute)
        and (bins, 2) arrays of each bin's min and max per series, in the order
        :func:`_orient` gives them after the bin before (``prev``: its midpoint per series)."""
        per = k // BLOCK
        b0, b1 = first * per, max(first, end) * per
        bt = self._span(self._bt, b0, b1, self._nb).reshape(-1, per, 2)
        t_bins = (bt[:, 0, 0] + bt[:, -1, 1]) / 2
        cols = {}
        with np.errstate(invalid="ignore"):
            for name in names:
                pair = np.empty((len(t_bins), 2))
                np.fmin.reduce(
                    self._span(self._bmin[name], b0, b1, self._nb).reshape(-1, per),
                    axis=1,
                    out=pair[:, 0],
                )
                np.fmax.reduce(
                    self._span(self._bmax[name], b0, b1, self._nb).reshape(-1, per),
                    axis=1,
                    out=pair[:, 1],
                )
                cols[name] = _orient(pair, prev[name] if prev else np.nan)
        return t_bins, cols

    def span(
        self, t0: float, t1: float, names: list[str] | None = None
    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """The points with ``t0 <= t <= t1`` (unix seconds), undecimated: their times and a copy
        of each column (all of them, or ``names``)."""
        with self._lock:
            n, cap = self._n, self.capacity
            oldest = n - min(n, cap)
            lo = self._first_at_or_after(oldest, n, t0)
            hi = self._first_at_or_after(lo, n, np.nextafter(t1, np.inf))
            wanted = [k for k in self._cols if names is None or k in names]
            t = self._span(self._t, lo, hi, cap).copy()
            return t, {k: self._span(self._cols[k], lo, hi, cap).copy() for k in wanted}

    @property
    def first_t(self) -> float | None:
        """The oldest point's time (None: empty)."""
        with self._lock:
            if not self._n:
                return None
            return float(self._t[(self._n - min(self._n, self.capacity)) % self.capacity])

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
                w.writerow(
                    [f"{t[i]:.3f}", *["" if np.isnan(c[i]) else f"{c[i]:.6g}" for _, c in cols]]
                )
        return len(t)
