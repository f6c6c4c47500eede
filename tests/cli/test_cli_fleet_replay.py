"""``quantdeck fleet replay``: a fleet recording's news with their times and its rows as they
ended, as the Fleet tab replays it; ``fleet up --record`` refuses a file that exists before
anything starts. The real fleet's recording: tests/cli/test_fleet_server.py."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import yaml
from ckpt import TINY_LLAMA, write_checkpoint
from fleet_recording import T0, write_fleet_recording

from quantdeck.cli.main import main
from quantdeck.core.fleet import load_fleet


@pytest.fixture
def fleet_file(tmp_path: Path) -> Path:
    model = write_checkpoint(tmp_path / "model", TINY_LLAMA)
    profile = {"model": str(model), "max-num-seqs": 2}
    doc = {
        "router": {"port": 18080},
        "instances": [
            {"name": "a", "port": 18001, "profile": profile, "restart": "on-failure"},
            {"name": "b", "port": 18002, "role": "backup", "profile": profile},
        ],
    }
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_replay_prints_the_news_then_the_rows(
    fleet_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rec = write_fleet_recording(tmp_path / "f.jsonl", load_fleet(fleet_file))
    assert main(["fleet", "replay", str(rec)]) == 0
    out = capsys.readouterr().out.splitlines()
    crash = time.strftime("%H:%M:%S", time.localtime(T0 + 40))
    assert f"{crash}  a: crashed exit code -9" in out
    assert f"{crash}  a: restart 1 in 1 s" in out
    table = out[out.index(f"{rec}: 40 s, as it ended:") + 1 :]
    assert [line.split()[:3] for line in table] == [
        ["router", "router", "ready"],
        ["a", "primary", "crashed:"],
        ["b", "backup", "ready"],
    ]
    assert "crashed: exit code -9" in table[1]  # with its reason
    assert "kv_pct=5 running=1 tok_s=20 ttft_p99_ms=80 routed" in table[2]

    assert main(["fleet", "replay", str(rec), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["duration_s"] == 40.0
    assert [r["state"] for r in data["rows"]] == [
        "ready",
        "crashed: exit code -9 (restart 1 in 1 s)",
        "ready",
    ]
    assert data["rows"][2]["kv_pct"] == 5.0 and data["rows"][1]["kv_pct"] is None
    assert [n["t"] for n in data["news"]] == sorted(n["t"] for n in data["news"])


def test_replay_refuses_what_is_not_a_fleet_recording(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plain = tmp_path / "plain.jsonl"
    plain.write_text(
        '{"event": "recording", "version": 1}\n{"event": "fact", "name": "x", "value": 1}\n'
    )
    assert main(["fleet", "replay", str(plain)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not a fleet recording" in err[0]
    assert main(["fleet", "replay", str(tmp_path / "none.jsonl")]) == 2


def test_up_refuses_a_recording_that_exists_before_starting_anything(
    fleet_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mine = tmp_path / "mine.jsonl"
    mine.write_text("the user's own file\n")
    assert main(["fleet", "up", str(fleet_file), "--record", str(mine)]) == 2
    assert "exists; choose another file name" in capsys.readouterr().err
    assert mine.read_text() == "the user's own file\n"


def test_the_h200_fleet_recording_replays(capsys: pytest.CaptureFixture[str]) -> None:
    """The H200's fleet (docs/gpu-validation/fleet-1b-eager.jsonl.gz, log lines left out):
    two FP8 primaries and a bf16 backup on GPU 0, the fallback switching the backup in and
    out twice during the burst, as docs/fleet.md tells it."""
    from conftest import ROOT

    rec = ROOT / "docs" / "gpu-validation" / "fleet-1b-eager.jsonl.gz"
    assert main(["fleet", "replay", str(rec)]) == 0
    out = capsys.readouterr().out
    news = [line.split("  ", 1)[1] for line in out.splitlines() if line[:2].isdigit()]
    switches = [n for n in news if n.startswith("router: add") or n.startswith("router: remove")]
    assert [s.split()[1] for s in switches] == ["add", "remove", "add", "remove"]
    assert any("fallback on: the primaries' ttft_p99_ms 247.7 ms > 100 ms" in n for n in news)
    rows = out.split("as it ended:", 1)[1].split()
    assert rows[:2] == ["router", "router"] and "primary" in rows and "backup" in rows
