"""Supervising our own subprocesses: their environment and the reader side of the workers'
line protocol (:mod:`quantdeck.core.workers.protocol`)."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable, Iterator
from typing import Any


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


def last_line(lines: Iterable[str], default: str = "") -> str:
    """The last non-empty line (a worker's one-line error is its last stderr line)."""
    last = default
    for line in lines:
        if line.strip():
            last = line.strip()
    return last
