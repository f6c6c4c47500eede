"""Monitoring: /metrics scrapes, NVML and host telemetry, bounded histories, recordings."""

from quantdeck.core.monitor.metrics import MetricsScraper
from quantdeck.core.monitor.recording import Recorder, Recording, RecordingError, read_recording
from quantdeck.core.monitor.telemetry import ProcessWatch, Sampler, driver_version
from quantdeck.core.monitor.timeseries import TimeSeriesStore

__all__ = [
    "driver_version",
    "MetricsScraper",
    "ProcessWatch",
    "read_recording",
    "Recorder",
    "Recording",
    "RecordingError",
    "Sampler",
    "TimeSeriesStore",
]
