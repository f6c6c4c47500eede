"""A benchmark run's result, typed (issue 44): a run of the load (:class:`BenchResult`), an A/B
comparison (:class:`ABResult`, one :class:`ArmResult` per arm), an offline tuning
(:class:`TuneResult`, one :class:`PointFigures` per point) and a live tuning chain
(:class:`LiveTuneResult`, one :class:`LiveTrial` per candidate).

``Bench``, ``ABRun``, ``Tuner`` and ``LiveTuner`` return them, ``load_run`` reads a saved run
back into them, and the CLI, the report and the Benchmark tab read their attributes. They are
flattened only in ``to_json`` and read back by ``from_json``, in the keys and the order a run
file was always written in: a saved run read and written back is the same JSON, byte for byte.
The keys a reader does not read (the percentiles a run was asked for beyond p50/p99, a caller's
own additions) are kept as they were in ``rest``; what is genuinely open (each request's record,
the environment's and the engine's facts, the launch config) stays a mapping.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import PurePath
from typing import Any, ClassVar, Protocol, TypeGuard, TypeVar

from quantdeck.core.events import MarkerEvent

_R = TypeVar("_R", bound="Record")
_META = ("rest", "keys", "path")


def nested(cls: type, *, many: bool = False) -> Any:
    """A field that holds a record of ``cls`` (``many``: a list of them), read back by its
    ``from_json``; absent: None (an empty list for ``many``)."""
    if many:
        return field(default_factory=list, metadata={"of": cls, "many": True})
    return field(default=None, metadata={"of": cls})


@dataclass(kw_only=True)
class Record:
    """A result's named fields (each a JSON key of the same name) and the keys it carries
    unnamed (``rest``), with the order the keys were read in (``keys``): ``to_json`` writes
    them back in that order, a named field only where it was read or has since been given a
    value; ``path``: the file it was read from (not written)."""

    rest: dict[str, Any] = field(default_factory=dict, repr=False)
    keys: tuple[str, ...] = field(default=(), repr=False, compare=False)
    path: str | None = field(default=None, repr=False, compare=False)

    @property
    def name(self) -> str:
        """The run's label, else its file's name (a run written without one)."""
        label = getattr(self, "label", None)
        if label:
            return str(label)
        return PurePath(self.path).stem if self.path else ""

    @classmethod
    def _named(cls) -> dict[str, dataclasses.Field[Any]]:
        return {f.name: f for f in dataclasses.fields(cls) if f.name not in _META}

    def to_json(self) -> dict[str, Any]:
        named: dict[str, Any] = {}
        for name, f in self._named().items():
            value = getattr(self, name)
            if name in self.keys or not _is_default(value, f):
                named[name] = _json(value)
        out: dict[str, Any] = {}
        for key in self.keys:
            if key in named:
                out[key] = named.pop(key)
            elif key in self.rest:
                out[key] = self.rest[key]
        out.update(named)
        out.update({k: v for k, v in self.rest.items() if k not in out})
        return out

    @classmethod
    def from_json(cls: type[_R], data: Mapping[str, Any]) -> _R:
        named = cls._named()
        kw = {k: _read(v, named[k].metadata) for k, v in data.items() if k in named}
        rest = {k: v for k, v in data.items() if k not in named}
        return cls(**kw, rest=rest, keys=tuple(data))


def _is_default(value: Any, f: dataclasses.Field[Any]) -> bool:
    if f.default_factory is not dataclasses.MISSING:
        return bool(value == f.default_factory())
    return bool(value is None or value == f.default)


def _json(value: Any) -> Any:
    if isinstance(value, Record):
        return value.to_json()
    if isinstance(value, list):
        return [_json(v) for v in value]
    return value


def _read(value: Any, metadata: Mapping[str, Any]) -> Any:
    cls = metadata.get("of")
    if cls is None:
        return value
    if metadata.get("many"):
        if not isinstance(value, list):
            return value
        return [cls.from_json(v) if isinstance(v, Mapping) else v for v in value]
    return cls.from_json(value) if isinstance(value, Mapping) else value


# -- a run of the load ---------------------------------------------------------------------


@dataclass(kw_only=True)
class SloMs(Record):
    """The latency targets of a run (ms): a request within every one counts to the goodput."""

    ttft: float | None = None
    tpot: float | None = None
    e2el: float | None = None


@dataclass(kw_only=True)
class BenchResult(Record):
    """One measured run (core/bench/client.py): ``vllm bench serve``'s keys (ms, requests/s,
    tokens/s, counts) and Quantdeck's own: the load, every request's record, the environment.
    Percentiles other than p50 and p99 stay in ``rest`` (``p90_ttft_ms``)."""

    kind: ClassVar[str] = "bench"
    date: str | None = None
    started_at: float | None = None  # wall clock at the first send
    backend: str | None = None
    endpoint_type: str | None = None
    base_url: str | None = None
    model_id: str | None = None
    server_version: str | None = None
    num_prompts: int | None = None
    request_rate: float | str | None = None  # "inf": all at once
    burstiness: float | None = None
    max_concurrency: int | None = None
    input_len: int | None = None
    output_len: int | None = None
    slo_ms: SloMs | None = nested(SloMs)
    ended_early: str | None = None
    client_cpu_s: float | None = None
    duration: float | None = None  # s
    completed: int | None = None
    failed: int | None = None
    resumed_requests: int | None = None
    read_in_one_piece: int | None = None
    total_input_tokens: int | None = None
    total_output_tokens: int | None = None
    request_throughput: float | None = None  # requests/s
    request_goodput: float | None = None  # requests/s within the SLO
    output_throughput: float | None = None  # tokens/s
    total_token_throughput: float | None = None  # tokens/s
    good_completed: int | None = None
    mean_ttft_ms: float | None = None
    median_ttft_ms: float | None = None
    std_ttft_ms: float | None = None
    p99_ttft_ms: float | None = None
    mean_tpot_ms: float | None = None
    median_tpot_ms: float | None = None
    std_tpot_ms: float | None = None
    p99_tpot_ms: float | None = None
    mean_itl_ms: float | None = None
    median_itl_ms: float | None = None
    std_itl_ms: float | None = None
    p99_itl_ms: float | None = None
    mean_e2el_ms: float | None = None
    median_e2el_ms: float | None = None
    std_e2el_ms: float | None = None
    p99_e2el_ms: float | None = None
    load: dict[str, Any] | None = None
    requests: list[dict[str, Any]] = field(default_factory=list)  # every request's record
    env: dict[str, Any] | None = None
    label: str | None = None

    def figure(self, key: str) -> Any:
        """The figure named ``key`` (a named field or one kept in ``rest``); None if none."""
        if key in self._named():
            return getattr(self, key)
        return self.rest.get(key)

    def request_times(self, name: str) -> list[float]:
        """The successful requests' ``name`` (``ttft``, ``latency``: s), each a finite number
        (a record that is not, from a hand-edited file, is left out)."""
        out = []
        for r in self.requests:
            v = r.get(name) if isinstance(r, Mapping) and r.get("success") else None
            if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v):
                out.append(float(v))
        return out


# -- an A/B comparison ---------------------------------------------------------------------


@dataclass(kw_only=True)
class Roofline(Record):
    """The batch-1 decode ceiling of an arm (bytes, bytes/s, tokens/s) and how close its
    measured per-sequence decode rate came to it; empty where the device's bandwidth or the
    weights' size is unknown."""

    weights_bytes: int | None = None
    bandwidth_bytes_per_s: float | None = None
    roofline_tok_s: float | None = None
    decode_tok_s_per_seq: float | None = None
    fraction_of_roofline: float | None = None


@dataclass(kw_only=True)
class ArmResult(Record):
    """One arm of an A/B run: its config, why it has no result (``error``, ``skipped``), its
    server's start (s) and facts, the planner's figures, its run and its roofline."""

    label: str = ""
    config: dict[str, Any] | None = None
    skipped: str | None = None
    error: str | None = None
    ready_s: float | None = None
    warmup: Any = None
    result: BenchResult | None = nested(BenchResult)
    facts: dict[str, Any] | None = None  # the engine's start-up facts
    plan: dict[str, Any] | None = None
    roofline: Roofline | None = nested(Roofline)

    @property
    def kernel(self) -> str:
        """The quantization kernel its server chose, as the engine's facts say ("": none)."""
        return str((self.facts or {}).get("quantization_kernel", ""))


@dataclass(kw_only=True)
class Spread(Record):
    """A figure over an arm's rounds: its median, min and max."""

    median: float | None = None
    min: float | None = None
    max: float | None = None


@dataclass(kw_only=True)
class RoundSummary(Record):
    """An arm over its rounds: how many gave a result and the spread of each summary figure
    (tokens/s, ms; None: no round had it)."""

    rounds: int = 0
    output_throughput: Spread | None = nested(Spread)
    median_ttft_ms: Spread | None = nested(Spread)
    p99_ttft_ms: Spread | None = nested(Spread)
    median_tpot_ms: Spread | None = nested(Spread)


@dataclass(kw_only=True)
class ABResult(Record):
    """An A/B comparison: the arms in the order they ran (``LABEL#N`` per round), and over
    several rounds each arm's figures' median, min and max (``summary``)."""

    kind: str = "ab"
    date: str | None = None
    load: dict[str, Any] | None = None
    slo_ms: SloMs | None = nested(SloMs)
    arms: list[ArmResult] = nested(ArmResult, many=True)
    cancelled: bool | None = None
    rounds: int | None = None
    summary: dict[str, RoundSummary] | None = None  # by the arm's label
    env: dict[str, Any] | None = None
    label: str | None = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ABResult:
        run = super().from_json(data)
        if isinstance(run.summary, Mapping):
            run.summary = {
                k: RoundSummary.from_json(v) if isinstance(v, Mapping) else v
                for k, v in run.summary.items()
            }
        return run

    def to_json(self) -> dict[str, Any]:
        out = super().to_json()
        if isinstance(self.summary, Mapping):
            out["summary"] = {k: _json(v) for k, v in self.summary.items()}
        return out


# -- tuning ----------------------------------------------------------------------------------


@dataclass(kw_only=True)
class PointFigures(Record):
    """A tuning point: its knobs' values, its goodput (requests/s) and whether its p99
    latencies meet the targets, or why it has none (dropped, error); its figures (ms, tokens/s,
    counts)."""

    values: dict[str, Any] = field(default_factory=dict)
    goodput: float | None = None
    meets: bool | None = None
    dropped: str | None = None
    error: str | None = None
    seconds: float | None = None
    p99_ttft_ms: float | None = None
    p99_tpot_ms: float | None = None
    output_throughput: float | None = None
    completed: int | None = None
    failed: int | None = None


@dataclass(kw_only=True)
class TuneResult(Record):
    """An offline tuning: its strategy, targets (ms), load and space, every point measured and
    the best, with the best's launch config."""

    kind: str = "tune"
    strategy: str | None = None
    slo_ms: SloMs | None = nested(SloMs)
    load: dict[str, Any] | None = None
    space: dict[str, list[Any]] | None = None
    base: dict[str, Any] | None = None
    seconds: float | None = None
    cancelled: bool | None = None
    points: list[PointFigures] = nested(PointFigures, many=True)
    best: PointFigures | None = nested(PointFigures)
    best_config: dict[str, Any] | None = None
    env: dict[str, Any] | None = None
    label: str | None = None


@dataclass(kw_only=True)
class LiveTrial(Record):
    """One candidate of a live chain: its knobs' change (``{knob: [from, to]}``), what became of
    it (``result``: promoted, rolled back, refused, failed), the decision and why, the verdict's
    outcome, how long it took (s) and, with a goal, whether its promoted launch met it."""

    step: int = 0
    knobs: dict[str, list[Any]] = field(default_factory=dict)
    result: str = ""
    decision: str | None = None
    reason: str | None = None
    outcome: str | None = None
    seconds: float | None = None
    meets: bool | None = None

    @property
    def ran(self) -> bool:
        return self.result in ("promoted", "rolled back")


@dataclass(kw_only=True)
class LiveTuneResult(Record):
    """A live tuning chain: its space, budgets and goal, why it ended (``failed``: the fleet
    went away), every trial, the space's values at the start and now, what the chain changed
    and the instance's launch as it runs now."""

    kind: str = "live_tune"
    space: dict[str, list[Any]] | None = None
    budget: int | None = None
    budget_s: float | None = None
    until: dict[str, float] | None = None
    goal_met: bool | None = None
    met_by: int | None = None
    seconds: float | None = None
    ended: str = ""
    failed: bool = False
    cancelled: bool | None = None
    trials: list[LiveTrial] = nested(LiveTrial, many=True)
    start: dict[str, Any] | None = None
    best: dict[str, Any] = field(default_factory=dict)
    changed: dict[str, list[Any]] = field(default_factory=dict)
    launch: dict[str, Any] = field(default_factory=dict)
    env: dict[str, Any] | None = None
    label: str | None = None


RunResult = BenchResult | ABResult | TuneResult | LiveTuneResult
KINDS: dict[str, type[RunResult]] = {
    "bench": BenchResult,
    "ab": ABResult,
    "tune": TuneResult,
    "live_tune": LiveTuneResult,
}


class BenchJob(Protocol):
    """What the Benchmark tab runs, whatever its mode: ``Bench`` (Run), ``ABRun`` (A/B),
    ``Tuner`` (Tune) and the live tuning chain (``gui/live_tune.py``'s ``LiveTuneJob``).
    :meth:`run` blocks (in a worker) until the job ends and returns its typed result;
    :meth:`cancel` is thread-safe and makes :meth:`run` return what was measured so far."""

    def run(self) -> RunResult: ...

    def cancel(self) -> None: ...


_RUN_WORDS = {"ab": "A/B", "tune": "tune", "live_tune": "live tune"}
_MARKER_FIGURES = ("completed", "output_throughput", "median_ttft_ms", "p99_ttft_ms")


def bench_marker(result: RunResult, *, t: float | None = None) -> MarkerEvent:
    """The Monitor's marker for a run that ended now with ``result``: at its start (``t``,
    else now less its duration), named by its kind and label (``bench chat: 42.5 tok/s``,
    ``A/B``, ``tune``), a run of the load's figures as its diff."""
    end = time.time()
    if isinstance(result, BenchResult):
        name, duration = "bench", result.duration
    else:
        name = _RUN_WORDS.get(result.kind, result.kind)
        duration = None if isinstance(result, ABResult) else result.seconds
    if t is None:
        t = end - duration if _finite(duration) else end
    text = f"{name} {result.label}" if result.label else name
    figures: dict[str, list[Any]] = {}
    if isinstance(result, BenchResult):
        if _finite(result.output_throughput):
            text += f": {result.output_throughput:.1f} tok/s"
        values = {k: getattr(result, k) for k in _MARKER_FIGURES}
        figures = {k: [None, v] for k, v in values.items() if _finite(v)}
    return MarkerEvent("bench", text, figures, t=t)


def _finite(v: Any) -> TypeGuard[float]:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def run_result(data: Mapping[str, Any]) -> RunResult:
    """A run's JSON read back into its kind's result (no ``kind``: a run of the load)."""
    return KINDS.get(str(data.get("kind") or "bench"), BenchResult).from_json(data)
