"""A run file from anywhere loads or is refused with one ConfigError line, and what loads can
be listed and compared: the CLI's history never fails on one bad file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fuzz import HOSTILE_TEXT, JSON_VALUES, fuzz_settings, mutated, one_line_error
from hypothesis import given
from hypothesis import strategies as st

from quantdeck.cli.main import main
from quantdeck.core.bench import compare, load_run, runs_dir
from quantdeck.core.bench.results import run_result
from quantdeck.core.bench.runs import COMPARE_KEYS
from quantdeck.core.errors import ConfigError

BENCH = {
    "completed": 10,
    "failed": 0,
    "output_throughput": 100.0,
    "median_ttft_ms": 20.0,
    "p99_ttft_ms": 30.0,
    "label": "b",
}
AB = {"kind": "ab", "arms": [{"label": "a", "result": BENCH, "roofline": {}}]}
TUNE = {
    "kind": "tune",
    "points": [{"values": {"max_num_seqs": 8}, "goodput": 1.0, "meets": True}],
    "best": None,
}
TRIAL = {"step": 1, "knobs": {"max_num_seqs": [1, 8]}, "result": "promoted", "reason": "better"}
LIVE = {"kind": "live_tune", "trials": [TRIAL], "ended": "the budget: 1 trials", "launch": {}}


def _write(path: Path, data: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, allow_nan=True))
    return path


@pytest.mark.parametrize(
    "data, message",
    [
        ({**BENCH, "output_throughput": "fast"}, "'output_throughput' must be a finite number"),
        ({**BENCH, "completed": -1}, "'completed' must be an integer from 0 to"),
        ({**BENCH, "completed": None}, "'completed' missing"),
        ({**BENCH, "median_ttft_ms": -1.0}, "'median_ttft_ms' must be a finite number from 0"),
        ({**BENCH, "kind": 5}, "'kind' must be a string"),
        ({**AB, "arms": "x"}, "'arms' must be a list"),
        ({**AB, "arms": [{"result": BENCH}]}, "arm 1: 'label' missing"),
        ({**AB, "arms": [{"label": "a", "roofline": {"fraction_of_roofline": "<b>"}}]}, "arm 1"),
        ({**TUNE, "points": [{"values": 3}]}, "point 1: 'values' must be a JSON object"),
        ({**TUNE, "best": {"values": {}, "meets": "yes"}}, "'meets' must be true or false"),
        ({**LIVE, "trials": [{**TRIAL, "result": 3}]}, "trial 1: 'result' must be a string"),
        ({**LIVE, "trials": None}, "'trials' missing"),
    ],
)
def test_bad_run_files(tmp_path: Path, data: dict, message: str) -> None:
    p = _write(tmp_path / "r.json", data)
    with pytest.raises(ConfigError, match=message) as e:
        load_run(p)
    one_line_error(e.value)


def test_unreadable_and_huge_run_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    p = tmp_path / "r.json"
    p.write_text("[" * 100_000)
    with pytest.raises(ConfigError, match="nested too deeply"):
        load_run(p)
    monkeypatch.setattr("quantdeck.core.bench.runs.MAX_RUN_BYTES", 2**20)
    _write(p, {**BENCH, "label": "x" * 2**20})
    with pytest.raises(ConfigError, match="over 1 MiB"):
        load_run(p)


def test_one_bad_run_does_not_break_the_history(capsys: pytest.CaptureFixture[str]) -> None:
    """Before: a run whose throughput was not a number made `quantdeck runs` crash."""
    _write(runs_dir() / "20260101-000000-good.json", BENCH)
    _write(runs_dir() / "20260101-000001-partial.json", {"completed": 3})
    _write(runs_dir() / "20260101-000002-bad.json", {**BENCH, "output_throughput": "fast"})
    assert main(["runs"]) == 0
    out = capsys.readouterr()
    assert "good" in out.out and "bad" not in out.out and "Traceback" not in out.err
    partial = next(line for line in out.out.splitlines() if "partial" in line)
    assert partial.split()[1:] == ["3", "req", "-", "tok/s", "TTFT", "p50", "-", "ms"]


def test_nan_the_writer_may_write_reads_as_no_figure(tmp_path: Path) -> None:
    run = load_run(_write(tmp_path / "r.json", {**BENCH, "p99_ttft_ms": float("nan")}))
    assert run.p99_ttft_ms is None


ARM = {"label": "a", "result": BENCH, "roofline": {"fraction_of_roofline": 0.5}, "error": None}
POINT = {"values": {"max_num_seqs": 8}, "goodput": 1.0, "meets": True, "p99_ttft_ms": 3.0}
RUNS = st.one_of(
    mutated(BENCH, [*COMPARE_KEYS, "kind", "label", "requests"]),
    mutated(AB, ["kind", "arms", "label", *COMPARE_KEYS]),
    mutated(TUNE, ["kind", "points", "best"]),
    mutated(LIVE, ["kind", "trials", "ended", "launch"]),
    st.lists(mutated(ARM, [*ARM, "ready_s", "facts"]), max_size=2).map(
        lambda arms: {"kind": "ab", "arms": arms}
    ),
    st.lists(mutated(POINT, [*POINT, "error", "dropped"]), max_size=2).map(
        lambda points: {"kind": "tune", "points": points, "best": points[0] if points else None}
    ),
)


@fuzz_settings(80)
@given(
    text=RUNS.map(lambda d: json.dumps(d, allow_nan=True))
    | HOSTILE_TEXT
    | JSON_VALUES.map(json.dumps)
)
def test_fuzz_run_file(tmp_path: Path, text: str, capsys: pytest.CaptureFixture[str]) -> None:
    p = tmp_path / "data" / "runs" / "fuzz.json"
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)
    try:
        run = load_run(p)
    except ConfigError as e:
        one_line_error(e)
        return
    for row in compare(run, run):
        assert row.b_better is None
    assert run_result(run.to_json()).to_json() == run.to_json()  # what loads writes back
    compare(run, load_run(_write(tmp_path / "b.json", BENCH)))
    assert main(["runs"]) == 0
    assert "Traceback" not in capsys.readouterr().err
