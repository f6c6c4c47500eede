"""Session recordings: one JSON object per line, replayable as if live.

The first line is a header (``{"event": "recording", "version": 1, "config": {...}, ...}``);
the rest are the same events ``quantdeck serve --json-events`` prints: ``state``, ``fact``,
``progress``, ``advice``, ``plan``, ``metrics`` (flat, telemetry included). A recording made on
a GPU host renders in the Monitor on any machine.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import os
import stat
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from quantdeck.core.errors import ConfigError, QuantdeckError, mask_credentials
from quantdeck.core.events import Event, MarkerEvent, RecordingHeader, from_json
from quantdeck.core.paths import move_file
from quantdeck.core.schema import Fields, check_event, load_json, regular_file, shown

E = TypeVar("E", bound=Event)

FORMAT_VERSION = 1


PARTIAL_SUFFIX = ".partial"


class RecordingError(QuantdeckError):
    """A recording could not be written (a full disk...). It stopped there; what it holds is
    kept under its ``.partial`` name."""


class RecordingCapped(RecordingError):
    """A recording reached its cap (:attr:`Recorder.max_bytes`): its last line says so (a
    ``marker`` event, ``what: "recording"``), later events are dropped, and :meth:`Recorder.close`
    still gives it its name."""


_NOTE_BYTES = 512  # room kept below the cap for the line that says the cap was hit


class Recorder:
    """Append events to a JSONL file; thread-safe; flushed per line so a crash loses nothing.

    Events go to ``NAME.partial`` (mode 0600: a recording holds the launch config) and
    :meth:`close` renames it to NAME, so a recording cut short by a crash or a write error says
    so by its name (it replays all the same). An existing NAME or NAME.partial is refused unless
    ``overwrite``; a folder or a symbolic link there always is. A write error is raised once as
    :class:`RecordingError` (also kept in :attr:`error`); later events are dropped. URLs are
    written without their credentials.

    Bounded: at ``max_bytes`` (default, and at most: what a replay reads, :data:`MAX_BYTES`
    and :data:`MAX_LINES`) the recording stops with a last line saying so; that is raised once
    as :class:`RecordingCapped` (the note also in :attr:`capped`).
    """

    def __init__(
        self,
        path: str | Path,
        header: dict[str, Any] | None = None,
        *,
        overwrite: bool = False,
        max_bytes: int | None = None,
    ) -> None:
        self.path = Path(path)
        self.partial = self.path.with_name(self.path.name + PARTIAL_SUFFIX)
        self.error: str | None = None
        self.capped: str | None = None
        self.max_bytes = MAX_BYTES if max_bytes is None else max_bytes
        if not 4 * _NOTE_BYTES <= self.max_bytes <= MAX_BYTES:
            raise ConfigError(
                f"a recording's cap must be between {4 * _NOTE_BYTES} bytes and "
                f"{MAX_BYTES // 2**20} MiB (a replay reads no more), got {self.max_bytes}"
            )
        self.size = self.lines = 0  # written so far
        self.check_target(self.path, overwrite=overwrite)
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

    @staticmethod
    def check_target(path: str | Path, *, overwrite: bool = False) -> None:
        """Refuse, as the constructor does, a ``path`` (or its ``.partial``) that is a folder
        or a link, or exists without ``overwrite``; creates nothing (a command checks its
        output before it starts anything, and makes it once it has started)."""
        path = Path(path)
        for p in (path, path.with_name(path.name + PARTIAL_SUFFIX)):
            if p.is_symlink() or p.is_dir():
                raise ConfigError(f"{p}: is a folder or a symbolic link; not replacing it")
            if p.exists() and not overwrite:
                raise ConfigError(f"{p}: exists; choose another file name")

    def write(self, ev: Event) -> None:
        # ASCII (json's default): its length is its size in bytes
        line = mask_credentials(json.dumps(ev.to_json(), default=_jsonable, separators=(",", ":")))
        with self._lock:
            if self._f.closed or self.capped is not None:
                return
            if (
                self.size + len(line) + 1 > self.max_bytes - _NOTE_BYTES
                or self.lines + 2 > MAX_LINES
            ):
                raise self._cap() from None
            self._write_line(line)

    def _write_line(self, line: str) -> None:
        try:
            self._f.write(line + "\n")
            self._f.flush()
        except OSError as e:
            raise self._stopped(e) from None
        self.size += len(line) + 1
        self.lines += 1

    def _cap(self) -> RecordingCapped:
        """The last line: the cap was hit (a marker, shown on a replay's time axis); the
        one-line note to raise."""
        full = self.lines + 2 > MAX_LINES
        cap = f"{MAX_LINES:,} lines" if full else f"{self.max_bytes / 2**20:.4g} MiB"
        when = time.strftime("%H:%M:%S")
        label = f"recording capped at {cap}: nothing after {when} was recorded"
        self._write_line(json.dumps(MarkerEvent("recording", label).to_json()))
        self.capped = f"{label} ({self.path})"
        return RecordingCapped(self.capped)

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


# A recording is read line by line, within these caps (a bigger one is refused in one line
# naming the cap, before any event is built). A day of one server sampled every second is
# about 90 MB in 90 000 lines; read, a recording takes about 6 times its size in memory.
MAX_LINE = 2**20  # bytes of one line: a metrics event of 64 GPUs takes about 30 000
MAX_LINES = 1_000_000  # lines of one recording
MAX_BYTES = 128 * 2**20  # bytes of one recording, decompressed (a .gz is measured unpacked)
MAX_GPUS = 64  # GPUs one event may list; the Monitor keeps series per GPU, so more is refused
# nesting of a line: quantdeck.core.schema.MAX_DEPTH levels (a recording's lines take 5)
_CHUNK = 2**20


def read_recording(path: str | Path) -> Recording:
    """Load a recording; a truncated last line (a crash mid-write) is skipped, other damage is
    a ConfigError naming the line. Every line is bounded and checked (quantdeck.core.schema):
    the header's version, every field of every event as its class declares it; the lines,
    their bytes (decompressed) and their nesting are capped."""
    events = iter_recording(path)
    header = next(events)
    assert isinstance(header, RecordingHeader)  # iter_recording's first
    return Recording(header, list(events))


def iter_recording(path: str | Path) -> Iterator[Event]:
    """The recording's header, then its events, read and checked one line at a time (see
    :func:`read_recording`). The file is measured before the first event is read: one over a
    cap is refused at once, however it is compressed."""
    p = Path(path)
    _measure(p)
    header: RecordingHeader | None = None
    with _reading(p), _open(p) as f:
        for obj, where in _objects(f, p):
            if header is None:
                header = _header(obj, p, where)
                yield header
            else:
                yield _event(obj, where)
    if header is None:
        raise ConfigError(f"{p}: no recording header (not a Quantdeck recording)")


@contextlib.contextmanager
def _open(p: Path) -> Iterator[io.BufferedIOBase]:
    """The recording's bytes (unpacked, for a .gz). Opened without blocking and checked again
    once open: a FIFO put in its place since it was measured is refused, never waited on."""
    fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    with open(fd, "rb") as raw:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ConfigError(f"{p}: not a regular file")
        if p.suffix != ".gz":
            yield raw
            return
        with gzip.GzipFile(fileobj=raw, mode="rb") as f:
            yield f


@contextlib.contextmanager
def _reading(p: Path) -> Iterator[None]:
    """A failure of the file itself (missing, damaged gzip, unreadable) as one ConfigError."""
    try:
        yield
    except FileNotFoundError:
        raise ConfigError(f"{p}: no such recording") from None
    except (OSError, EOFError, zlib.error) as e:
        raise ConfigError(f"{p}: cannot read ({e})") from None


def _over(p: Path, what: str) -> ConfigError:
    return ConfigError(f"{p}: over {what} (the cap of a recording); not read")


def _measure(p: Path) -> None:
    """Refuse a recording over :data:`MAX_BYTES` or :data:`MAX_LINES` before parsing any of
    it: a small .gz can unpack to gigabytes (it is unpacked here, a chunk at a time, and
    dropped); a FIFO or a device, which would block or never end, is refused unopened."""
    with _reading(p):
        if regular_file(p) > MAX_BYTES and p.suffix != ".gz":
            raise _over(p, f"{MAX_BYTES // 2**20} MiB")
        total = lines = 0
        with _open(p) as f:
            while chunk := f.read(_CHUNK):
                total += len(chunk)
                lines += chunk.count(b"\n")
                if total > MAX_BYTES:
                    raise _over(p, f"{MAX_BYTES // 2**20} MiB unpacked")
                if lines > MAX_LINES:
                    raise _over(p, f"{MAX_LINES:,} lines")


def _objects(f: io.BufferedIOBase, p: Path) -> Iterator[tuple[Any, str]]:
    """Each non-blank line's JSON and where it is (``FILE: line N``), the caps held again
    (the file may have grown since it was measured)."""
    total = i = 0
    while raw := f.readline(MAX_LINE + 1):
        i += 1
        total += len(raw)
        if len(raw) > MAX_LINE:
            raise ConfigError(f"{p}: line {i} is over {MAX_LINE} bytes (the cap of a line)")
        if i > MAX_LINES:
            raise _over(p, f"{MAX_LINES:,} lines")
        if total > MAX_BYTES:
            raise _over(p, f"{MAX_BYTES // 2**20} MiB")
        last = not raw.endswith(b"\n")  # the last line, cut short by a crash
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError:
            if last:
                break
            raise ConfigError(f"{p}: line {i} is not UTF-8 text") from None
        if not line.strip():
            continue
        try:
            obj = load_json(line, f"{p}: line {i} is not JSON", nonfinite_as_none=True)
        except ConfigError:
            if last:
                break
            raise
        yield obj, f"{p}: line {i}"


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
    """The event of one line, every field checked as its class declares it (the schema
    check the live events' classes define: quantdeck.core.schema.check_event)."""
    f = Fields(obj, where)
    is_metrics = f.data.get("event") == "metrics"
    f.number("t", required=is_metrics)
    if is_metrics:
        for gpu in f.items("gpus", max_len=MAX_GPUS) or []:
            if not isinstance(gpu, dict):
                f.fail(f"'gpus' must list objects, got {shown(gpu)}")
    try:
        ev = from_json(obj)
    except ValueError as e:
        raise ConfigError(f"{where} is not an event ({e})") from None
    check_event(ev, where)
    return ev


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
