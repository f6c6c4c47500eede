"""The HTML report: every value from a run file escaped (issue 21, "HTML report XSS"), and the
report and screenshot folders written whole, never over a folder Quantdeck did not make."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from quantdeck.core.bench.results import RunResult, run_result
from quantdeck.core.errors import ConfigError
from quantdeck.gui.report import write_report

EVIL = "<script>alert(1)</script>"


def hostile_runs() -> list[RunResult]:
    """A bench run, an A/B run and a tune run whose values are markup, not numbers."""
    bench = {
        "kind": "bench",
        "label": EVIL,
        "completed": 2,
        "failed": EVIL,
        "output_throughput": EVIL,
        "request_goodput": EVIL,
        "p99_ttft_ms": EVIL,
        "p99_tpot_ms": "<img src=x onerror=alert(2)>",
        "requests": [
            {"success": True, "ttft": 0.1, "latency": 0.4},
            {"success": True, "ttft": EVIL, "latency": 0.2},
        ],
        "env": {"host": EVIL},
    }
    arm = {
        "label": "arm",
        "result": {"completed": 1, "output_throughput": 10.0, "requests": []},
        "roofline": {
            "fraction_of_roofline": EVIL,
            "roofline_tok_s": 100.0,
            "decode_tok_s_per_seq": EVIL,
        },
        "facts": {"quantization_kernel": EVIL},
    }
    good = {**arm, "label": "fine", "roofline": {"fraction_of_roofline": 0.5}}
    tune = {
        "kind": "tune",
        "strategy": EVIL,
        "slo_ms": {"ttft": EVIL, "tpot": 50},
        "points": [
            {
                "values": {"max-num-seqs": EVIL},
                "goodput": EVIL,
                "meets": EVIL,
                "p99_ttft_ms": EVIL,
                "p99_tpot_ms": EVIL,
                "dropped": EVIL,
            }
        ],
    }
    return [run_result(r) for r in (bench, {"kind": "ab", "arms": [arm, good]}, tune)]


def test_report_escapes_every_value(tmp_path: Path) -> None:
    index = write_report(hostile_runs(), tmp_path / "rep")
    page = index.read_text()
    assert "<script" not in page.lower() and "<img src=x" not in page
    assert "&lt;img src=x onerror=alert(2)&gt;" in page
    tags = set(re.findall(r"<(\w+)", page))
    assert tags <= {"meta", "title", "style", "h1", "h2", "table", "tr", "th", "td", "img", "pre"}
    # each hostile value is shown, as text: the bench row (label and 4 columns: 5), the A/B
    # arms' roofline and kernels (3), the tuning heading (2), the point (values, goodput,
    # meets, TTFT p99, TPOT p99, note: 6), the environment (1)
    assert page.count("&lt;script&gt;") == 17
    assert "<td>50%</td>" in page  # a number is still a number
    assert sorted(p.name for p in (tmp_path / "rep").iterdir() if p.suffix == ".png") == [
        "e2el_cdf.png",
        "roofline.png",
        "throughput.png",
        "ttft_cdf.png",
        "tune_0.png",
    ]


def test_report_refuses_a_folder_it_did_not_make(tmp_path: Path) -> None:
    folder = tmp_path / "Documents"
    folder.mkdir()
    (folder / "index.html").write_text("my own page")
    with pytest.raises(ConfigError, match="not made by Quantdeck"):
        write_report(hostile_runs(), folder)
    assert [p.name for p in folder.iterdir()] == ["index.html"]
    assert (folder / "index.html").read_text() == "my own page"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["Documents"]


def test_report_replaces_an_earlier_report(tmp_path: Path) -> None:
    out = tmp_path / "rep"
    write_report(hostile_runs(), out)
    index = write_report(hostile_runs()[2:], out)  # the tune run only
    assert index == out / "index.html" and "Tuning" in index.read_text()
    assert not (out / "throughput.png").exists()  # nothing left from the earlier report
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rep"]


def test_screenshots_refuse_a_folder_before_starting_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from quantdeck.cli.main import main

    folder = tmp_path / "Pictures"
    folder.mkdir()
    (folder / "holiday.png").write_bytes(b"\x89PNG mine")
    assert main(["screenshots", str(folder)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not made by Quantdeck" in err
    assert [p.name for p in folder.iterdir()] == ["holiday.png"]
    assert (folder / "holiday.png").read_bytes() == b"\x89PNG mine"
