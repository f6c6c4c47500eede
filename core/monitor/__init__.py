"""Monitoring: /metrics scrapes, NVML and host telemetry, bounded histories, recordings, and
vLLM's KV-cache events (imported on first use: pyzmq and msgspec load only where needed)."""

from typing import TYPE_CHECKING, Any

from quantdeck.core.monitor.metrics import MetricsScraper
from quantdeck.core.monitor.recording import Recorder, Recording, RecordingError, read_recording
from quantdeck.core.monitor.telemetry import ProcessWatch, Sampler, driver_version
from quantdeck.core.monitor.timeseries import TimeSeriesStore

if TYPE_CHECKING:
    from quantdeck.core.monitor.kv_events import (
        BlockIndex,
        KvEventSubscriber,
        read_capture,
    )

_KV_EVENTS = ("BlockIndex", "KvEventSubscriber", "read_capture")

__all__ = [
    "BlockIndex",
    "driver_version",
    "KvEventSubscriber",
    "MetricsScraper",
    "ProcessWatch",
    "read_capture",
    "read_recording",
    "Recorder",
    "Recording",
    "RecordingError",
    "Sampler",
    "TimeSeriesStore",
]


def __getattr__(name: str) -> Any:
    if name in _KV_EVENTS:
        from quantdeck.core.monitor import kv_events

        return getattr(kv_events, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
