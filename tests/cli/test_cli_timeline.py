"""``quantdeck timeline``: the Monitor's span comparison from recordings (two H200 launches of
one model, bf16 with CUDA graphs then bitsandbytes eager), and ``report --recording``; a
fleet's recording, compared per instance."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from ckpt import TINY_LLAMA, write_checkpoint
from conftest import ROOT
from fleet_recording import SECONDS, write_fleet_recording

from quantdeck.cli.main import main
from quantdeck.core.fleet import load_fleet

GPU = ROOT / "docs" / "gpu-validation"
RECS = [str(GPU / "record-bf16-graphs.jsonl.gz"), str(GPU / "record-bnb4-eager.jsonl.gz")]


def test_timeline_prints_markers_and_the_spans_either_side_of_the_knob_change(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["timeline", *reversed(RECS)]) == 0  # read in the order they were made
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0] == "markers:" and lines[1].endswith("s  launch")
    assert "knobs: enforce-eager default → on, +1 more" in lines[2]
    assert "quantization: default → bitsandbytes" in out
    row = next(ln for ln in lines if ln.startswith("generated tok/s"))
    assert row.split()[-1] == "worse"  # bnb4 eager serves less than bf16 with graphs
    assert lines[-1] == (
        "separated by: knobs: enforce-eager default → on, quantization default → bitsandbytes"
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


def test_a_fleet_recording_is_compared_per_instance(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: `timeline` read a fleet's recording (`fleet up --record`) as having no metrics
    samples. Each instance is a history of its own, the fleet's switches among its markers."""
    model = write_checkpoint(tmp_path / "model", TINY_LLAMA)
    doc = {
        "router": {"port": 18080},
        "instances": [
            {"name": "a", "port": 18001, "profile": {"model": str(model)}},
            {"name": "b", "port": 18002, "role": "backup", "profile": {"model": str(model)}},
        ],
    }
    (tmp_path / "fleet.yaml").write_text(yaml.safe_dump(doc))
    rec = str(write_fleet_recording(tmp_path / "f.jsonl", load_fleet(tmp_path / "fleet.yaml")))
    assert main(["timeline", rec]) == 0
    out = capsys.readouterr().out
    assert out.startswith("instance a:\nmarkers:\n") and "\n\ninstance b:\nmarkers:\n" in out
    assert out.count("fallback on: b take traffic") == 2  # the router's switch, on each
    assert main(["timeline", rec, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["instances"]
    assert [r["instance"] for r in rows] == ["a", "b"]
    assert [r["before"]["samples"] + r["after"]["samples"] for r in rows] == [SECONDS] * 2
    gen = {
        r["instance"]: next(x for x in r["rows"] if x["series"] == "generation_tokens_per_s")
        for r in rows
    }
    assert gen["a"]["before"] == 50.0 and gen["b"]["before"] == 20.0  # each its own figures
    assert main(["timeline", rec, "--instance", "b", "--json"]) == 0
    one = json.loads(capsys.readouterr().out)
    assert one["rows"] == rows[1]["rows"] and [m["what"] for m in one["timeline"]] == ["fleet"]
    for argv, words in (
        (["--instance", "c"], "no instance 'c' (its instances: a, b, router)"),
        (["--report", str(tmp_path / "rep")], "a fleet recording of instances a, b: compare"),
    ):
        assert main(["timeline", rec, *argv]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and words in err, err
    assert not (tmp_path / "rep").exists()
    assert main(["timeline", rec, "--instance", "a", "--report", str(tmp_path / "rep")]) == 0
    assert (tmp_path / "rep" / "index.html").is_file()
