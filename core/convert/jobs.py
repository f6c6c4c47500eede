"""Conversion jobs: a supervised subprocess per job, a queue, cancel at any stage.

The work itself happens in ``python -m quantdeck.core.workers.quantize`` (the only place that
imports torch for it). This side checks the request first, creating nothing (source readable,
method known, target free or empty and neither inside nor around the source, disk space), runs
the entry point in its own process group writing into a temporary folder next to the target
(:func:`quantdeck.core.paths.atomic_dir`), streams its JSON progress events, verifies the result
(the inspector recognises the format vLLM expects, the weights shrank) and only then renames it
into place. A cancelled, failed or killed job leaves nothing that looks like a model; the source
is never written."""

from __future__ import annotations

import collections
import dataclasses
import itertools
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from quantdeck.core.engines import default_engine
from quantdeck.core.errors import ConfigError, ModelError, QuantdeckError
from quantdeck.core.events import DoneEvent, Event, LogEvent, ProgressEvent, Publisher, StateEvent
from quantdeck.core.models import CONVERSION_METHODS, ConversionMethod, ModelInfo, inspect_model
from quantdeck.core.paths import atomic_dir, check_output_dir, refuse_overlap
from quantdeck.core.procs import run_child, spawn, subprocess_env, worker_command, worker_events

log = logging.getLogger(__name__)

OUTPUT_KIND = "conversion"  # the kind in a converted folder's Quantdeck marker


@dataclass(frozen=True)
class QuantSpec:
    src: str
    method: str
    out: str
    calib: str | None = None
    samples: int = 64
    seq_len: int = 256

    def check(self) -> tuple[ModelInfo, ConversionMethod]:
        """Refuse a request before any process starts; one-line errors."""
        if self.method not in CONVERSION_METHODS:
            raise ConfigError(
                f"--method: '{self.method}' is not one of {', '.join(CONVERSION_METHODS)}"
            )
        info = inspect_model(self.src)
        if info.quantization is not None:
            raise ModelError(
                f"{self.src}: already {info.quantization.method}-quantized; "
                "convert from the unquantized model"
            )
        out = Path(self.out).expanduser().absolute()
        refuse_overlap(out, info.path)
        check_output_dir(out, OUTPUT_KIND)
        if self.samples < 1 or self.seq_len < 16:
            raise ConfigError("--samples must be >= 1 and --seq-len >= 16")
        if self.calib is not None and not Path(self.calib).is_file():
            raise ConfigError(f"{self.calib}: no such calibration file")
        # The nearest folder that exists: the check creates nothing (run_job makes the rest).
        parent = next(p for p in out.parents if p.is_dir())
        method = CONVERSION_METHODS[self.method]
        need = int(info.weights_bytes * (1 + method.scratch)) + 64 * 2**20
        free = shutil.disk_usage(parent).free
        if free < need:
            raise ConfigError(
                f"{parent}: {free / 2**30:.2f} GiB free, the conversion needs "
                f"about {need / 2**30:.2f} GiB"
            )
        return info, method


class JobCancelled(QuantdeckError):
    """The job was cancelled; nothing was left behind."""


def verify(out: Path, spec: QuantSpec, src: ModelInfo) -> ModelInfo:
    """The converted folder is what vLLM expects for the method, and it shrank."""
    m = CONVERSION_METHODS[spec.method]
    info = inspect_model(out)
    q = info.quantization
    if q is None or q.method != m.quant_method:
        raise ModelError(
            f"{out}: quantization_config is {q.method if q else 'missing'}, "
            f"expected {m.quant_method}"
        )
    if q.scheme != m.scheme:
        raise ModelError(f"{out}: scheme {q.scheme}, expected {m.scheme}")
    other = src.weights_bytes - src.linear_weight_bytes
    lin_after = info.weights_bytes - other
    if src.linear_weight_bytes and lin_after > m.max_ratio * src.linear_weight_bytes:
        raise ModelError(
            f"{out}: weights did not shrink as {spec.method} should "
            f"({info.weights_bytes} bytes vs {src.weights_bytes})"
        )
    return info


@dataclass(frozen=True)
class Conversion:
    """What a finished conversion made: the folder, its quantization (method and scheme), its
    weights against the source's (bytes), how long it took and the worker's peak RSS. Its
    ``to_json`` is the ``done`` event's fields, as they always were."""

    out: str
    quant_method: str
    scheme: str
    bytes: int
    source_bytes: int
    seconds: float
    peak_rss_bytes: int | None = None

    @property
    def ratio(self) -> float:
        """The weights' size against the source's (0 where the source's is not known)."""
        return self.bytes / self.source_bytes if self.source_bytes else 0.0

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def run_job(
    spec: QuantSpec,
    on_event: Callable[[Event], None] | None = None,
    *,
    cancel: threading.Event | None = None,
    python: str | None = None,
) -> Conversion:
    """Convert, blocking; returns what it made (the ``done`` event's figures). Raises
    JobCancelled / QuantdeckError."""
    emit = on_event or (lambda ev: None)
    src_info, _method = spec.check()
    out = Path(spec.out).expanduser().absolute()
    t0 = time.time()
    emit(ProgressEvent("start", 0.0, t=t0))
    err_tail: collections.deque[str] = collections.deque(maxlen=20)
    with atomic_dir(out, OUTPUT_KIND) as tmp:
        cmd = _worker_command(spec, src_info, tmp, python)
        proc = spawn(  # its own group, dies with us, leased
            cmd,
            kind="conversion",
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            bufsize=1,
            env=subprocess_env({"PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1"}),
        )
        stdout, stderr = proc.stdout, proc.stderr
        assert stdout is not None and stderr is not None  # both opened as PIPE above

        def read_stderr() -> None:
            for ln in stderr:
                err_tail.append(ln.rstrip())

        stderr_reader = threading.Thread(target=read_stderr, daemon=True)
        stderr_reader.start()
        watcher = threading.Thread(target=_watch_cancel, args=(proc, cancel), daemon=True)
        watcher.start()
        done: DoneEvent | None = None
        for ev in worker_events(stdout):
            if isinstance(ev, DoneEvent):
                done = ev
            elif not isinstance(ev, LogEvent):  # stray stdout lines are not progress
                emit(ev)
        rc = proc.wait()
        stderr_reader.join(timeout=5)
        if cancel is not None and cancel.is_set():
            raise JobCancelled(f"{spec.method} conversion of {src_info.path} cancelled")
        if rc != 0 or done is None:
            last = next((ln for ln in reversed(err_tail) if ln.strip()), f"exit code {rc}")
            raise QuantdeckError(
                f"{spec.method} conversion into {out} failed: {last}{_lacks(last, cmd[0])}"
            )
        emit(ProgressEvent("verify", 100.0))
        info = verify(tmp, spec, src_info)
        assert info.quantization is not None  # verify() raises on a folder without one
    rss = done.result.get("peak_rss_bytes")  # the worker's own line: read where it is made
    result = Conversion(
        out=str(out),
        quant_method=info.quantization.method,
        scheme=info.quantization.scheme or "",
        bytes=info.weights_bytes,
        source_bytes=src_info.weights_bytes,
        seconds=round(time.time() - t0, 2),
        peak_rss_bytes=rss if isinstance(rss, int) else None,
    )
    emit(DoneEvent(result.to_json(), t=time.time()))
    return result


_NO_MODULE = re.compile(r"No module named '([\w.]+)'")


def _lacks(last: str, python: str) -> str:
    """For a worker that died on an import: which engine lacks what, and what to do."""
    m = _NO_MODULE.search(last)
    if m is None:
        return ""
    top = m.group(1).split(".")[0]
    return (
        f" (the engine {python} has no {top}: install it there, or choose an engine "
        "that has it: quantdeck engines lists them)"
    )


def _worker_command(spec: QuantSpec, src: ModelInfo, out: Path, python: str | None) -> list[str]:
    """The conversion worker's command line, writing into ``out``."""
    cmd = worker_command("quantize", "--src", src.path, python=python or default_engine()) + [
        "--out",
        str(out),
        "--method",
        spec.method,
        "--samples",
        str(spec.samples),
        "--seq-len",
        str(spec.seq_len),
    ]
    return cmd + ["--calib", spec.calib] if spec.calib else cmd


def _watch_cancel(proc: subprocess.Popen[str], cancel: threading.Event | None) -> None:
    """Hard cancel: SIGKILL to the job's whole process group as soon as asked."""
    if cancel is None:
        return
    while proc.poll() is None:
        if cancel.wait(0.1):
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            return


@dataclass
class Job:
    id: int
    spec: QuantSpec
    state: str = "queued"  # then running, and done, failed or cancelled
    stage: str = ""
    pct: float = 0.0
    result: Conversion | None = None
    error: str | None = None
    events: list[Event] = field(default_factory=list)
    cancel: threading.Event = field(default_factory=threading.Event)
    python: str | None = None  # the engine that runs it (None: the default engine)


class JobQueue:
    """Jobs run one at a time in a worker thread; observers get every event with its job id."""

    def __init__(self) -> None:
        self.jobs: dict[int, Job] = {}
        self._ids = itertools.count(1)
        self._pending: collections.deque[Job] = collections.deque()
        self._cv = threading.Condition()
        self._events: Publisher[tuple[Job, Event]] = Publisher("conversion jobs")
        self._thread: threading.Thread | None = None
        self._closing = False

    def subscribe(self, fn: Callable[[Job, Event], None]) -> Callable[[], None]:
        """Call ``fn(job, event)`` for every event of every job (in the queue's thread)."""
        return self._events.subscribe(lambda pair: fn(*pair))

    def _emit(self, job: Job, ev: Event) -> None:
        job.events.append(ev)
        if isinstance(ev, ProgressEvent):
            job.stage, job.pct = ev.stage, float(ev.pct)
        self._events.emit((job, ev))

    def submit(self, spec: QuantSpec, python: str | None = None) -> Job:
        """Queue a conversion of ``spec``, run by the engine ``python`` (default: the default
        engine, found in the queue's thread)."""
        spec.check()  # refuse at once, not when its turn comes
        job = Job(next(self._ids), spec, python=python)
        with self._cv:
            self.jobs[job.id] = job
            self._pending.append(job)
            self._cv.notify()
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="quantdeck-jobs", daemon=True
                )
                self._thread.start()
        self._emit(job, StateEvent("queued"))
        return job

    def cancel(self, job_id: int) -> None:
        job = self.jobs[job_id]
        job.cancel.set()
        with self._cv:
            if job in self._pending:
                self._pending.remove(job)
                job.state = "cancelled"
                self._emit(job, StateEvent("cancelled"))

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._pending and not self._closing:
                    if not self._cv.wait(timeout=5) and not self._pending:
                        return
                if self._closing:
                    return
                job = self._pending.popleft()
            job.state = "running"
            self._emit(job, StateEvent("running"))
            try:
                job.result = run_job(
                    job.spec, partial(self._emit, job), cancel=job.cancel, python=job.python
                )
                job.state = "done"
            except JobCancelled:
                job.state = "cancelled"
            except QuantdeckError as e:
                job.state, job.error = "failed", str(e)
            except Exception as e:  # a bug or the system (OSError...): failed, never "running"
                log.exception("conversion job %d failed", job.id)
                job.state, job.error = "failed", f"{type(e).__name__}: {e}"
            self._emit(job, StateEvent(job.state, error=job.error))

    def wait(self, job_id: int, timeout: float | None = None) -> Job:
        deadline = None if timeout is None else time.time() + timeout
        job = self.jobs[job_id]
        while job.state in ("queued", "running"):
            if deadline is not None and time.time() > deadline:
                break
            time.sleep(0.05)
        return job

    def close(self) -> None:
        with self._cv:
            self._closing = True
            for j in self._pending:
                j.cancel.set()
            self._cv.notify_all()
        for j in self.jobs.values():
            if j.state == "running":
                j.cancel.set()
        if self._thread is not None:
            self._thread.join(timeout=30)


def compare_quality(
    orig: str,
    quant: str,
    *,
    text: str | None = None,
    max_tokens: int = 2048,
    python: str | None = None,
) -> dict[str, Any]:
    """KL divergence, top-1 agreement and perplexities of a converted model against its source
    on held-out text, in a subprocess (``quantdeck.core.workers.quality``: it imports torch) of
    ``python`` (default: the default engine: this interpreter, a bundle's first engine)."""
    for p in (orig, quant):
        inspect_model(p)  # one-line errors before the heavy subprocess
    python = python or default_engine()  # (a bundle's: its discovery runs in this thread)
    cmd = worker_command("quality", orig, quant, python=python) + ["--max-tokens", str(max_tokens)]
    if text:
        cmd += ["--text", text]
    r = run_child(  # dies with us; a hung check ends after an hour
        cmd, kind="quality check", timeout=3600.0, env=subprocess_env({"HF_HUB_OFFLINE": "1"})
    )
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or [f"exit code {r.returncode}"])[-1]
        raise QuantdeckError(f"compare: {last}{_lacks(last, cmd[0])}")
    return json.loads(r.stdout.strip().splitlines()[-1])
