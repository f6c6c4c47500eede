"""``fleet status [FILE]`` and ``fleet down [FILE]``: with FILE, only the fleet brought up from
that file is reported or stopped; another running fleet is refused in one line, exit 2, and
keeps running. The state file is the one ``fleet up`` writes (``Fleet.write_state``); a real
fleet's status: tests/cli/test_fleet_server.py."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import yaml
from ckpt import TINY_LLAMA, write_checkpoint

from quantdeck.cli.main import main
from quantdeck.core.fleet import Fleet, load_fleet
from quantdeck.core.fleet.supervisor import state_path


def _fleet_file(path: Path, model: Path, port: int) -> Path:
    doc = {
        "router": {"port": port},
        "instances": [{"name": "a", "port": port + 1, "profile": {"model": str(model)}}],
    }
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.fixture
def fleets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """Two fleet files in the working folder, a cache folder of the test's own."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("QUANTDECK_CACHE_DIR", str(tmp_path / "cache"))
    model = write_checkpoint(tmp_path / "model", TINY_LLAMA)
    return _fleet_file(tmp_path / "a.yaml", model, 18180), _fleet_file(
        tmp_path / "b.yaml", model, 18280
    )


@pytest.fixture
def up() -> Iterator[subprocess.Popen[bytes]]:
    """A process standing in for `fleet up` (what `fleet down` signals)."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield proc
    proc.kill()
    proc.wait()


def _bring_up(fleet_file: str, proc: subprocess.Popen[bytes]) -> None:
    """The state file `fleet up FILE` writes, as if ``proc`` were that `fleet up`."""
    Fleet(load_fleet(fleet_file)).write_state()
    state = json.loads(state_path().read_text())
    state.update(pid=proc.pid, create_time=psutil.Process(proc.pid).create_time())
    state_path().write_text(json.dumps(state))


def test_status_with_the_running_fleets_file(
    fleets: tuple[Path, Path], up: subprocess.Popen[bytes], capsys: pytest.CaptureFixture[str]
) -> None:
    a, _ = fleets
    _bring_up("a.yaml", up)  # a relative name, as typed: recorded whole
    assert json.loads(state_path().read_text())["file"] == str(a)
    for name in ("a.yaml", str(a), "./a.yaml", None):
        argv = ["fleet", "status", *([name] if name else []), "--json"]
        assert main(argv) == 0, name
        status = json.loads(capsys.readouterr().out)
        assert status["running"] is True and status["file"] == str(a)
        assert [r["name"] for r in status["rows"]] == ["router", "a"]
        # nothing of it answers here (a stand-in process): the panel's word, from the probes
        assert status["health"] == {"word": "down", "why": "the router down"}


@pytest.mark.parametrize("action", ["status", "down"])
def test_another_fleets_file_is_refused_in_one_line(
    action: str,
    fleets: tuple[Path, Path],
    up: subprocess.Popen[bytes],
    capsys: pytest.CaptureFixture[str],
) -> None:
    a, b = fleets
    _bring_up(str(a), up)
    for other in (str(b), "missing.yaml"):
        assert main(["fleet", action, other]) == 2
        out, err = capsys.readouterr()
        assert out == ""
        assert err.splitlines() == [
            f"quantdeck: error: {other}: not the running fleet's file (that is {a})"
        ]
    assert up.poll() is None and state_path().exists()  # the running fleet is left alone


def test_down_with_the_running_fleets_file_stops_it(
    fleets: tuple[Path, Path], up: subprocess.Popen[bytes], capsys: pytest.CaptureFixture[str]
) -> None:
    a, _ = fleets
    _bring_up(str(a), up)
    assert main(["fleet", "down", "a.yaml", "--timeout", "10"]) == 0
    assert up.poll() is not None  # gone (`fleet down` waited for it)
    assert "fleet stopped" in capsys.readouterr().err


def test_with_no_fleet_running_a_file_changes_nothing(
    fleets: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    a, _ = fleets
    assert main(["fleet", "status", str(a)]) == 3  # none running, as without FILE
    assert main(["fleet", "down", str(a)]) == 0
    assert capsys.readouterr().err.splitlines() == ["no fleet running", "no fleet running"]
