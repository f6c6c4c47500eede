"""Saving runs: private, atomic, never over another run."""

from __future__ import annotations

import json
import stat
import threading
from pathlib import Path

import pytest

from quantdeck.core.bench import runs
from quantdeck.core.bench.results import BenchResult
from quantdeck.core.bench.runs import save_run


def test_runs_saved_at_the_same_second_keep_each_their_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runs.time, "strftime", lambda fmt: "20261203-120000")
    paths: list[Path] = []
    lock = threading.Lock()

    def save(i: int) -> None:
        p = save_run(BenchResult(completed=i, model_id="m"), "same label", tmp_path)
        with lock:
            paths.append(p)

    threads = [threading.Thread(target=save, args=(i,)) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(paths)) == 12  # none written over another
    assert sorted(json.loads(p.read_text())["completed"] for p in paths) == list(range(12))
    assert {p.name for p in paths} >= {"20261203-120000-same-label.json"}
    assert "20261203-120000-same-label-1.json" in {p.name for p in paths}
    assert sorted(p.name for p in tmp_path.iterdir() if p.suffix != ".json") == []
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in paths)


def test_save_run_never_writes_over_an_existing_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runs.time, "strftime", lambda fmt: "20261203-120000")
    (tmp_path / "20261203-120000-x.json").write_text("someone else's")
    p = save_run(BenchResult(completed=1), "x", tmp_path)
    assert p.name == "20261203-120000-x-1.json"
    assert (tmp_path / "20261203-120000-x.json").read_text() == "someone else's"
