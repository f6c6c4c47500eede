"""Monitoring: /metrics scrapes, NVML and host telemetry, bounded histories, recordings, the
tuning timeline, profiler captures, and vLLM's KV-cache events (imported on first use: pyzmq
and msgspec load only where needed)."""

from typing import TYPE_CHECKING, Any

from quantdeck.core.monitor.metrics import MetricsScraper, MetricsSnapshot
from quantdeck.core.monitor.recording import (
    Recorder,
    Recording,
    RecordingCapped,
    RecordingError,
    read_recording,
)
from quantdeck.core.monitor.telemetry import (
    GpuSnapshot,
    ProcessWatch,
    Sampler,
    TelemetrySnapshot,
    driver_version,
)
from quantdeck.core.monitor.timeline import (
    Span,
    SpanComparison,
    Timeline,
    compare_spans,
    default_spans,
    histories,
    store_of,
    timeline_of,
)
from quantdeck.core.monitor.timeseries import TimeSeriesStore
from quantdeck.core.monitor.trace_capture import TraceCapture, capture_trace, profile_server

if TYPE_CHECKING:
    from quantdeck.core.monitor.kv_events import (
        AGE_EDGES_S,
        REUSE_EDGES,
        BlockIndex,
        KvEventSubscriber,
        KvFeed,
        read_capture,
    )

_KV_EVENTS = (
    "AGE_EDGES_S",
    "REUSE_EDGES",
    "BlockIndex",
    "KvEventSubscriber",
    "KvFeed",
    "read_capture",
)

__all__ = [
    "AGE_EDGES_S",
    "BlockIndex",
    "capture_trace",
    "compare_spans",
    "default_spans",
    "driver_version",
    "GpuSnapshot",
    "histories",
    "KvEventSubscriber",
    "KvFeed",
    "MetricsScraper",
    "MetricsSnapshot",
    "ProcessWatch",
    "profile_server",
    "read_capture",
    "read_recording",
    "Recorder",
    "Recording",
    "RecordingCapped",
    "RecordingError",
    "REUSE_EDGES",
    "Sampler",
    "Span",
    "SpanComparison",
    "store_of",
    "TelemetrySnapshot",
    "Timeline",
    "timeline_of",
    "TimeSeriesStore",
    "TraceCapture",
]


def __getattr__(name: str) -> Any:
    if name in _KV_EVENTS:
        from quantdeck.core.monitor import kv_events

        return getattr(kv_events, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
