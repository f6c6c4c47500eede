"""Saved benchmark runs: one JSON file per run with its load, config and environment.

Runs live in ``<data dir>/runs`` (``QUANTDECK_DATA_DIR`` overrides the data dir). A run file is
a ``vllm bench serve`` result (same keys) plus Quantdeck's own: ``requests`` (every request's
record), ``load``, ``config`` (the launch config when Quantdeck started the server), ``env``.
"""

from __future__ import annotations

import json
import os
import platform
import re
import time
from pathlib import Path
from typing import Any

from quantdeck.core.errors import ConfigError
from quantdeck.core.paths import data_root, write_json

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


def save_run(result: dict[str, Any], label: str | None = None, folder: Path | None = None) -> Path:
    """Write the run atomically; returns its path."""
    folder = folder or runs_dir()
    folder.mkdir(parents=True, exist_ok=True)
    label = label or result.get("label") or Path(str(result.get("model_id", "run"))).name
    result["label"] = label
    path = folder / f"{time.strftime('%Y%m%d-%H%M%S')}-{_slug(label)}.json"
    n = 1
    while path.exists():
        path = path.with_name(f"{path.stem}-{n}.json")
        n += 1
    write_json(path, result)
    return path


def load_run(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        cand = runs_dir() / p.name
        if cand.is_file():
            p = cand
        else:
            raise ConfigError(f"{path}: no such run file")
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"{p}: not a run file ({e})") from None
    if not isinstance(data, dict) or (
        "completed" not in data and data.get("kind") not in ("ab", "tune")
    ):
        raise ConfigError(f"{p}: not a benchmark result")
    data.setdefault("label", p.stem)
    data["_path"] = str(p)
    return data


def list_runs(folder: Path | None = None) -> list[Path]:
    folder = folder or runs_dir()
    return sorted(folder.glob("*.json"), reverse=True) if folder.is_dir() else []


def compare(a: dict[str, Any], b: dict[str, Any]) -> list[dict[str, Any]]:
    """Row per key: a, b, b/a and whether b is better."""
    rows = []
    for key in COMPARE_KEYS:
        va, vb = a.get(key), b.get(key)
        ratio = (
            vb / va
            if isinstance(va, (int, float)) and isinstance(vb, (int, float)) and va
            else None
        )
        better = None
        if ratio is not None and ratio != 1:
            lower = any(key.endswith(s) or key == s for s in LOWER_IS_BETTER)
            better = (ratio < 1) if lower else (ratio > 1)
        rows.append({"metric": key, "a": va, "b": vb, "ratio": ratio, "b_better": better})
    return rows
