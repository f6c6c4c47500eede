"""The tuning timeline: what changed on the server, as markers on the Monitor's time axis, and
a comparison of two spans of its history with the changes that separate them.

Markers are :class:`~quantdeck.core.events.MarkerEvent` s: ``launch`` (the first start),
``restart`` (the same settings again), ``knobs`` (a start with other settings: the ``diff``
says which, ``{key: [before, after]}``), ``fleet`` (a fleet's fallback switched, the router's
workers with it) and ``bench`` (a benchmark run). They are written into recordings
(``quantdeck serve --record`` writes its launch), and read back from them; a recording made
before markers existed gets its launch from its header.

:func:`compare_spans` sums up two time spans of a
:class:`~quantdeck.core.monitor.timeseries.TimeSeriesStore` from the series the Monitor keeps:
throughput as the mean of the sampled rates (idle samples count: it is what the span served),
latency percentiles as the median of the sampled windowed percentiles (samples without requests
have none and are left out), KV use as mean and peak, the prefix-cache hit rate as its mean.
Plain Python.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, TypeGuard

import numpy as np

from quantdeck.core.errors import ConfigError
from quantdeck.core.events import (
    Event,
    FallbackEvent,
    InstanceEvent,
    MarkerEvent,
    MetricsEvent,
    RouteEvent,
    StateEvent,
)
from quantdeck.core.launch.diff import knob_value
from quantdeck.core.monitor.recording import Recording
from quantdeck.core.monitor.timeseries import TimeSeriesStore

LAUNCHES = ("launch", "restart", "knobs")
KINDS = (*LAUNCHES, "failed", "fleet", "bench")  # failed: a launch that never became ready
FLEET_MERGE_S = 2.0  # a router change this close to a fleet marker belongs to it
FLEET_REASONS = ("fallback", "recovered")  # the router changes a fallback switch makes

Marker = MarkerEvent  # the timeline's markers are the events recordings keep


def flat_config(cfg: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``knobs.to_dict``'s mapping with nested mappings as ``outer.inner`` keys."""
    out: dict[str, Any] = {}
    for k, v in cfg.items():
        if isinstance(v, Mapping):
            out.update(flat_config(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def config_diff(before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, list[Any]]:
    """The settings that differ, ``{key: [before, after]}`` in key order; a key one side lacks
    is ``None`` there (``to_dict`` leaves out what equals vLLM's default)."""
    a, b = flat_config(before), flat_config(after)
    return {k: [a.get(k), b.get(k)] for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)}


def _value(key: str, v: Any) -> str:
    """A setting's value as every view says it (core/launch/diff.py); one the launch did not
    set is vLLM's ``default`` (``to_dict`` leaves those out)."""
    return "default" if v is None else knob_value(key, v)


def diff_text(diff: Mapping[str, list[Any]], *, limit: int | None = None) -> str:
    """``key before → after`` per change, comma-separated (``limit``: at most that many, then
    ``+N more``)."""
    items = [f"{k} {_value(k, v[0])} → {_value(k, v[1])}" for k, v in diff.items()]
    if limit is not None and len(items) > limit:
        items = [*items[:limit], f"+{len(items) - limit} more"]
    return ", ".join(items)


def describe(m: MarkerEvent) -> str:
    """The marker as a tooltip says it: time, label, then each change on a line."""
    stamp = time.strftime("%H:%M:%S", time.localtime(m.t))
    lines = [f"{stamp}  {m.label}"]
    lines += [f"  {k}: {_value(k, v[0])} → {_value(k, v[1])}" for k, v in m.diff.items()]
    return "\n".join(lines)


class Timeline:
    """The markers of one Monitor (or recording), in time order, and the settings of the last
    launch, against which the next launch's diff is taken. ``version`` moves on every change
    (views redraw then). Used on one thread."""

    def __init__(self) -> None:
        self.markers: list[MarkerEvent] = []
        self.config: dict[str, Any] | None = None  # the last launch's settings
        self.version = 0
        self._starting: MarkerEvent | None = None  # the launch not yet ready (or failed)

    def __len__(self) -> int:
        return len(self.markers)

    def clear(self) -> None:
        self.markers.clear()
        self.config = None
        self._starting = None
        self.version += 1

    def add(self, m: MarkerEvent) -> MarkerEvent:
        """Keep ``m`` (in time order); the newest launch's settings are those the next
        launch is diffed against."""
        i = len(self.markers)
        while i and self.markers[i - 1].t > m.t:
            i -= 1
        self.markers.insert(i, m)
        started = (*LAUNCHES, "failed")  # the settings the next launch is diffed against
        newest = not any(x.what in started for x in self.markers[i + 1 :])
        if m.what in started and isinstance(m.config, dict) and newest:
            self.config = dict(m.config)
        self.version += 1
        return m

    def launch(self, config: Mapping[str, Any], *, t: float | None = None) -> MarkerEvent:
        """A server starts with ``config`` (``knobs.to_dict``): a ``launch`` marker the first
        time, then ``restart`` or ``knobs`` with the diff from the previous launch."""
        cfg = dict(config)
        if self.config is None:
            what, diff, label = "launch", {}, "launch"
        else:
            diff = config_diff(self.config, cfg)
            what = "knobs" if diff else "restart"
            label = f"knobs: {diff_text(diff, limit=1)}" if diff else "restart"
        stamp = time.time() if t is None else t
        self._starting = self.add(MarkerEvent(what, label, diff, config=cfg, t=stamp))
        return self._starting

    def _failed(self, reason: str) -> MarkerEvent | None:
        """The launch still starting crashed: its marker says ``failed start`` (its diff and
        settings kept: the next launch is diffed against them)."""
        m, self._starting = self._starting, None
        if m is None or m not in self.markers:
            return None
        why = reason if len(reason) <= 60 else reason[:59] + "…"
        failed = MarkerEvent(
            "failed", f"failed start: {why}" if why else "failed start", m.diff, m.config, m.t
        )
        self.markers[self.markers.index(m)] = failed
        self.version += 1
        return failed

    def observe(self, ev: Event) -> MarkerEvent | None:
        """Take the marker an event makes, if any: a recorded marker (a recorded launch is
        diffed against this timeline's previous one), a fleet's fallback switch and the router
        changes it makes. Other events make none."""
        inner = ev.event if isinstance(ev, InstanceEvent) else ev
        if isinstance(ev, StateEvent):  # the server's own (not a fleet instance's)
            if ev.state in ("ready", "attached", "stopped"):
                self._starting = None
            elif ev.state == "crashed":
                return self._failed(ev.reason or "")
            return None
        if isinstance(inner, MarkerEvent):
            if inner.what in LAUNCHES and isinstance(inner.config, dict):
                return self.launch(inner.config, t=inner.t)
            return self.add(inner)
        if isinstance(inner, FallbackEvent):
            if inner.active:
                label = f"fallback on: {', '.join(inner.backups) or 'backups'} take traffic"
            else:
                label = "fallback off"
            value = "-" if inner.value_ms is None else f"{inner.value_ms:.0f}"
            diff: dict[str, list[Any]] = {
                "fallback": [not inner.active, inner.active],
                inner.metric: [f"limit {inner.above_ms:g}", f"{value} for {inner.held_s:g} s"],
            }
            return self._fleet(label, diff, inner.t)
        if isinstance(inner, RouteEvent) and inner.reason in FLEET_REASONS and inner.ok:
            was, now = ("out", "in") if inner.action == "add" else ("in", "out")
            return self._fleet(
                f"router {inner.action} {inner.worker}",
                {f"worker {inner.worker}": [was, now]},
                inner.t,
            )
        return None

    def _fleet(self, label: str, diff: dict[str, list[Any]], t: float) -> MarkerEvent:
        """A fleet marker, merged with one of the same switch (within FLEET_MERGE_S)."""
        for i, m in enumerate(self.markers):
            if m.what == "fleet" and abs(m.t - t) <= FLEET_MERGE_S:
                first = m.label if not m.label.startswith("router ") else label
                merged = MarkerEvent("fleet", first, {**m.diff, **diff}, t=min(m.t, t))
                self.markers[i] = merged
                self.version += 1
                return merged
        return self.add(MarkerEvent("fleet", label, diff, t=t))

    def between(self, t0: float, t1: float) -> list[MarkerEvent]:
        """The markers with ``t0 <= t <= t1``."""
        return [m for m in self.markers if t0 <= m.t <= t1]


def timeline_of(recordings: Iterable[Recording]) -> Timeline:
    """The timeline of recordings read in turn (their events in time order): the markers they
    hold, and for a recording without a launch marker (written before markers existed) its
    launch from the header's settings, at its first ``starting`` state."""
    tl = Timeline()
    for rec in recordings:
        launched = any(isinstance(e, MarkerEvent) and e.what in LAUNCHES for e in rec.events)
        config = rec.header.info.get("config")
        if not launched and isinstance(config, dict):
            start = next(
                (e.t for e in rec.of(StateEvent) if e.state == "starting"),
                rec.header.when,
            )
            if _finite(start):
                tl.launch(config, t=float(start))
        for ev in rec.events:
            tl.observe(ev)
    return tl


def histories(recordings: Iterable[Recording]) -> dict[str | None, list[Recording]]:
    """The histories the recordings hold, each to be compared on its own: a server's
    (``serve --record``, ``monitor --record``: key None) and, in a fleet's (``fleet up
    --record``), one per instance (key: its name), its events as a server's own (its metrics
    fill its store, its states and launches make its markers), with the fleet's switches
    (the router's fallback and route changes) beside them. In recording order; an instance
    seen in several recordings gets one history across them."""
    out: dict[str | None, list[Recording]] = {}
    for rec in recordings:
        names = list(dict.fromkeys(e.instance for e in rec.of(InstanceEvent)))
        own = [e for e in rec.events if not isinstance(e, InstanceEvent)]
        if own or not names:
            out.setdefault(None, []).append(Recording(rec.header, own))
        for name in names:
            events = [
                e.event if e.instance == name else e
                for e in rec.events
                if isinstance(e, InstanceEvent)
                and (e.instance == name or isinstance(e.event, FallbackEvent | RouteEvent))
            ]
            out.setdefault(name, []).append(Recording(rec.header, events))
    return out


def store_of(recordings: Iterable[Recording], store: TimeSeriesStore | None = None) -> Any:
    """A store fed the recordings' metrics (a fleet's: those of its instances, overlaid as
    one would not be: left out), sized to hold them all."""
    metrics = [e for rec in recordings for e in rec.of(MetricsEvent)]
    metrics.sort(key=lambda e: e.t)
    if store is None:
        store = TimeSeriesStore(capacity=max(8, -(-len(metrics) // 8) * 8))
    for ev in metrics:
        store.append(ev)
    return store


# -- comparing two spans --------------------------------------------------------------------


def _finite(v: Any) -> TypeGuard[float]:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


@dataclass(frozen=True)
class Span:
    """``t0 .. t1``, unix seconds."""

    t0: float
    t1: float

    def __post_init__(self) -> None:
        if not (_finite(self.t0) and _finite(self.t1)) or self.t1 < self.t0:
            raise ConfigError(f"a span runs from its start to its end, not {self.t0}..{self.t1}")

    @property
    def seconds(self) -> float:
        return self.t1 - self.t0

    def text(self, origin: float | None = None) -> str:
        """Its clock times and length (``08:12:31–08:13:01, 30 s``); with ``origin`` (the first
        sample), also as seconds since it, as ``quantdeck timeline --before`` takes them."""
        since = ""
        if origin is not None:
            since = f", {self.t0 - origin:.0f}..{self.t1 - origin:.0f} s since the first sample"
        return f"{_clock(self.t0)}–{_clock(self.t1)} ({self.seconds:.0f} s{since})"


def _clock(t: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t))


def plain_number(v: float | None, *, sign: bool = False) -> str:
    """A figure as a person reads it: digits grouped, no exponent, about 3 significant
    figures (``61,234``, ``612``, ``61.2``, ``6.12``, ``0.0612``); ``-`` for none."""
    if v is None or not math.isfinite(v):
        return "-"
    a = abs(v)
    if a >= 100 or a == 0:
        text = f"{v:,.0f}"
    elif a >= 10:
        text = f"{v:.1f}"
    elif a >= 1:
        text = f"{v:.2f}"
    else:
        text = f"{v:.3g}"
    return ("+" if sign and v > 0 else "") + text


# The load check of two spans: fewer requests running than this on average is idle, and
# busy spans whose averages differ by more than this factor differ in load.
IDLE_RUNNING = 0.1
LOAD_RATIO = 1.5
# a row's verdict between spans of different load: it changed, not better or worse
LOAD_DIFFERS = "differs (load differs)"

# (row, series, how a span sums it up, which way is better)
COMPARED: tuple[tuple[str, str, str, str], ...] = (
    ("generated tok/s", "generation_tokens_per_s", "mean", "higher"),
    ("prompt tok/s", "prompt_tokens_per_s", "mean", "higher"),
    ("TTFT p50 (ms)", "ttft_p50_ms", "median", "lower"),
    ("TTFT p99 (ms)", "ttft_p99_ms", "median", "lower"),
    ("ITL p50 (ms)", "itl_p50_ms", "median", "lower"),
    ("ITL p99 (ms)", "itl_p99_ms", "median", "lower"),
    ("E2E p99 (ms)", "e2e_p99_ms", "median", "lower"),
    ("KV use % (mean)", "kv_usage_pct", "mean", ""),
    ("KV use % (peak)", "kv_usage_pct", "max", ""),
    ("prefix-cache hits %", "prefix_hit_pct", "mean", "higher"),
    ("running (mean)", "running", "mean", ""),
    ("waiting (mean)", "waiting", "mean", "lower"),
    ("preemptions / s", "preemptions_per_s", "mean", "lower"),
)


def _reduce(values: np.ndarray, how: str) -> float | None:
    v = values[np.isfinite(values)]
    if not len(v):
        return None
    if how == "median":
        return float(np.median(v))
    if how == "max":
        return float(v.max())
    return float(v.mean())


@dataclass(frozen=True)
class MetricRow:
    """One figure of both spans."""

    name: str
    series: str
    better: str  # "higher", "lower" or "" (neither: a load's shape, not a result)
    before: float | None
    after: float | None
    # the spans differ in load (:func:`load_note`): a change is not better or worse then
    load_differs: bool = False

    @property
    def change(self) -> float | None:
        if self.before is None or self.after is None:
            return None
        return self.after - self.before

    @property
    def change_pct(self) -> float | None:
        if self.change is None or not self.before:
            return None
        return 100.0 * self.change / abs(self.before)

    @property
    def verdict(self) -> str:
        """``better``, ``worse`` or ``""`` (no direction, no change, or under 1 %); between
        spans of different load, :data:`LOAD_DIFFERS` instead of better or worse (latency and
        throughput follow load: the figures, not a judgement)."""
        pct = self.change_pct
        if not self.better or pct is None or abs(pct) < 1.0:
            return ""
        if self.load_differs:
            return LOAD_DIFFERS
        up = pct > 0
        return "better" if up == (self.better == "higher") else "worse"

    def change_text(self) -> str:
        """``+12.3 (+4%)``; a change of over 10 times its base as a ratio (``×383``), which
        says more than a percentage of a near-zero base."""
        if self.change is None:
            return "-"
        pct = self.change_pct
        text = plain_number(self.change, sign=True)
        if pct is None:
            return text
        if abs(pct) > 1000 and self.before and self.after is not None:
            return f"{text} (×{plain_number(self.after / self.before)})"
        return f"{text} ({pct:+.0f}%)"


def load_note(rows: Iterable[MetricRow]) -> str:
    """Why two spans may not be comparable (one idle and one serving, or load apart by more
    than half), from the requests running in each (``rows``' running row); "" when they look
    alike."""
    row = next((r for r in rows if r.series == "running"), None)
    b, a = (row.before, row.after) if row is not None else (None, None)
    if b is None or a is None:
        return ""
    idle = [name for name, v in (("before", b), ("after", a)) if v < IDLE_RUNNING]
    if len(idle) == 1 and max(a, b) >= 2 * IDLE_RUNNING:
        busy = "after" if idle[0] == "before" else "before"
        return (
            f"the {idle[0]} span is idle and the {busy} span serves "
            f"({plain_number(b)} vs {plain_number(a)} requests running on average): the "
            "figures compare different loads; move the spans over the same load, or run "
            "the same benchmark on both sides"
        )
    if not idle and max(a, b) > LOAD_RATIO * min(a, b):
        return (
            f"the spans differ in load ({plain_number(b)} vs {plain_number(a)} requests "
            "running on average): latency and throughput follow load"
        )
    return ""


@dataclass(frozen=True)
class SpanComparison:
    """Two spans' figures side by side, and the markers between them (the change that
    separates them)."""

    before: Span
    after: Span
    samples: tuple[int, int]
    rows: list[MetricRow]
    markers: list[MarkerEvent] = field(default_factory=list)
    origin: float = 0.0  # the first sample's time: spans are shown as seconds since it

    @property
    def diff(self) -> dict[str, list[Any]]:
        """The settings that changed across the markers: the first ``before`` value and the
        last ``after`` value of each key (a key changed and changed back is left out)."""
        out: dict[str, list[Any]] = {}
        for m in self.markers:
            if m.what not in LAUNCHES:
                continue
            for k, (a, b) in m.diff.items():
                out[k] = [out[k][0] if k in out else a, b]
        return {k: v for k, v in out.items() if v[0] != v[1]}

    def separated_by(self) -> str:
        """One line: the markers between the spans (what the diff says first)."""
        if not self.markers:
            return "no marker between the spans"
        diff = self.diff
        text = "; ".join(m.label for m in self.markers if m.what not in LAUNCHES or not diff)
        if diff:
            text = f"knobs: {diff_text(diff)}" + (f"; {text}" if text else "")
        return text

    def load_note(self) -> str:
        """Why the spans may not be comparable (:func:`load_note`); "" when they look alike."""
        return load_note(self.rows)

    def to_json(self) -> dict[str, Any]:
        return {
            "before": {"t0": self.before.t0, "t1": self.before.t1, "samples": self.samples[0]},
            "after": {"t0": self.after.t0, "t1": self.after.t1, "samples": self.samples[1]},
            "rows": [
                {
                    "metric": r.name,
                    "series": r.series,
                    "before": r.before,
                    "after": r.after,
                    "change": r.change,
                    "change_pct": r.change_pct,
                    "verdict": r.verdict,
                }
                for r in self.rows
            ],
            "diff": self.diff,
            "markers": [m.to_json() for m in self.markers],
            "separated_by": self.separated_by(),
            "load_note": self.load_note(),
        }

    def format(self) -> str:
        """The table as a person reads it (``quantdeck timeline``)."""
        w = max(len(r.name) for r in self.rows)
        lines = [
            f"before: {self.before.text(self.origin)}",
            f"after:  {self.after.text(self.origin)}",
            f"{'':<{w}}  {'before':>14}  {'after':>14}  change",
            f"{'samples':<{w}}  {self.samples[0]:>14}  {self.samples[1]:>14}",
        ]
        for r in self.rows:
            b, a = plain_number(r.before), plain_number(r.after)
            mark = f"  {r.verdict}" if r.verdict else ""
            lines.append(f"{r.name:<{w}}  {b:>14}  {a:>14}  {r.change_text()}{mark}")
        lines.append(f"separated by: {self.separated_by()}")
        note = self.load_note()
        if note:
            lines.append(f"note: {note}")
        return "\n".join(lines)


def compare_spans(
    store: TimeSeriesStore, before: Span, after: Span, timeline: Timeline | None = None
) -> SpanComparison:
    """The figures of two spans of ``store`` and the markers between them (from the end of
    the earlier span to the start of the later; overlapping spans: none)."""
    series = sorted({s for _, s, _, _ in COMPARED})
    tb, cb = store.span(before.t0, before.t1, series)
    ta, ca = store.span(after.t0, after.t1, series)
    rows = [
        MetricRow(
            name,
            s,
            better,
            _reduce(cb[s], how) if len(tb) else None,
            _reduce(ca[s], how) if len(ta) else None,
        )
        for name, s, how, better in COMPARED
    ]
    if load_note(rows):  # the figures side by side, but no better or worse across loads
        rows = [replace(r, load_differs=True) for r in rows]
    first, second = (before, after) if before.t0 <= after.t0 else (after, before)
    markers = timeline.between(first.t1, second.t0) if timeline is not None else []
    origin = store.first_t
    return SpanComparison(
        before, after, (len(tb), len(ta)), rows, markers, origin if origin is not None else 0.0
    )


def default_spans(store: TimeSeriesStore, timeline: Timeline | None = None) -> tuple[Span, Span]:
    """Two equal spans either side of the operator's latest change: the newest launch, knob
    change, restart, failed start or fleet switch with samples on both sides (a benchmark
    marker is load, not a change). Both are as long as the shorter side has samples (up to
    the change before, or the next one), so that they weigh the same time: the one before
    ends at the change, the one after is where the load is nearest the one before's
    (:func:`_comparable_after`). Without such a change, the two halves of the history.
    ConfigError when the store is empty."""
    first, last = store.first_t, store.last_t
    if first is None or last is None:
        raise ConfigError("no samples to compare")
    changes = [m.t for m in (timeline.markers if timeline is not None else []) if m.what != "bench"]
    for i in range(len(changes) - 1, -1, -1):
        t = changes[i]
        if not first < t < last:
            continue
        lo = max([first, *(c for c in changes[:i] if c < t)])
        hi = min([last, *(c for c in changes[i + 1 :] if c > t)])
        tb, ta = store.span(lo, t)[0], store.span(t, hi)[0]
        tb, ta = tb[tb < t], ta[ta > t]  # a sample at the change's time is on neither side
        if len(tb) and len(ta):
            width = min(float(tb[-1] - tb[0]), float(ta[-1] - ta[0]))
            before = Span(float(tb[-1]) - width, float(tb[-1]))
            return before, _comparable_after(store, before, float(ta[0]), float(ta[-1]), width)
    mid = (first + last) / 2
    return Span(first, mid), Span(mid, last)


def _comparable_after(
    store: TimeSeriesStore, before: Span, first: float, last: float, width: float
) -> Span:
    """The ``width`` span after the change (samples ``first`` .. ``last``) whose load (mean
    requests running) is nearest the ``before`` span's: a server that starts idle after a
    restart is compared where it serves again, not during its ramp-up. The earliest such
    span; the one next to the change when the load is unknown."""
    _, cb = store.span(before.t0, before.t1, ["running"])
    ta, ca = store.span(first, last, ["running"])
    want = _reduce(cb["running"], "mean")
    run = np.nan_to_num(ca["running"], nan=0.0)
    if want is None or len(ta) < 2:
        return Span(first, first + width)
    csum = np.concatenate([[0.0], np.cumsum(run)])
    ends = np.searchsorted(ta, ta + width, side="right")  # each start's window, exclusive end
    fits = ta + width <= last + 1e-9
    starts = np.flatnonzero(fits)
    if not len(starts):
        return Span(first, first + width)
    means = (csum[ends[starts]] - csum[starts]) / (ends[starts] - starts)
    best = int(starts[int(np.argmin(np.abs(means - want)))])
    return Span(float(ta[best]), float(ta[best]) + width)


def parse_span(text: str, origin: float, end: float) -> Span:
    """``A..B`` in seconds since ``origin`` (the first sample); either side may be left out
    (``..B``: from the first sample, ``A..``: to ``end``)."""
    a, sep, b = text.partition("..")
    if not sep:
        raise ConfigError(f"{text!r}: a span is START..END in seconds since the first sample")
    try:
        t0 = origin + float(a) if a.strip() else origin
        t1 = origin + float(b) if b.strip() else end
    except ValueError:
        raise ConfigError(f"{text!r}: START and END must be numbers of seconds") from None
    if not (math.isfinite(t0) and math.isfinite(t1)) or t1 < t0:
        raise ConfigError(f"{text!r}: the span ends before it starts (or is not finite)")
    return Span(t0, t1)
