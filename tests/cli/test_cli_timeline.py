"""``quantdeck timeline``: the Monitor's span comparison from recordings (two H200 launches of
one model, bf16 with CUDA graphs then bitsandbytes eager), and ``report --recording``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import ROOT

from quantdeck.cli.main import main

GPU = ROOT / "docs" / "gpu-validation"
RECS = [str(GPU / "record-bf16-graphs.jsonl.gz"), str(GPU / "record-bnb4-eager.jsonl.gz")]


def test_timeline_prints_markers_and_the_spans_either_side_of_the_knob_change(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["timeline", *reversed(RECS)]) == 0  # read in the order they were made
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0] == "markers:" and lines[1].endswith("s  launch")
    assert "knobs: enforce-eager default → True, +1 more" in lines[2]
    assert "quantization: default → bitsandbytes" in out
    row = next(ln for ln in lines if ln.startswith("generated tok/s"))
    assert row.split()[-1] == "worse"  # bnb4 eager serves less than bf16 with graphs
    assert lines[-1] == (
        "separated by: knobs: enforce-eager default → True, quantization default → bitsandbytes"
    )  # and no load note: the spans were chosen at the same load
    assert main(["timeline", *RECS, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [m["what"] for m in data["timeline"]] == ["launch", "knobs"]
    assert data["diff"] == {"enforce-eager": [None, True], "quantization": [None, "bitsandbytes"]}
    gen = next(r for r in data["rows"] if r["metric"] == "generated tok/s")
    assert gen["after"] < gen["before"] and data["before"]["samples"] > 10
    before, after = data["before"], data["after"]
    assert before["t1"] - before["t0"] == pytest.approx(after["t1"] - after["t0"])
    assert data["load_note"] == ""


def test_spans_given_and_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["timeline", *RECS, "--before", "0..10", "--after", "10..20", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["markers"] == [] and data["separated_by"] == "no marker between the spans"
    assert data["before"]["t1"] - data["before"]["t0"] == pytest.approx(10)
    assert main(["timeline", *RECS, "--before", "0..10"]) == 2
    assert capsys.readouterr().err.strip() == (
        "quantdeck: error: give both --before and --after, or neither"
    )
    assert main(["timeline", *RECS, "--before", "9..1", "--after", "1.."]) == 2
    err = capsys.readouterr().err.strip()
    assert "ends before it starts" in err and len(err.splitlines()) == 1


def test_report_carries_the_comparison(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "rep"
    assert main(["timeline", *RECS, "--report", str(out)]) == 0
    page = (out / "index.html").read_text()
    assert "<h2>Tuning timeline</h2>" in page
    assert "quantization default → bitsandbytes" in page
    assert "<td>generated tok/s</td>" in page and "worse" in page
    run = tmp_path / "run.json"
    run.write_text(json.dumps({"label": "x", "completed": 3, "output_throughput": 1.0}))
    assert main(["report", str(run), "--recording", RECS[0], "--out", str(tmp_path / "r2")]) == 0
    # one launch only: markers, but nothing to compare across
    page = (tmp_path / "r2" / "index.html").read_text()
    assert "Tuning timeline" in page and "no marker between the spans" in page
