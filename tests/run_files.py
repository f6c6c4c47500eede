"""Saved runs read back (issue 44): a run file read with ``load_run`` and written back with
``to_json`` is the same file, byte for byte."""

from __future__ import annotations

from pathlib import Path

from quantdeck.core.bench import load_run
from quantdeck.core.bench.results import RunResult
from quantdeck.core.paths import write_json


def assert_round_trip(path: Path) -> RunResult:
    """``path`` read with ``load_run`` and written back as the writers write it (``write_json``
    of its ``to_json``) gives the same bytes; returns the run read."""
    run = load_run(path)
    again = path.with_name(path.name + ".again")
    try:
        write_json(again, run.to_json())
        assert again.read_bytes() == path.read_bytes(), f"{path}: not the same JSON"
    finally:
        again.unlink(missing_ok=True)
    return run
