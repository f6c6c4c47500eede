"""Session recordings: one JSON object per line, replayable as if live.

The first line is a header (``{"event": "recording", "version": 1, "config": {...}, ...}``);
the rest are the same events ``quantdeck serve --json-events`` prints: ``state``, ``fact``,
``progress``, ``advice``, ``plan``, ``metrics`` (flat, telemetry included). A recording made on
a GPU host renders in the Monitor on any machine.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, TypeVar

from quantdeck.core.errors import ConfigError, QuantdeckError
from quantdeck.core.events import Event, RecordingHeader, from_json
from quantdeck.core.paths import move_file
from quantdeck.core.schema import Fields, load_json, regular_file, shown

E = TypeVar("E", bound=Event)

FORMAT_VERSION = 1


PARTIAL_SUFFIX = ".partial"


class RecordingError(QuantdeckError):
    """A recording could not be written (a full disk...). It stopped there; what it holds is
    kept under its ``.partial`` name."""


class Recorder:
    """Append events to a JSONL file; thread-safe; flushed per line so a crash loses nothing.

    Events go to ``NAME.partial`` (mode 0600: a recording holds the launch config) and
    :meth:`close` renames it to NAME, so a recording cut short by a crash or a write error says
    so by its name (it replays all the same). An existing NAME or NAME.partial is refused unless
    ``overwrite``; a folder or a symbolic link there always is. A write error is raised once as
    :class:`RecordingError` (also kept in :attr:`error`); later events are dropped.
    """

    def __init__(
        self, path: str | Path, header: dict[str, Any] | None = None, *, overwrite: bool = False
    ) -> None:
        self.path = Path(path)
        self.partial = self.path.with_name(self.path.name + PARTIAL_SUFFIX)
        self.error: str | None = None
        for p in (self.path, self.partial):
            if p.is_symlink() or p.is_dir():
                raise ConfigError(f"{p}: is a folder or a symbolic link; not replacing it")
            if p.exists() and not overwrite:
                raise ConfigError(f"{p}: exists; choose another file name")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.partial.unlink(missing_ok=True)  # only there with overwrite, checked above
            fd = os.open(self.partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except OSError as e:
            raise RecordingError(f"{self.partial}: cannot create ({e.strerror or e})") from None
        self._overwrite = overwrite
        self._f = os.fdopen(fd, "w", encoding="utf-8")
        self._lock = threading.Lock()
        self.write(RecordingHeader(FORMAT_VERSION, time.time(), dict(header or {})))

    def write(self, ev: Event) -> None:
        line = json.dumps(ev.to_json(), default=_jsonable, separators=(",", ":"))
        with self._lock:
            if self._f.closed:
                return
            try:
                self._f.write(line + "\n")
                self._f.flush()
            except OSError as e:
                raise self._stopped(e) from None

    def close(self) -> None:
        """Finish the file (fsynced) and give it its name; raises :class:`RecordingError` when
        that fails (the events stay in the ``.partial`` file)."""
        with self._lock:
            if self._f.closed:
                return
            try:
                self._f.flush()
                os.fsync(self._f.fileno())
                self._f.close()
                move_file(self.partial, self.path, replace=self._overwrite)
            except OSError as e:
                raise self._stopped(e) from None

    def _stopped(self, e: OSError) -> RecordingError:
        """Close after a write error; the one-line error to raise."""
        with contextlib.suppress(OSError):
            self._f.close()  # flushing what is left fails again: the file closes all the same
        why = "exists" if isinstance(e, FileExistsError) else (e.strerror or str(e))
        self.error = f"recording stopped: {self.path} ({why}); what it holds is in {self.partial}"
        return RecordingError(self.error)


def _jsonable(o: Any) -> Any:
    if hasattr(o, "to_json"):
        return o.to_json()
    return repr(o)


@dataclass
class Recording:
    header: RecordingHeader
    events: list[Event]

    def of(self, kind: type[E]) -> list[E]:
        return [e for e in self.events if isinstance(e, kind)]

    @property
    def duration_s(self) -> float:
        ts = [t for e in self.events if (t := e.when) is not None]
        return (max(ts) - min(ts)) if ts else 0.0


MAX_LINE = 2**20  # characters of one line: a metrics event of 64 GPUs takes about 30 000
MAX_GPUS = 64  # GPUs one event may list; the Monitor keeps series per GPU, so more is refused


def read_recording(path: str | Path) -> Recording:
    """Load a recording; a truncated last line (a crash mid-write) is skipped, other damage is
    a ConfigError naming the line. Every line is bounded and checked (quantdeck.core.schema):
    the header's version, each event's time and GPU list."""
    p = Path(path)
    opener: Callable[..., IO[str]] = gzip.open if p.suffix == ".gz" else open
    try:
        regular_file(p)  # a FIFO would block the read
        with opener(p, "rt", encoding="utf-8") as f:
            header, events = _read_lines(f, p)
    except FileNotFoundError:
        raise ConfigError(f"{p}: no such recording") from None
    except (OSError, EOFError, UnicodeDecodeError, zlib.error) as e:
        raise ConfigError(f"{p}: cannot read ({e})") from None
    if header is None:
        raise ConfigError(f"{p}: no recording header (not a Quantdeck recording)")
    return Recording(header, events)


def _read_lines(f: IO[str], p: Path) -> tuple[RecordingHeader | None, list[Event]]:
    header: RecordingHeader | None = None
    events: list[Event] = []
    i = 0
    while line := f.readline(MAX_LINE + 1):
        i += 1
        if len(line) > MAX_LINE:
            raise ConfigError(f"{p}: line {i} is over {MAX_LINE} characters (not an event)")
        if not line.strip():
            continue
        try:
            obj = load_json(line, f"{p}: line {i} is not JSON", nonfinite_as_none=True)
        except ConfigError:
            if not line.endswith("\n"):  # the last line, cut short by a crash
                break
            raise
        where = f"{p}: line {i}"
        if header is None:
            header = _header(obj, p, where)
        else:
            events.append(_event(obj, where))
    return header, events


def _header(obj: Any, p: Path, where: str) -> RecordingHeader:
    if not (isinstance(obj, dict) and obj.get("event") == "recording"):
        raise ConfigError(f"{p}: no recording header (not a Quantdeck recording)")
    f = Fields(obj, where)
    version = f.integer("version", lo=1, required=True)
    assert version is not None  # required
    if version > FORMAT_VERSION:
        raise ConfigError(
            f"{p}: recording format {version} is newer than this Quantdeck reads ({FORMAT_VERSION})"
        )
    f.number("t")
    for key in ("title", "model", "note", "source"):  # what replay shows
        f.text(key)
    header = _event(obj, where)
    assert isinstance(header, RecordingHeader)
    return header


def _event(obj: Any, where: str) -> Event:
    f = Fields(obj, where)
    is_metrics = f.data.get("event") == "metrics"
    f.number("t", required=is_metrics)
    if is_metrics:
        for gpu in f.items("gpus", max_len=MAX_GPUS) or []:
            if not isinstance(gpu, dict):
                f.fail(f"'gpus' must list objects, got {shown(gpu)}")
    try:
        return from_json(obj)
    except ValueError as e:
        raise ConfigError(f"{where} is not an event ({e})") from None


def replay(
    rec: Recording,
    emit: Callable[[Event], None],
    *,
    speed: float = 0.0,
    stop: threading.Event | None = None,
) -> Iterator[None]:
    """Feed the events to ``emit`` in order; ``speed`` 1.0 keeps the original pacing, 0 is as
    fast as possible. A generator: it yields after each event (a worker can cancel there)."""
    t0 = None
    start = time.monotonic()
    for ev in rec.events:
        if stop is not None and stop.is_set():
            return
        t = ev.when
        if speed > 0 and t is not None:
            if t0 is None:
                t0 = t
            due = (t - t0) / speed
            delay = due - (time.monotonic() - start)
            if delay > 0:
                time.sleep(delay)
        emit(ev)
        yield None
