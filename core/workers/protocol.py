"""The line protocol every worker subprocess speaks, writer side.

stdout carries one JSON object per line (``{"event": "progress", ...}``, ``{"event": "done",
...}``), flushed as written; an error a user can cause is one ``PROG: error: MESSAGE`` line on
stderr and exit code 2. The supervisors read it with :mod:`quantdeck.core.procs`. Standard
library only: a worker imports this before its heavy libraries.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import IO, Any, NoReturn

_events: IO[str] | None = None  # where the JSON lines go (see events_to_own_stdout)


def emit(event: str, **fields: Any) -> None:
    """Print one JSON line and flush it (the parent reads stdout line by line)."""
    print(json.dumps({"event": event, **fields}), file=_events or sys.stdout, flush=True)


def events_to_own_stdout() -> None:
    """Keep stdout for the JSON lines alone: the events go to a copy of file descriptor 1 and
    descriptor 1 then points at stderr, so whatever a library prints there (banners, logs,
    progress bars, compiler output) lands on stderr instead."""
    global _events
    sys.stdout.flush()
    _events = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
    os.dup2(2, 1)


def fail(prog: str, message: object) -> NoReturn:
    """Print one error line to stderr and exit with code 2."""
    print(f"{prog}: error: {' '.join(str(message).split())}", file=sys.stderr, flush=True)
    raise SystemExit(2)


class OneLineParser(argparse.ArgumentParser):
    """An argument parser whose errors are one stderr line and exit code 2."""

    def error(self, message: str) -> NoReturn:
        fail(self.prog, message)
