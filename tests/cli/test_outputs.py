"""Commands that write a folder never destroy what is already there (issue 21, "demo-model DIR
deletes whatever is at DIR")."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, snapshot

from quantdeck.cli.main import main


@pytest.mark.parametrize("what", ["folder", "file", "symlink"])
def test_demo_model_refuses_what_is_at_dir(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], what: str
) -> None:
    target = tmp_path / "victim"
    if what == "folder":
        target.mkdir()
        (target / "thesis.tex").write_text("years of work")
        (target / "sub").mkdir()
        (target / "sub" / "data.bin").write_bytes(os.urandom(4096))
    elif what == "file":
        target.write_bytes(b"root:x:0:0:root:/root:/bin/bash\n")
        target.chmod(0o644)
    else:
        (tmp_path / "real").mkdir()
        (tmp_path / "real" / "keep").write_text("keep")
        target.symlink_to(tmp_path / "real")
    before = snapshot(tmp_path)
    for force in ([], ["--force"]):
        assert main(["demo-model", str(target), *force]) == 2
        err = capsys.readouterr().err
        assert err.startswith("quantdeck: error: ") and err.count("\n") == 1, err
        assert str(target) in err
    assert snapshot(tmp_path) == before


def test_demo_model_refusal_is_one_line_exit_2(tmp_path: Path) -> None:
    """The same through the installed command, as a user runs it."""
    target = tmp_path / "etc-passwd"
    target.write_text("root:x:0:0\n")
    r = subprocess.run(
        [sys.executable, "-m", "quantdeck.cli", "demo-model", str(target)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.count("\n") == 1 and "not a folder" in r.stderr
    assert target.read_text() == "root:x:0:0\n" and sorted(os.listdir(tmp_path)) == ["etc-passwd"]


@pytest.mark.parametrize(
    "command",
    [["bench", "http://127.0.0.1:9"], ["tune", "/m", "--ttft-ms", "100", "--tpot-ms", "10"]],
)
def test_json_result_never_replaces_a_file_of_the_users(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    """``--json FILE`` over a file Quantdeck did not write: refused before the run starts
    (the dead URL and the missing model are never reached), the file untouched."""
    target = tmp_path / "notes.json"
    target.write_text('{"mine": true}\n')
    before = snapshot(tmp_path)
    assert main([*command, "--json", str(target)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is not a Quantdeck result: not replaced" in err, err
    assert snapshot(tmp_path) == before


def test_json_result_replaces_an_earlier_result(tmp_path: Path) -> None:
    from quantdeck.core.bench import load_run, write_result
    from quantdeck.core.bench.results import BenchResult

    target = tmp_path / "result.json"
    write_result(target, BenchResult(completed=1, failed=0))
    write_result(target, BenchResult(completed=2, failed=0))
    run = load_run(target)
    assert isinstance(run, BenchResult) and run.completed == 2
    assert oct(target.stat().st_mode & 0o777) == "0o600"
