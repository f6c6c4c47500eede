"""GPU and host telemetry: one NVML wrapper that never raises, immutable snapshots.

Every NVML call goes through :func:`nvml_call`, which returns :data:`NA` on any failure; NVML
is initialised lazily, once. No NVIDIA driver is a normal state: ``gpus`` is then empty and
the host figures (psutil) remain. Units are in the field names.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Set
from dataclasses import dataclass
from typing import Any

import psutil

from quantdeck.core.errors import QuantdeckError
from quantdeck.core.events import MetricsEvent, Publisher
from quantdeck.core.snapshots import NA, GpuSnapshot, MetricsSnapshot, TelemetrySnapshot

log = logging.getLogger("quantdeck.monitor")


_lock = threading.Lock()
_state: dict[str, Any] = {"tried": False, "ok": False, "module": None}


def _nvml() -> Any | None:
    with _lock:
        if not _state["tried"]:
            _state["tried"] = True
            try:
                import pynvml

                pynvml.nvmlInit()
                _state.update(ok=True, module=pynvml)
            except Exception:
                _state.update(ok=False)
        return _state["module"] if _state["ok"] else None


def nvml_call(fn_name: str, *args: Any) -> Any:
    """Call ``pynvml.<fn_name>(*args)``; NA when NVML or the call fails."""
    nv = _nvml()
    if nv is None:
        return NA
    try:
        return getattr(nv, fn_name)(*args)
    except Exception:
        return NA


def nvml_available() -> bool:
    return _nvml() is not None


def driver_version() -> str | None:
    """The NVIDIA driver's version, None without one."""
    v = nvml_call("nvmlSystemGetDriverVersion")
    if v is NA:
        return None
    return v.decode() if isinstance(v, bytes) else str(v)


def gpu_count() -> int:
    n = nvml_call("nvmlDeviceGetCount")
    return 0 if n is NA else int(n)


def read_gpu(index: int, server_pids: Set[int] = frozenset()) -> GpuSnapshot:
    """All readings of one GPU at once; each failed reading is NA."""
    h = nvml_call("nvmlDeviceGetHandleByIndex", index)
    if h is NA:
        return GpuSnapshot(index, NA, NA, NA, NA, NA, NA, NA, NA)
    name = nvml_call("nvmlDeviceGetName", h)
    if isinstance(name, bytes):
        name = name.decode()
    util = nvml_call("nvmlDeviceGetUtilizationRates", h)
    mem = nvml_call("nvmlDeviceGetMemoryInfo", h)
    power = nvml_call("nvmlDeviceGetPowerUsage", h)  # mW
    nv = _nvml()
    temp = nvml_call("nvmlDeviceGetTemperature", h, getattr(nv, "NVML_TEMPERATURE_GPU", 0))
    clock = nvml_call("nvmlDeviceGetClockInfo", h, getattr(nv, "NVML_CLOCK_SM", 1))
    server_mem: Any = NA
    if server_pids:
        procs = nvml_call("nvmlDeviceGetComputeRunningProcesses", h)
        if procs is not NA:
            server_mem = sum(int(p.usedGpuMemory or 0) for p in procs if p.pid in server_pids)
    return GpuSnapshot(
        index=index,
        name=name,
        utilization_pct=NA if util is NA else float(util.gpu),
        memory_used_bytes=NA if mem is NA else int(mem.used),
        memory_total_bytes=NA if mem is NA else int(mem.total),
        power_w=NA if power is NA else power / 1000.0,
        temperature_c=NA if temp is NA else float(temp),
        sm_clock_mhz=NA if clock is NA else float(clock),
        server_memory_bytes=server_mem,
    )


class ProcessWatch:
    """The server's process tree: RSS and CPU % summed (psutil keeps CPU-time state).

    Finding the tree walks every process on the host (``children(recursive=True)`` reads the
    parent of each), so it is refreshed at most every ``tree_s`` seconds: a vLLM server's
    processes all appear during start-up; one that exits is dropped at its next read."""

    def __init__(self, root_pid: int | None = None, tree_s: float = 2.0) -> None:
        self.root_pid = root_pid
        self.tree_s = tree_s
        self._procs: dict[int, psutil.Process] = {}
        self._tree_t = -math.inf

    def pids(self) -> set[int]:
        if self.root_pid is None:
            return set()
        now = time.monotonic()
        if now - self._tree_t >= self.tree_s:
            self._tree_t = now
            try:
                root = psutil.Process(self.root_pid)
                tree = [root, *root.children(recursive=True)]
            except psutil.Error:
                tree = []
            for p in tree:
                if p.pid not in self._procs:
                    self._procs[p.pid] = p
                    try:
                        p.cpu_percent(None)  # prime
                    except psutil.Error:
                        pass
            live = {p.pid for p in tree}
            for pid in list(self._procs):
                if pid not in live:
                    del self._procs[pid]
        return set(self._procs)

    def usage(self) -> tuple[int | None, float | None]:
        if self.root_pid is None:
            return None, None
        self.pids()
        rss, cpu = 0, 0.0
        for pid, p in list(self._procs.items()):
            try:
                with p.oneshot():
                    rss += p.memory_info().rss
                    cpu += p.cpu_percent(None)
            except psutil.Error:  # gone since the tree was read
                self._procs.pop(pid, None)
        return rss, cpu


def read_telemetry(watch: ProcessWatch | None = None) -> TelemetrySnapshot:
    pids = watch.pids() if watch else set()
    gpus = tuple(read_gpu(i, pids) for i in range(gpu_count()))
    vm = psutil.virtual_memory()
    rss, cpu = watch.usage() if watch else (None, None)
    return TelemetrySnapshot(
        t=time.time(),
        gpus=gpus,
        host_cpu_pct=psutil.cpu_percent(None),
        host_ram_used_bytes=int(vm.total - vm.available),
        host_ram_total_bytes=int(vm.total),
        server_rss_bytes=rss,
        server_cpu_pct=cpu,
    )


@dataclass
class Sample:
    """What the sampler produced at one tick: telemetry, and metrics when a server is watched;
    what could not be read is None, and ``error`` says why."""

    t: float
    telemetry: TelemetrySnapshot | None
    metrics: MetricsSnapshot | None = None
    error: str | None = None  # why telemetry or metrics are missing this tick

    def to_event(self) -> MetricsEvent:
        """The ``metrics`` event of ``quantdeck serve/monitor --json-events`` (flat in JSON)."""
        return MetricsEvent(
            self.t, metrics=self.metrics, telemetry=self.telemetry, error=self.error or None
        )


class Sampler:
    """One background thread: every 1/hz seconds read telemetry (and scrape metrics) into a
    :class:`Sample` and hand it to the observers. Only the latest sample is kept: histories live
    in bounded :class:`~quantdeck.core.monitor.timeseries.TimeSeriesStore` buffers."""

    def __init__(
        self,
        *,
        hz: float = 2.0,
        scraper: Any = None,
        watch: ProcessWatch | None = None,
    ) -> None:
        if hz <= 0:
            raise ValueError("hz must be positive")
        self.hz = hz
        self.scraper = scraper
        self.watch = watch
        self._samples: Publisher[Sample] = Publisher("sampler")
        self.latest: Sample | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failing: set[str] = set()  # the readers failing now (logged when they began)

    def subscribe(self, fn: Callable[[Sample], None]) -> Callable[[], None]:
        """Call ``fn`` with every sample (in the sampler's thread); returns the unsubscriber."""
        return self._samples.subscribe(fn)

    def tick(self) -> Sample:
        """One sample. A reader that fails (NVML, psutil, the scrape) leaves its part None and
        says why in ``error``, every tick it fails; it is logged once, with its traceback,
        when it starts failing, and sampling goes on."""
        t = time.time()
        tel, tel_err = self._read("telemetry", read_telemetry, self.watch)
        metrics, err = None, None
        if self.scraper is not None:
            metrics, err = self._read("metrics", self.scraper.scrape)
        errors = [e for e in (tel_err, err) if e]
        s = Sample(
            t=tel.t if tel else t,
            telemetry=tel,
            metrics=metrics,
            error="; ".join(errors) or None,
        )
        self.latest = s
        self._samples.emit(s)
        return s

    def _read(self, what: str, read: Callable[..., Any], *args: Any) -> tuple[Any, str | None]:
        """``read(*args)``, or None and why: a lost connection or a failing driver is a state
        to show, not the end of the sampler."""
        try:
            value = read(*args)
        except Exception as e:
            if what not in self._failing:
                self._failing.add(what)
                # an expected failure (the server stopped answering: the project's own error,
                # one line) is said in one line; anything else with its traceback
                expected = isinstance(e, QuantdeckError)
                log.warning(
                    "the sampler's %s reading failed; sampling goes on%s",
                    what,
                    f": {e}" if expected else "",
                    exc_info=not expected,
                )
            why = str(e) or type(e).__name__
            return None, why if what == "metrics" else f"{what}: {why}"
        self._failing.discard(what)
        return value, None

    def _run(self) -> None:
        period = 1.0 / self.hz
        next_t = time.monotonic()
        while not self._stop.is_set():
            self.tick()
            next_t += period
            delay = next_t - time.monotonic()
            if delay < 0:  # fell behind: skip ticks rather than burst
                next_t = time.monotonic()
                delay = 0
            self._stop.wait(delay)

    def start(self) -> None:
        if self._thread and self._thread.is_alive():
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="quantdeck-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
