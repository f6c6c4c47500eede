"""Saved benchmark runs: one JSON file per run with its load, config and environment.

Runs live in ``<data dir>/runs`` (``QUANTDECK_DATA_DIR`` overrides the data dir). A run file is
a ``vllm bench serve`` result (same keys) plus Quantdeck's own: ``requests`` (every request's
record), ``load``, ``config`` (the launch config when Quantdeck started the server), ``env``.
"""

from __future__ import annotations

import dataclasses
import os
import platform
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quantdeck.core.bench.results import BenchResult, RunResult, run_result
from quantdeck.core.errors import ConfigError
from quantdeck.core.paths import data_root, write_json
from quantdeck.core.schema import Fields, load_json, read_bounded

COMPARE_KEYS = (
    "completed",
    "failed",
    "request_throughput",
    "request_goodput",
    "output_throughput",
    "total_token_throughput",
    "median_ttft_ms",
    "p99_ttft_ms",
    "median_tpot_ms",
    "p99_tpot_ms",
    "median_itl_ms",
    "p99_itl_ms",
    "median_e2el_ms",
    "p99_e2el_ms",
)
LOWER_IS_BETTER = ("failed", "_ms")


def runs_dir() -> Path:
    return data_root() / "runs"


def environment(server_version: str | None = None) -> dict[str, Any]:
    """Where the numbers came from: vLLM, device, driver, host."""
    from quantdeck.core.launch import detect_device
    from quantdeck.core.monitor import driver_version

    dev = detect_device()
    return {
        "vllm_version": server_version,
        "device": dev.name,
        "device_kind": dev.kind,
        "device_count": dev.count,
        "driver": driver_version(),
        "host": platform.node(),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
    }


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-")[:60] or "run"


def save_run(result: RunResult, label: str | None = None, folder: Path | None = None) -> Path:
    """Write the run atomically (fsynced, mode 0600: prompts and settings are the user's) under
    a new name, never over another run, even one saved at the same moment; returns its path."""
    folder = folder or runs_dir()
    model = result.model_id if isinstance(result, BenchResult) else None
    label = label or result.label or Path(str(model or "run")).name
    result.label = label
    stem = f"{time.strftime('%Y%m%d-%H%M%S')}-{_slug(label)}"
    n = 0
    while True:
        path = folder / (f"{stem}-{n}.json" if n else f"{stem}.json")
        try:
            write_json(path, result.to_json(), private=True, replace=False)
            return path
        except FileExistsError:
            n += 1


def check_result_target(path: Path) -> None:
    """``--json FILE`` may replace only a result Quantdeck wrote there before: anything else
    at ``path`` (a file of the user's, a folder, a link) is refused, before the run starts."""
    if path.is_symlink() or (path.exists() and not path.is_file()):
        raise ConfigError(f"{path}: not a file Quantdeck wrote: not replaced")
    if path.exists():
        try:
            load_run(path)
        except ConfigError:
            raise ConfigError(
                f"{path}: exists and is not a Quantdeck result: not replaced (choose another file)"
            ) from None


def write_result(path: Path, result: RunResult) -> None:
    """Write ``result`` to ``path`` (atomically, 0600) after :func:`check_result_target`."""
    check_result_target(path)
    write_json(path, result.to_json(), private=True)


MAX_RUN_BYTES = 512 * 2**20  # a long A/B run with every request's token times is ~100 MiB
MAX_ITEMS = 100_000  # arms, tuning points


def load_run(path: str | Path) -> RunResult:
    """A saved run (``bench``, ``ab``, ``tune`` or ``live_tune``), by path or by its name in the
    history, read back into its kind's result (:mod:`quantdeck.core.bench.results`); its
    ``path`` is the file's.
    Checked with the one schema (:mod:`quantdeck.core.schema`): what the lists, comparisons
    and reports read has its type, so a damaged or foreign file is one ConfigError line."""
    p = Path(path)
    if not p.is_file():
        cand = runs_dir() / p.name
        if cand.is_file():
            p = cand
        else:
            raise ConfigError(f"{path}: no such run file")
    raw = read_bounded(p, MAX_RUN_BYTES, "run")
    # json.dumps writes NaN for a figure it could not compute: read as no figure; Infinity
    # for the load's rate of requests sent all at once: read as it was (the file reads back)
    data = load_json(raw, f"{p}: not a run file", nonfinite_as_none=True, infinity=True)
    if not isinstance(data, dict) or (
        "completed" not in data and data.get("kind") not in ("ab", "tune", "live_tune")
    ):
        raise ConfigError(f"{p}: not a benchmark result")
    _check_run(Fields(data, str(p)))
    run = run_result(data)
    run.path = str(p)  # its name, where it has no label, is the file's (Record.name)
    return run


def _check_run(f: Fields) -> None:
    kind = f.text("kind", max_len=32) or "bench"
    f.text("label")
    if kind == "ab":
        for i, arm in enumerate(f.items("arms", max_len=MAX_ITEMS, required=True) or []):
            a = Fields(arm, f"{f.where}: arm {i + 1}")
            a.text("label", required=True)
            a.text("error")
            a.number("ready_s")
            a.sub("facts")
            result, roofline = a.sub("result"), a.sub("roofline")
            if result:
                _check_figures(result, required=False)
            if roofline:
                roofline.number("fraction_of_roofline")
                roofline.number("roofline_tok_s")
    elif kind == "live_tune":
        for i, trial in enumerate(f.items("trials", max_len=MAX_ITEMS, required=True) or []):
            t = Fields(trial, f"{f.where}: trial {i + 1}")
            t.text("result", required=True)
            t.text("decision")
            t.text("reason")
            t.sub("knobs")
        f.text("ended")
        f.sub("launch")
        return
    elif kind == "tune":
        for i, point in enumerate(f.items("points", max_len=MAX_ITEMS, required=True) or []):
            _check_point(Fields(point, f"{f.where}: point {i + 1}"))
        best = f.sub("best")
        if best:
            _check_point(best)
    else:
        f.items("requests", max_len=10_000_000)
    _check_figures(f, required=kind == "bench")


def _check_figures(f: Fields, *, required: bool) -> None:
    """A result's figures (what ``runs`` lists and compares): counts and non-negative
    numbers, or none; a bench result has its count of completed requests."""
    for key in COMPARE_KEYS:
        if key in ("completed", "failed"):
            f.integer(key, lo=0, hi=2**53, required=required and key == "completed")
        else:
            f.number(key, lo=0, hi=1e15)


def _check_point(f: Fields) -> None:
    f.sub("values", required=True)
    for key in ("goodput", "p99_ttft_ms", "p99_tpot_ms"):
        f.number(key, lo=0)
    f.boolean("meets")
    f.text("error")
    f.text("dropped")


def list_runs(folder: Path | None = None) -> list[Path]:
    """The run files of the history, newest first (an unreadable folder has none)."""
    folder = folder or runs_dir()
    try:
        return sorted(folder.glob("*.json"), reverse=True) if folder.is_dir() else []
    except OSError:
        return []


@dataclass(frozen=True)
class CompareRow:
    """One figure of two runs: its value in each, b / a and whether b is better (None: equal
    or not comparable)."""

    metric: str
    a: float | None
    b: float | None
    ratio: float | None
    b_better: bool | None

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def compare(a: RunResult, b: RunResult) -> list[CompareRow]:
    """Row per key: a, b, b/a and whether b is better (a run other than a bench has none)."""
    rows = []
    for key in COMPARE_KEYS:
        va, vb = (r.figure(key) if isinstance(r, BenchResult) else None for r in (a, b))
        ratio = (
            vb / va
            if isinstance(va, (int, float)) and isinstance(vb, (int, float)) and va
            else None
        )
        better = None
        if ratio is not None and ratio != 1:
            lower = any(key.endswith(s) or key == s for s in LOWER_IS_BETTER)
            better = (ratio < 1) if lower else (ratio > 1)
        rows.append(CompareRow(key, va, vb, ratio, better))
    return rows
