"""Monitoring under faults and floods: a failing reader never stops the sampler, and every
history stays within its bound however much is pushed into it."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from conftest import metrics_event

from quantdeck.core.errors import ServerError
from quantdeck.core.events import MetricsEvent
from quantdeck.core.monitor import MetricsScraper, Sampler, TimeSeriesStore, telemetry
from quantdeck.core.monitor.metrics import (
    MAX_HISTORY,
    MAX_PAYLOAD_BYTES,
    MetricsDeriver,
    RawMetrics,
)
from quantdeck.core.monitor.timeseries import MAX_GPUS


def _warnings(caplog: pytest.LogCaptureFixture, what: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if f"sampler's {what} reading failed" in r.getMessage()]


def _wait_for(cond, timeout: float = 10.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.01)
    return cond()


def test_a_failing_telemetry_reader_is_reported_once_and_sampling_goes_on(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    real = telemetry.read_telemetry
    failing = threading.Event()
    failing.set()

    def reader(watch=None):
        if failing.is_set():
            raise RuntimeError("NVML_ERROR_GPU_IS_LOST")
        return real(watch)

    monkeypatch.setattr(telemetry, "read_telemetry", reader)
    samples = []
    s = Sampler(hz=50)
    s.subscribe(samples.append)
    s.start()
    try:
        assert _wait_for(lambda: len(samples) >= 5)
        assert all(x.telemetry is None for x in samples[:5])
        assert samples[0].error == "telemetry: NVML_ERROR_GPU_IS_LOST"
        ev = samples[0].to_event()  # the typed event every consumer gets, saying why
        assert isinstance(ev, MetricsEvent) and ev.error == samples[0].error
        assert ev.telemetry is None
        assert len(_warnings(caplog, "telemetry")) == 1  # once, not per tick
        assert _warnings(caplog, "telemetry")[0].exc_info is not None
        failing.clear()  # the driver came back: so does telemetry, on the same thread
        n = len(samples)
        assert _wait_for(lambda: len(samples) > n + 2 and samples[-1].telemetry is not None)
        assert samples[-1].error is None
        failing.set()  # a new failure is a new report
        n = len(samples)
        assert _wait_for(lambda: len(samples) > n + 2 and samples[-1].telemetry is None)
        assert len(_warnings(caplog, "telemetry")) == 2
        assert s._thread is not None and s._thread.is_alive()
    finally:
        s.stop()


def test_a_scraper_that_raises_anything_leaves_the_sampler_running(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Broken:
        def scrape(self):
            raise TypeError("unexpected payload shape")

    samples = []
    s = Sampler(hz=50, scraper=Broken())
    s.subscribe(samples.append)
    s.start()
    try:
        assert _wait_for(lambda: len(samples) >= 5)
    finally:
        s.stop()
    assert all(x.error == "unexpected payload shape" and x.metrics is None for x in samples)
    assert all(x.telemetry is not None for x in samples)  # the host figures still come
    assert len(_warnings(caplog, "metrics")) == 1


def test_a_server_that_stopped_answering_is_one_line_not_a_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Before: each failed scrape of a stopped server printed a full traceback."""
    from quantdeck.core.monitor import MetricsScraper
    from quantdeck.core.runtime import free_port

    samples = []
    s = Sampler(hz=50, scraper=MetricsScraper(f"http://127.0.0.1:{free_port()}"))
    s.subscribe(samples.append)
    s.start()
    try:
        assert _wait_for(lambda: len(samples) >= 5)
    finally:
        s.stop()
    assert all(x.metrics is None and x.error for x in samples)
    (warning,) = _warnings(caplog, "metrics")
    assert not warning.exc_info and "/metrics: ConnectError" in warning.getMessage()


class _Metrics(BaseHTTPRequestHandler):
    """Serves ``body`` as /metrics (a fault injector, not an imitation of vLLM)."""

    body = b""

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        try:
            self.wfile.write(self.body)
        except OSError:  # the scraper stopped reading: as it should
            pass


@pytest.fixture
def metrics_server() -> Iterator[tuple[str, type[_Metrics]]]:
    handler = type("Handler", (_Metrics,), {})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    t = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", handler
    finally:
        server.shutdown()
        server.server_close()


def test_an_endless_metrics_payload_is_refused(metrics_server) -> None:
    url, handler = metrics_server
    handler.body = b"# a comment line that goes on\n" * (MAX_PAYLOAD_BYTES // 30 + 2**16)
    scraper = MetricsScraper(url)
    try:
        with pytest.raises(ServerError, match="payload over 16 MiB"):
            scraper.scrape()
    finally:
        scraper.close()


@pytest.mark.parametrize(
    "payload",
    [
        b'vllm:num_requests_running{a="1} 1\n',  # a label left open
        b'vllm:cache_config_info{num_gpu_blocks="many"} 1\n',  # a label that is no number
        # a bucket without its bound
        b"# TYPE vllm:e2e_request_latency_seconds histogram\n"
        b'vllm:e2e_request_latency_seconds_bucket{x="1"} 3\n',
        b"vllm:num_requests_waiting \xff\xfe\n",  # a value that is no number
    ],
)
def test_a_bad_metrics_payload_is_one_server_error(metrics_server, payload: bytes) -> None:
    url, handler = metrics_server
    handler.body = payload
    scraper = MetricsScraper(url)
    try:
        with pytest.raises(ServerError, match="not a Prometheus exposition"):
            scraper.scrape()
    finally:
        scraper.close()


def test_nan_and_infinite_readings_count_as_not_reported(metrics_server) -> None:
    url, handler = metrics_server
    handler.body = (
        b"vllm:num_requests_running NaN\nvllm:num_requests_waiting +Inf\n"
        b"vllm:kv_cache_usage_perc NaN\nvllm:num_preemptions_total 2\n"
    )
    scraper = MetricsScraper(url)
    try:
        snap = scraper.scrape()
    finally:
        scraper.close()
    assert snap.running == 0 and snap.waiting == 0 and snap.kv_usage_pct is None
    assert snap.preemptions_total == 2


def _raw(t: float) -> RawMetrics:
    return RawMetrics(t, {}, {"prompt_tokens": 1.0}, {}, {}, None, None)


def test_deriver_history_is_capped_when_the_clock_steps_back() -> None:
    d = MetricsDeriver(window_s=60.0)
    for i in range(3 * MAX_HISTORY):
        d.push(_raw(1e9 - i * 0.001))  # each scrape older than the last: none leaves the window
    assert len(d._history) == MAX_HISTORY


def test_store_keeps_its_capacity_and_its_gpu_bound() -> None:
    store = TimeSeriesStore(capacity=64)
    columns = {k: v.nbytes for k, v in store._cols.items()}
    for i in range(10 * 64):
        store.append(metrics_event(float(i), host_cpu_pct=float(i)))
    assert len(store) == 64 and {k: v.nbytes for k, v in store._cols.items()} == columns
    assert store.latest("host_cpu_pct") == 639.0
    t, cols = store.window()
    assert len(t) == 64 and cols["host_cpu_pct"][0] == 576.0
    gpus = [{"utilization_pct": 50.0}] * 100_000  # a recording that lists 100k GPUs
    store.append(metrics_event(1000.0, gpus=gpus))
    assert store.num_gpus == MAX_GPUS
    assert store.latest(f"gpu{MAX_GPUS - 1}_util_pct") == 50.0


@pytest.mark.parametrize(
    "values",
    [
        {"host_cpu_pct": "x"},
        {"host_cpu_pct": float("inf")},
        {"host_cpu_pct": True},
        {"gpus": ["not a gpu"]},
        {"gpus": "x"},
        {"gpus": [{"utilization_pct": [1]}]},
    ],
)
def test_store_reads_a_bad_value_as_a_gap(values) -> None:
    store = TimeSeriesStore(capacity=16)
    store.append(metrics_event(1.0, **values))
    assert len(store) == 1
    assert store.latest("host_cpu_pct") in (None, 10.0)
    store.append(metrics_event("soon"))  # no time: not a point
    assert len(store) == 1
