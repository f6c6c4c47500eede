"""The monitor's immutable snapshots: one scrape of vLLM's ``/metrics`` (:class:`MetricsSnapshot`)
and one reading of the GPUs and the host (:class:`TelemetrySnapshot`, :class:`GpuSnapshot`).

They live below :mod:`quantdeck.core.events` so that a ``metrics`` event can carry them typed;
``quantdeck.core.monitor.metrics`` and ``.telemetry`` make them and re-export them. Units are in
the field names. Standard library only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any


class _NA:
    """Not available: the reading failed or the device does not report it."""

    _inst: _NA | None = None

    def __new__(cls) -> _NA:
        if cls._inst is None:
            cls._inst = super().__new__(cls)
        return cls._inst

    def __repr__(self) -> str:
        return "NA"

    def __bool__(self) -> bool:
        return False


NA: Any = _NA()


def _na_to_none(v: Any) -> Any:
    return None if v is NA else v


def field_names(cls: type) -> tuple[str, ...]:
    """A snapshot class's field names, in order (the order its ``to_json`` writes)."""
    return tuple(f.name for f in dataclasses.fields(cls))


def _lenient(cls: Any, data: Mapping[str, Any]) -> Any:
    """``cls`` from ``data``'s keys that name its fields; a field ``data`` lacks takes its
    default, else None (a figure a recording of an older version did not have). Values are
    taken as written: a recording's schema check is the only check they had."""
    kw: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.name in data:
            kw[f.name] = data[f.name]
        elif f.default is not dataclasses.MISSING:
            kw[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            kw[f.name] = f.default_factory()
        else:
            kw[f.name] = None
    return cls(**kw)


@dataclass(frozen=True)
class GpuSnapshot:
    """All readings of one GPU at one moment; a failed reading is :data:`NA` (``None`` in
    JSON and once read back)."""

    index: int
    name: Any
    utilization_pct: Any
    memory_used_bytes: Any
    memory_total_bytes: Any
    power_w: Any
    temperature_c: Any
    sm_clock_mhz: Any
    server_memory_bytes: Any  # GPU memory held by the watched server's processes

    def to_json(self) -> dict[str, Any]:
        return {k: _na_to_none(v) for k, v in asdict(self).items()}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> GpuSnapshot:
        """From :meth:`to_json`'s object; a key it lacks reads None."""
        return _lenient(cls, data)


@dataclass(frozen=True)
class TelemetrySnapshot:
    """The GPUs and the host at one moment, and the watched server's processes (None: no
    server watched)."""

    t: float
    gpus: tuple[GpuSnapshot, ...]
    host_cpu_pct: float
    host_ram_used_bytes: int
    host_ram_total_bytes: int
    server_rss_bytes: int | None  # resident memory of the watched server's processes
    server_cpu_pct: float | None

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["gpus"] = [g.to_json() for g in self.gpus]
        return d

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TelemetrySnapshot:
        """From :meth:`to_json`'s object (``gpus``: a list of objects); a key it lacks reads
        None (``gpus``: none)."""
        gpus = tuple(GpuSnapshot.from_json(g) for g in data.get("gpus") or ())
        return _lenient(cls, {**data, "gpus": gpus})


@dataclass(frozen=True)
class MetricsSnapshot:
    """One scrape, derived. ``None`` means not known (no data in the window, first scrape)."""

    t: float  # unix seconds
    kv_usage_pct: float | None
    kv_blocks_used: int | None
    kv_blocks_total: int | None
    running: int
    waiting: int
    preemptions_total: float
    prompt_tokens_total: float
    generation_tokens_total: float
    requests_finished_total: float
    preemptions_per_s: float | None
    prompt_tokens_per_s: float | None
    generation_tokens_per_s: float | None
    prefix_cache_hit_rate: float | None  # 0..1 over the window
    ttft_p50_ms: float | None = None
    ttft_p90_ms: float | None = None
    ttft_p99_ms: float | None = None
    itl_p50_ms: float | None = None
    itl_p90_ms: float | None = None
    itl_p99_ms: float | None = None
    e2e_p50_ms: float | None = None
    e2e_p90_ms: float | None = None
    e2e_p99_ms: float | None = None
    queue_p50_ms: float | None = None
    queue_p90_ms: float | None = None
    queue_p99_ms: float | None = None
    prefill_p50_ms: float | None = None
    prefill_p90_ms: float | None = None
    prefill_p99_ms: float | None = None
    decode_p50_ms: float | None = None
    decode_p90_ms: float | None = None
    decode_p99_ms: float | None = None
    kv_block_lifetime_p50_ms: float | None = None
    kv_block_lifetime_p90_ms: float | None = None
    kv_block_lifetime_p99_ms: float | None = None
    kv_block_idle_p50_ms: float | None = None
    kv_block_idle_p90_ms: float | None = None
    kv_block_idle_p99_ms: float | None = None
    kv_block_reuse_gap_p50_ms: float | None = None
    kv_block_reuse_gap_p90_ms: float | None = None
    kv_block_reuse_gap_p99_ms: float | None = None
    finished_by_reason: dict[str, float] = field(default_factory=dict)
    # requests finished per second by reason (stop, length, abort, error), between scrapes
    finished_stop_per_s: float | None = None
    finished_length_per_s: float | None = None
    finished_abort_per_s: float | None = None
    finished_error_per_s: float | None = None
    # the window's fraction of requests within each SLO the deriver was given (0..1)
    ttft_slo_attainment: float | None = None
    itl_slo_attainment: float | None = None
    e2e_slo_attainment: float | None = None
    # speculative decoding: accepted / draft tokens over the window
    spec_acceptance_rate: float | None = None
    # LoRA adapters running and waiting (None: the server serves no LoRA)
    lora_running: int | None = None
    lora_waiting: int | None = None
    lora_adapters: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> MetricsSnapshot:
        """From :meth:`to_json`'s object; a key it lacks takes the field's default, else
        None (a recording of an older version)."""
        return _lenient(cls, data)
