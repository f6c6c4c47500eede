"""Session recordings: one JSON object per line, replayable as if live.

The first line is a header (``{"event": "recording", "version": 1, "config": {...}, ...}``);
the rest are the same events ``quantdeck serve --json-events`` prints: ``state``, ``fact``,
``progress``, ``advice``, ``plan``, ``metrics`` (flat, telemetry included). A recording made on
a GPU host renders in the Monitor on any machine.
"""

from __future__ import annotations

import gzip
import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from quantdeck.core.errors import ConfigError
from quantdeck.core.events import Event, RecordingHeader, from_json

E = TypeVar("E", bound=Event)

FORMAT_VERSION = 1


class Recorder:
    """Append events to a JSONL file; thread-safe; flushed per line so a crash loses nothing."""

    def __init__(self, path: str | Path, header: dict[str, Any] | None = None) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._f = open(self.path, "w", encoding="utf-8")  # noqa: SIM115 (open until close())
        self._lock = threading.Lock()
        self.write(RecordingHeader(FORMAT_VERSION, time.time(), dict(header or {})))

    def write(self, ev: Event) -> None:
        line = json.dumps(ev.to_json(), default=_jsonable, separators=(",", ":"))
        with self._lock:
            if self._f.closed:
                return
            self._f.write(line + "\n")
            self._f.flush()

    def close(self) -> None:
        with self._lock:
            self._f.close()


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
        ts = [t for e in self.events if isinstance(t := e.get("t"), (int, float))]
        return (max(ts) - min(ts)) if ts else 0.0


def read_recording(path: str | Path) -> Recording:
    """Load a recording; a truncated last line (a crash mid-write) is skipped, other damage is
    a ConfigError naming the line."""
    p = Path(path)
    try:
        if p.suffix == ".gz":
            with gzip.open(p, "rt", encoding="utf-8") as f:
                lines = f.read().splitlines()
        else:
            lines = p.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise ConfigError(f"{p}: no such recording") from None
    except (OSError, EOFError, UnicodeDecodeError) as e:
        raise ConfigError(f"{p}: cannot read ({e})") from None
    events: list[Event] = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            ev = json.loads(line)
        except json.JSONDecodeError:
            if i == len(lines):
                break
            raise ConfigError(f"{p}: line {i} is not JSON (not a Quantdeck recording?)") from None
        if not events and not (isinstance(ev, dict) and ev.get("event") == "recording"):
            raise ConfigError(f"{p}: no recording header (not a Quantdeck recording)")
        try:
            events.append(from_json(ev))
        except ValueError as e:
            raise ConfigError(f"{p}: line {i} is not an event ({e})") from None
    if not events or not isinstance(events[0], RecordingHeader):
        raise ConfigError(f"{p}: no recording header (not a Quantdeck recording)")
    header = events.pop(0)
    assert isinstance(header, RecordingHeader)
    if header.version > FORMAT_VERSION:
        raise ConfigError(
            f"{p}: recording format {header.version} is newer than this "
            f"Quantdeck reads ({FORMAT_VERSION})"
        )
    return Recording(header, events)


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
        t = ev.get("t")
        if speed > 0 and isinstance(t, (int, float)):
            if t0 is None:
                t0 = t
            due = (t - t0) / speed
            delay = due - (time.monotonic() - start)
            if delay > 0:
                time.sleep(delay)
        emit(ev)
        yield None
