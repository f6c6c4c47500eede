"""Supervising our own subprocesses: their environment and the reader side of the workers'
line protocol (:mod:`quantdeck.core.workers.protocol`)."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterable, Iterator
from typing import Any

from quantdeck.core.events import Event, LogEvent, from_json


def subprocess_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for a worker or engine subprocess: ours, plus ``extra``."""
    return {**os.environ, **(extra or {})}


def worker_command(module: str, *args: str, python: str | None = None) -> list[str]:
    """``python -m quantdeck.core.workers.MODULE ARGS``."""
    return [python or sys.executable, "-m", f"quantdeck.core.workers.{module}", *args]


def json_lines(lines: Iterable[str]) -> Iterator[dict[str, Any]]:
    """The JSON objects among a worker's stdout lines; anything else becomes a ``log`` event."""
    for line in lines:
        line = line.strip()
        if not line:
            continue
        try:
            ev = json.loads(line)
        except ValueError:
            ev = None
        yield ev if isinstance(ev, dict) else {"event": "log", "line": line}


def worker_events(lines: Iterable[str], *, stamp: bool = True) -> Iterator[Event]:
    """A worker's stdout as typed events, each (with ``stamp``) stamped with the time it arrived
    unless the worker stamped it; a line that is not an event becomes a :class:`LogEvent`."""
    for data in json_lines(lines):
        if stamp:
            data.setdefault("t", time.time())
        try:
            yield from_json(data)
        except ValueError:
            yield LogEvent(json.dumps(data))
